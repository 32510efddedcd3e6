"""``hydragnn.models.nn``: primitives with swappable backends, and what the encoders build from them."""

from __future__ import annotations

import pytest
import torch

from hydragnn.models import build_model
from hydragnn.models.nn import (
    ContinuousFilterConv,
    CosineCutoff,
    GaussianRBF,
    Implementation,
    Primitive,
    RadialEdges,
    RadialFilter,
    implementations,
    register_implementation,
    use_backend,
)
from hydragnn.models.nn import backends as backends_module
from hydragnn.models.testing import small_arch
from hydragnn.models.testing.graphs import SCHEMA, collate, periodic_samples


@pytest.fixture
def recording_backend(monkeypatch):
    """A backend ``"recording"`` for RadialFilter that counts its calls and serves them with the
    stock forward (and declines filters whose activation is not the default)."""
    monkeypatch.setattr(backends_module, "_REGISTRY", dict(backends_module._REGISTRY))
    calls: list[int] = []

    def run(module, edges):
        calls.append(edges.length.shape[0])
        return module.forward(edges)

    def accepts(module):
        return None if type(module[1]).__name__ == "ShiftedSoftplus" else "activation"

    register_implementation(Implementation(RadialFilter, "recording", run, accepts, frozenset({torch.float32})))
    return calls


def test_use_backend_switches_primitives_and_restores(recording_backend):
    torch.manual_seed(0)
    model = build_model(small_arch("SchNet"), SCHEMA).eval()
    batch = collate(periodic_samples(4.0)[:2])
    ref = model(batch)
    report = use_backend(model, "recording")
    assert report.switched == ("encoder.interactions.0.filter", "encoder.interactions.1.filter")
    assert model.encoder.interactions[0].filter.backend == "recording"
    assert model.encoder.interactions[0].conv.backend == "torch"  # not implemented by this backend
    out = model(batch)
    assert len(recording_backend) == 2 and recording_backend[0] == batch.edge_index.shape[1]
    for key in ref:
        assert torch.equal(out[key], ref[key])
    assert use_backend(model, None).switched == ()
    assert all(m.backend == "torch" for m in model.modules() if isinstance(m, Primitive))
    model(batch)
    assert len(recording_backend) == 2  # the stock forward runs again


def test_use_backend_reports_declined_primitives(recording_backend):
    filt = torch.nn.Sequential(RadialFilter(4, 8, activation=torch.nn.SiLU()))
    report = use_backend(filt, "recording")
    assert report.switched == () and report.declined == (("0", "activation"),)
    assert "recording" not in {impl.backend for impl in implementations("triton").values()}


def test_register_implementation_needs_a_primitive():
    with pytest.raises(TypeError, match="Primitive subclass"):
        register_implementation(Implementation(torch.nn.Linear, "x", lambda m: m, lambda m: None, frozenset()))


@pytest.mark.parametrize(
    "encoder,keys",
    [
        (
            "SchNet",
            ["encoder.rbf.centers", "encoder.interactions.0.filter.0.weight", "encoder.interactions.0.lin1.weight"],
        ),
        ("PAINN", ["encoder.rbf.freqs", "encoder.layers.0.filter.weight", "encoder.layers.0.phi.0.weight"]),
    ],
)
def test_primitives_keep_the_state_dict_layout(encoder, keys):
    """Artifacts written before the encoders were composed from primitives load unchanged."""
    torch.manual_seed(0)
    state = build_model(small_arch(encoder), SCHEMA).state_dict()
    assert set(keys) <= set(state)
    assert not any(".conv." in key for key in state)  # parameter-free primitives add no keys


def test_radial_edges_share_basis_values_across_layers():
    r = torch.tensor([0.5, 1.5, 3.9, 4.2])
    src, dst = torch.tensor([0, 1, 2, 0]), torch.tensor([1, 2, 0, 2])
    basis, envelope = GaussianRBF(4.0, 6), CosineCutoff(4.0)
    edges = RadialEdges(src, dst, r, 3, torch.float32, basis, envelope)
    assert edges.basis_values is edges.basis_values  # computed once per forward
    assert edges.envelope_values.shape == (4, 1) and float(edges.envelope_values[3]) == 0.0  # beyond the cutoff
    conv = ContinuousFilterConv()
    x, w = torch.ones(3, 2), torch.ones(4, 2)
    out = conv(x, w, edges)
    expected = torch.zeros(3, 2).index_add(0, dst, envelope(r).unsqueeze(-1).expand(4, 2))
    torch.testing.assert_close(out, expected)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_gaussian_rbf_flushes_subnormals(dtype):
    """SchNet's 50 Gaussians on a 2 Å cutoff (upstream ci.json) reach the subnormal range a few
    widths from their centre: they come out as exact zeros, forward and backward, and equal the
    Gaussians elsewhere."""
    from hydragnn.models.testing import SubnormalDetector

    rbf = GaussianRBF(2.0, 50)
    r = torch.linspace(0.0, 2.0, 401, dtype=dtype).requires_grad_()
    with SubnormalDetector() as detector:
        out = rbf(r)
        out.sum().backward()
    assert not detector.found, dict(detector.found)
    plain = torch.exp(rbf.coeff * (r.detach().unsqueeze(-1) - rbf.centers.to(dtype)) ** 2)
    tiny = torch.finfo(dtype).tiny
    assert ((plain < tiny) & (plain > 0)).any()  # the plain formula computes subnormals here
    torch.testing.assert_close(out.detach(), plain, rtol=0, atol=tiny**0.8)


def _filter_rows(filt: RadialFilter) -> list[int]:
    """Rows reaching the filter network's first layer, per call."""
    rows: list[int] = []
    filt[0].register_forward_hook(lambda module, args, out: rows.append(args[0].shape[0]))
    return rows


def _edges(r: torch.Tensor, attr: torch.Tensor | None = None) -> RadialEdges:
    n = r.shape[0]
    src, dst = torch.arange(n) % 3, (torch.arange(n) + 1) % 3
    return RadialEdges(src, dst, r, 3, torch.float32, GaussianRBF(4.0, 6), CosineCutoff(4.0), attr=attr)


def test_radial_filter_runs_once_per_distinct_length():
    """Under the ``"distinct"`` backend, constant lengths that repeat (both directions of an edge,
    a lattice) go through the filter network once each; the filters and the parameter gradients
    are those of the per-edge network."""
    torch.manual_seed(0)
    filt = torch.nn.Sequential(RadialFilter(6, 5))
    assert use_backend(filt, "distinct").switched == ("0",)
    filt = filt[0]
    rows = _filter_rows(filt)
    r = torch.tensor([1.5, 0.75, 1.5, 2.25, 0.75, 1.5, 2.25, 1.5])
    edges = _edges(r)
    assert edges.shared_lengths() is not None and edges.shared_lengths()[0].tolist() == [0.75, 1.5, 2.25]
    assert edges.shared_basis_values()[0] is edges.shared_basis_values()[0]  # once per forward, for every layer
    w = filt(edges)
    assert rows == [3]
    ref = torch.nn.Sequential.forward(filt, edges.basis_values)
    assert rows == [3, 8]
    torch.testing.assert_close(w, ref)
    weights = torch.randn(8, 5)
    grads = torch.autograd.grad((w * weights).sum(), list(filt.parameters()))
    ref_grads = torch.autograd.grad((ref * weights).sum(), list(filt.parameters()))
    for g, g_ref in zip(grads, ref_grads):
        torch.testing.assert_close(g, g_ref)


@pytest.mark.parametrize("case", ["length with gradient", "edge inputs", "mostly distinct"])
def test_radial_filter_runs_per_edge_where_sharing_does_not_apply(case):
    """Forces differentiate through the lengths (equal lengths of different atom pairs have
    different derivatives); appended edge inputs make rows differ; a batch of mostly distinct
    lengths would not pay for the gather."""
    r = torch.tensor([1.5, 0.75, 1.5, 2.25, 0.75, 1.5, 2.25, 1.5])
    attr = None
    if case == "length with gradient":
        r = r.requires_grad_()
    elif case == "edge inputs":
        attr = torch.randn(8, 2)
    else:
        r = torch.linspace(0.5, 3.5, 8)
    filt = RadialFilter(6 if attr is None else 8, 5)
    use_backend(torch.nn.Sequential(filt), "distinct")
    assert filt.backend == "distinct"
    rows = _filter_rows(filt)
    edges = _edges(r, attr)
    w = filt(edges)
    assert rows == [8] and w.shape == (8, 5)
    torch.testing.assert_close(w, torch.nn.Sequential.forward(filt, edges.basis_values))


def test_schnet_shares_filters_without_changing_predictions(monkeypatch):
    """A whole SchNet on periodic cells: energies without forces are the same with and without
    the per-distinct-length filters (up to their last bits), and so are the parameter gradients;
    with forces every edge goes through the filter network."""
    from hydragnn.models.nn import edges as edges_module

    torch.manual_seed(0)
    model = build_model(small_arch("SchNet"), SCHEMA)
    use_backend(model, "distinct")
    batch = collate(periodic_samples(4.0)[:3])
    num_edges = batch.edge_index.shape[1]
    rows = _filter_rows(model.encoder.interactions[0].filter)
    results = []
    state = {k: v.clone() for k, v in model.state_dict().items()}
    for fraction in (edges_module.SHARED_MAX_FRACTION, -1.0):
        monkeypatch.setattr(edges_module, "SHARED_MAX_FRACTION", fraction)
        model.load_state_dict(state)  # the same running statistics for both passes
        model.zero_grad()
        out = model(batch, compute_forces=False, compute_stress=False)
        sum(v.square().sum() for v in out.values()).backward()
        results.append((out, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}))
    assert rows[0] <= num_edges // 2 and rows[1] == num_edges  # both directions of each edge: one row
    (out, grads), (ref, ref_grads) = results
    for key in ref:
        torch.testing.assert_close(out[key], ref[key])
    assert grads.keys() == ref_grads.keys()
    for name in ref_grads:
        torch.testing.assert_close(grads[name], ref_grads[name], rtol=1e-4, atol=1e-6)
    monkeypatch.undo()
    assert "forces" in model(batch)
    assert rows[2] == num_edges


@pytest.mark.parametrize("encoder", ["SchNet", "DimeNet"])
def test_shared_radial_functions_under_activation_checkpointing(encoder):
    """Checkpointed layers recompute from the same per-distinct-length values: predictions and
    parameter gradients equal those without checkpointing (energies without forces)."""
    torch.manual_seed(0)
    plain = build_model(small_arch(encoder), SCHEMA)
    ckpt = build_model(small_arch(encoder, conv_checkpointing=True), SCHEMA)
    ckpt.load_state_dict(plain.state_dict())
    use_backend(plain, "distinct")
    use_backend(ckpt, "distinct")
    batch = collate(periodic_samples(4.0)[:2])
    results = []
    for model in (plain, ckpt):
        out = model(batch, compute_forces=False, compute_stress=False)
        sum(v.square().sum() for v in out.values()).backward()
        results.append((out, {n: p.grad for n, p in model.named_parameters() if p.grad is not None}))
    (out, grads), (ref, ref_grads) = results[1], results[0]
    for key in ref:
        torch.testing.assert_close(out[key], ref[key])
    assert grads.keys() == ref_grads.keys()
    for name in ref_grads:
        torch.testing.assert_close(grads[name], ref_grads[name])


def test_safe_norm_without_a_gradient_gives_the_guarded_values():
    """The no-gradient shortcut returns bit for bit what the guarded path returns (zero rows
    included), and the guarded path keeps zero, not NaN, gradients at zero length."""
    from hydragnn.models.nn.geometry import safe_norm

    vec = torch.randn(50, 3, dtype=torch.float64)
    vec[::7] = 0.0
    plain = safe_norm(vec)
    guarded = safe_norm(vec.clone().requires_grad_(True))
    assert plain.grad_fn is None and guarded.grad_fn is not None
    assert torch.equal(plain, guarded.detach())
    with torch.no_grad():
        assert torch.equal(safe_norm(vec.clone().requires_grad_(True)), plain)
    leaf = vec.clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(safe_norm(leaf).sum(), leaf)
    assert torch.isfinite(grad).all() and torch.equal(grad[::7], torch.zeros_like(grad[::7]))


def test_execution_choices_name_every_implementation_and_nothing_runs_by_default():
    """The CPU per-distinct-length executions are registered implementations, not branches inside
    the equations, and none runs unless switched in: a fresh primitive runs its stock forward
    (every edge), the switched-in one the distinct lengths."""
    from hydragnn.models.nn import execution_choices

    choices = execution_choices()
    assert ("RadialFilter", "distinct") in choices and ("TripletRows", "distinct") in choices
    torch.manual_seed(0)
    filt = RadialFilter(6, 5)
    assert filt.backend == "torch"
    rows = _filter_rows(filt)
    edges = _edges(torch.tensor([1.5, 0.75, 1.5, 2.25, 0.75, 1.5, 2.25, 1.5]))
    stock = filt(edges)
    assert rows == [8]
    use_backend(torch.nn.Sequential(filt), "distinct")
    torch.testing.assert_close(filt(edges), stock)
    assert rows == [8, 3]

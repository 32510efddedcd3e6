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

"""MACE's e3nn blocks executed as dense ops (``channel_tp``, ``dense_linear``, ``dense_bilinear``,
``RadialMLP``) compute the e3nn module's function, values and derivatives (first and second
order), and leave the state dict alone."""

from __future__ import annotations

import pytest
import torch
from e3nn import o3
from e3nn.nn import FullyConnectedNet

from hydragnn.models.encoders.base import EncoderDims
from hydragnn.models.encoders.mace import MACEConfig, MACEEncoder
from hydragnn.models.nn import mace as mace_nn
from hydragnn.models.nn.channel_tp import (
    DENSE_LINEAR_MAX,
    DENSE_TP_MAX_WORK,
    ChannelTP,
    DenseLinear,
    channel_tp,
)
from hydragnn.models.nn.mace import (
    E3nnLinear,
    E3nnProduct,
    E3nnResidual,
    RadialMLP,
    _uuu_instructions,
    natural_irreps,
    tp_out_irreps_with_instructions,
)


def _convolution(irreps_in: o3.Irreps, lmax: int) -> o3.TensorProduct:
    sh = o3.Irreps.spherical_harmonics(lmax)
    mid, instructions = tp_out_irreps_with_instructions(irreps_in, sh, natural_irreps(irreps_in[0].mul, lmax), "uvu")
    return o3.TensorProduct(irreps_in, sh, mid, instructions, shared_weights=False, internal_weights=False)


def _product(current: o3.Irreps, a: o3.Irreps, out: o3.Irreps) -> o3.TensorProduct:
    return o3.TensorProduct(
        current, a, out, _uuu_instructions(current, a, out), shared_weights=False, internal_weights=False
    )


PRODUCTS = {
    "conv 4x0e x Y<=1": lambda: _convolution(o3.Irreps("4x0e"), 1),
    "conv 3x0e+3x1o x Y<=2": lambda: _convolution(natural_irreps(3, 1), 2),
    "conv l<=2 x Y<=3": lambda: _convolution(natural_irreps(2, 2), 3),
    "basis 1 x A": lambda: _product(o3.Irreps("4x0e"), natural_irreps(4, 2), natural_irreps(4, 2)),
    "basis B x A -> out": lambda: _product(natural_irreps(3, 2), natural_irreps(3, 2), natural_irreps(3, 1)),
}


def _assert_same_function(reference, dense, inputs: list[torch.Tensor]) -> None:
    """Values, first derivatives and the derivatives of their squared norm (what training on
    forces differentiates) agree in float64."""
    results = []
    for f in (reference, dense):
        out = f(*inputs)
        first = torch.autograd.grad(out.pow(2).sum(), inputs, create_graph=True)
        second = torch.autograd.grad(sum(g.pow(2).sum() for g in first), inputs)
        results.append([out, *first, *second])
    for mine, theirs in zip(results[1], results[0], strict=True):
        torch.testing.assert_close(mine, theirs, rtol=1e-10, atol=1e-12)


def _randn(*dims: int) -> torch.Tensor:
    return torch.randn(*dims, dtype=torch.float64, requires_grad=True)


@pytest.mark.parametrize("make", PRODUCTS.values(), ids=PRODUCTS.keys())
def test_the_dense_execution_is_the_e3nn_product(make):
    torch.manual_seed(0)
    tp = make().to(torch.float64)
    dense = channel_tp(tp)
    assert isinstance(dense, ChannelTP)
    x1, x2, w = _randn(6, tp.irreps_in1.dim), _randn(6, tp.irreps_in2.dim), _randn(6, tp.weight_numel)
    _assert_same_function(tp, dense, [x1, x2, w])
    assert dense(x1[:0], x2[:0], w[:0]).shape == (0, tp.irreps_out.dim)


@pytest.mark.parametrize(("irreps_in", "irreps_out"), [(natural_irreps(4, 1), natural_irreps(4, 1)),
                                                       (natural_irreps(3, 2), natural_irreps(3, 1)),
                                                       ("3x0e+3x0e+3x1o+3x1o", natural_irreps(3, 1))])  # fmt: skip
def test_small_linears_and_residuals_run_dense_as_e3nn_computes_them(irreps_in, irreps_out):
    torch.manual_seed(0)
    linear = E3nnLinear(o3.Irreps(irreps_in), o3.Irreps(irreps_out)).to(torch.float64)
    assert isinstance(linear.dense, DenseLinear)
    x = _randn(5, linear.irreps_in.dim)
    _assert_same_function(lambda v: o3.Linear.forward(linear, v), linear, [x])
    residual = E3nnResidual(o3.Irreps(irreps_in), o3.Irreps("3x0e"), o3.Irreps(irreps_out)).to(torch.float64)
    assert isinstance(residual.dense, DenseLinear)
    y = _randn(5, 3)
    _assert_same_function(lambda a, b: o3.FullyConnectedTensorProduct.forward(residual, a, b), residual, [x, y])
    wide = E3nnLinear(natural_irreps(64, 1), natural_irreps(64, 1))
    assert wide.irreps_in.dim * wide.irreps_out.dim > DENSE_LINEAR_MAX and wide.dense is None  # e3nn's blocks


def test_the_radial_mlp_is_e3nns_with_its_constants_folded():
    torch.manual_seed(0)
    ours = RadialMLP([5, 4, 4, 7], torch.nn.functional.silu).to(torch.float64)
    theirs = FullyConnectedNet([5, 4, 4, 7], torch.nn.functional.silu).to(torch.float64)
    theirs.load_state_dict(ours.state_dict())
    _assert_same_function(theirs, ours, [_randn(9, 5)])


def test_products_that_are_not_channel_wise_run_e3nn():
    full = o3.FullyConnectedTensorProduct("4x0e+4x1o", "3x0e", "4x0e+4x1o")  # uvw, internal weights
    shared = o3.TensorProduct(
        "4x0e", "1x0e", "4x0e", [(0, 0, 0, "uvu", True)], shared_weights=True, internal_weights=True
    )
    assert channel_tp(full) is None and channel_tp(shared) is None


def test_products_run_dense_up_to_the_work_limit_and_e3nn_above(monkeypatch):
    """Under the ``"dense"`` backend, rows x channels above DENSE_TP_MAX_WORK run e3nn's execution
    (the dense one multiplies the coefficients' zeros too); both give the same function, and so
    does the stock forward, which runs until a profile switches the backend in."""
    from hydragnn.models.nn import use_backend

    torch.manual_seed(0)
    irreps_in, sh = natural_irreps(3, 1), o3.Irreps.spherical_harmonics(2)
    mid, instructions = tp_out_irreps_with_instructions(irreps_in, sh, natural_irreps(3, 2), "uvu")
    product = E3nnProduct(irreps_in, sh, mid, instructions, shared_weights=False,
                          internal_weights=False).to(torch.float64)  # fmt: skip
    dense_calls = []
    product.dense.register_forward_hook(lambda *_: dense_calls.append(1))
    x1, x2, w = _randn(5, irreps_in.dim), _randn(5, sh.dim), _randn(5, product.weight_numel)
    stock = product(x1, x2, w)
    assert dense_calls == []
    use_backend(torch.nn.Sequential(product), "dense")
    below = product(x1, x2, w)
    assert len(dense_calls) == 1
    torch.testing.assert_close(below, stock, rtol=1e-10, atol=1e-12)
    monkeypatch.setattr(mace_nn, "DENSE_TP_MAX_WORK", 5 * product.dense.mul - 1)
    above = product(x1, x2, w)
    assert len(dense_calls) == 1
    torch.testing.assert_close(above, below, rtol=1e-10, atol=1e-12)
    assert DENSE_TP_MAX_WORK >= 2048 * 32  # a training batch's products run dense


def test_mace_runs_its_products_dense_and_keeps_its_state_dict():
    dims = EncoderDims(
        node_in=1, edge_in=0, graph_in=0, hidden_dim=4, num_conv_layers=2, radius=3.0, max_neighbours=None,
        num_radial=4, num_species=3,
    )  # fmt: skip
    encoder = MACEEncoder(dims, MACEConfig(max_ell=2, correlation=3, radial_mlp_dim=4))
    assert all(isinstance(layer.conv_tp.dense, ChannelTP) for layer in encoder.interactions)
    assert all(isinstance(layer.linear.dense, DenseLinear) for layer in encoder.interactions)
    assert all(isinstance(skip.dense, DenseLinear) for skip in encoder.skips)
    assert all(len(p.tps) == 3 and all(isinstance(tp.dense, ChannelTP) for tp in p.tps) for p in encoder.products)
    keys = encoder.state_dict().keys()
    assert not any("dense" in k for k in keys)
    for module in encoder.modules():
        if hasattr(module, "dense"):
            module.dense = None  # as an encoder without the dense executions
    encoder.load_state_dict(MACEEncoder(dims, MACEConfig(max_ell=2, correlation=3, radial_mlp_dim=4)).state_dict())

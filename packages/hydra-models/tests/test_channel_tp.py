"""``channel_tp``: MACE's channel-wise e3nn tensor products executed as dense ops compute the
e3nn module's function, values and derivatives (first and second order), and leave the state
dict alone."""

from __future__ import annotations

import pytest
import torch
from e3nn import o3

from hydragnn.models.encoders.base import EncoderDims
from hydragnn.models.encoders.channel_tp import ChannelTP, channel_tp
from hydragnn.models.encoders.mace import MACEConfig, MACEEncoder
from hydragnn.models.encoders.mace_blocks import _uuu_instructions, natural_irreps, tp_out_irreps_with_instructions


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


@pytest.mark.parametrize("make", PRODUCTS.values(), ids=PRODUCTS.keys())
def test_the_dense_execution_is_the_e3nn_product(make):
    torch.manual_seed(0)
    with torch.autocast("cpu", enabled=False):
        tp = make().to(torch.float64)
        dense = channel_tp(tp)
        assert isinstance(dense, ChannelTP)
        dense = dense.to(torch.float64)
        x1 = torch.randn(6, tp.irreps_in1.dim, dtype=torch.float64, requires_grad=True)
        x2 = torch.randn(6, tp.irreps_in2.dim, dtype=torch.float64, requires_grad=True)
        w = torch.randn(6, tp.weight_numel, dtype=torch.float64, requires_grad=True)
        results = []
        for f in (tp, dense):
            out = f(x1, x2, w)
            first = torch.autograd.grad(out.pow(2).sum(), (x1, x2, w), create_graph=True)
            second = torch.autograd.grad(sum(g.pow(2).sum() for g in first), (x1, x2, w))  # forces' training
            results.append([out, *first, *second])
        for mine, theirs in zip(results[1], results[0], strict=True):
            torch.testing.assert_close(mine, theirs, rtol=1e-10, atol=1e-12)
        empty = dense(x1[:0], x2[:0], w[:0])
        assert empty.shape == (0, tp.irreps_out.dim)


def test_products_that_are_not_channel_wise_run_e3nn():
    full = o3.FullyConnectedTensorProduct("4x0e+4x1o", "3x0e", "4x0e+4x1o")  # uvw, internal weights
    shared = o3.TensorProduct(
        "4x0e", "1x0e", "4x0e", [(0, 0, 0, "uvu", True)], shared_weights=True, internal_weights=True
    )
    assert channel_tp(full) is None and channel_tp(shared) is None


def test_mace_runs_its_products_dense_and_keeps_its_state_dict():
    dims = EncoderDims(
        node_in=1, edge_in=0, graph_in=0, hidden_dim=4, num_conv_layers=2, radius=3.0, max_neighbours=None,
        num_radial=4, num_species=3,
    )  # fmt: skip
    encoder = MACEEncoder(dims, MACEConfig(max_ell=2, correlation=3, radial_mlp_dim=4))
    assert all(isinstance(layer.conv_dense, ChannelTP) for layer in encoder.interactions)
    assert all(len(p.dense_tps) == len(p.tps) == 3 for p in encoder.products)
    keys = encoder.state_dict().keys()
    assert not any("dense" in k for k in keys)
    for layer in encoder.interactions:
        layer.conv_dense = None  # as an encoder without the dense execution
    encoder.load_state_dict(MACEEncoder(dims, MACEConfig(max_ell=2, correlation=3, radial_mlp_dim=4)).state_dict())

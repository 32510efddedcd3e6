"""Building blocks of the MACE encoder on e3nn: irreps helpers, interaction, product basis.

Irreps use the natural parity ``(-1)^l`` throughout (``0e + 1o + 2e + 3o ...``); e3nn 0.6's
``1o`` components are in ``(x, y, z)`` order (``Irrep("1o").D_from_matrix(R) == R``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any, Protocol, cast

import hydragnn.data.pyg_import  # noqa: F401 (PyG as HydraGNN needs it)

import torch
from e3nn import o3
from e3nn.nn import FullyConnectedNet
from torch import nn
from torch_geometric.utils import scatter

from ._e3nn import FullyConnectedTensorProduct, Linear, TensorProduct, irreps, mul_ir
from .backends import ALL_FLOAT_DTYPES, Implementation, Primitive, register_implementation
from .channel_tp import DENSE_TP_MAX_WORK, channel_tp, dense_bilinear, dense_linear, outer


def natural_irreps(mul: int, lmax: int) -> o3.Irreps:
    """``mul x 0e + mul x 1o + ... + mul x lmax`` (parity ``(-1)^l``)."""
    return irreps([(mul, (ell, (-1) ** ell)) for ell in range(lmax + 1)])


class E3nnProduct(Primitive, TensorProduct):
    """``o3.TensorProduct`` (same state-dict keys; its forward is e3nn's, the reference). Under the
    ``"dense"`` backend (an execution profile's choice) it runs as a few dense ops where it is a channel-wise product with per-sample weights
    (:func:`.channel_tp.channel_tp`) and the call has at most :data:`.channel_tp.DENSE_TP_MAX_WORK`
    rows x channels (the ``"dense"`` implementation registered below); e3nn's forward otherwise,
    and when the row count is symbolic (a trace for export, which must hold for any size: a branch
    on it would fix the graph to the example's)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.dense = None  # (what channel_tp's reference copy runs)
        self.dense = channel_tp(self)


class E3nnLinear(Primitive, Linear):
    """``o3.Linear`` (the same weight and state-dict keys; e3nn's forward is the reference), under
    the ``"dense"`` backend one dense matrix where that is cheaper (:func:`.channel_tp.dense_linear`), e3nn's own
    forward whenever a weight or bias is passed in."""

    def __init__(self, irreps_in: o3.Irreps, irreps_out: o3.Irreps) -> None:
        super().__init__(irreps_in, irreps_out)
        self.dense = None  # (what dense_linear's reference copy runs)
        self.dense = dense_linear(self)


class E3nnResidual(Primitive, FullyConnectedTensorProduct):
    """``o3.FullyConnectedTensorProduct`` (same weight and state-dict keys; e3nn's forward is the
    reference), under the ``"dense"`` backend one dense matrix on the outer product of its inputs where that is cheaper
    (:func:`.channel_tp.dense_bilinear`), e3nn's own forward with a weight passed in."""

    def __init__(self, irreps_in1: o3.Irreps, irreps_in2: o3.Irreps, irreps_out: o3.Irreps) -> None:
        super().__init__(irreps_in1, irreps_in2, irreps_out)
        self.dense = None  # (what dense_bilinear's reference copy runs)
        self.dense = dense_bilinear(self)


def _dense_product(
    module: E3nnProduct, x: torch.Tensor, y: torch.Tensor, weight: torch.Tensor | None = None
) -> torch.Tensor:
    rows = math.prod(x.shape[:-1])  # (Size.numel() would fix a symbolic size)
    dense = module.dense
    if dense is None or weight is None or not isinstance(rows, int) or rows * dense.mul > DENSE_TP_MAX_WORK:
        return module.forward(x, y, weight)
    return dense(x, y, weight)


def _dense_linear(
    module: E3nnLinear, features: torch.Tensor, weight: torch.Tensor | None = None, bias: torch.Tensor | None = None
) -> torch.Tensor:
    if module.dense is None or weight is not None or bias is not None:
        return module.forward(features, weight, bias)
    return module.dense(features, module.weight)


def _dense_residual(
    module: E3nnResidual, x: torch.Tensor, y: torch.Tensor, weight: torch.Tensor | None = None
) -> torch.Tensor:
    if module.dense is None or weight is not None:
        return module.forward(x, y, weight)
    return module.dense(outer(x, y), module.weight)


for _primitive, _run in ((E3nnProduct, _dense_product), (E3nnLinear, _dense_linear), (E3nnResidual, _dense_residual)):
    register_implementation(Implementation(_primitive, "dense", _run, lambda module: None, ALL_FLOAT_DTYPES))


class _NormalizedAct(Protocol):
    """e3nn's ``normalize2mom`` activation (``f``, times ``cst`` unless ``_is_id``)."""

    f: Callable[[torch.Tensor], torch.Tensor]
    _is_id: bool
    cst: float


class _FCLayer(Protocol):
    """A layer of e3nn's ``FullyConnectedNet`` (``e3nn.nn._fc._Layer``): what :class:`RadialMLP` reads."""

    weight: torch.Tensor
    act: _NormalizedAct | None
    h_in: float
    var_in: float
    var_out: float


class RadialMLP(FullyConnectedNet):
    """e3nn's ``FullyConnectedNet`` (same weights, keys and function) with its constant factors
    folded into each layer's weight: per layer one scaled weight, one matmul, one activation,
    where e3nn's layers also divide the weight and multiply the activations twice."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        carry = 1.0  # the previous activation's normalisation, applied through this weight
        for layer in cast("Iterable[_FCLayer]", self.children()):  # FullyConnectedNet holds only its layers
            if layer.act is None:
                x = x @ (layer.weight * (carry / (layer.h_in * layer.var_in / layer.var_out) ** 0.5))
                carry = 1.0
            else:
                x = layer.act.f(x @ (layer.weight * (carry / (layer.h_in * layer.var_in) ** 0.5)))
                carry = (1.0 if layer.act._is_id else layer.act.cst) * layer.var_out**0.5
        return x if carry == 1.0 else x * carry


def tp_out_irreps_with_instructions(
    irreps1: o3.Irreps, irreps2: o3.Irreps, target: o3.Irreps, mode: str
) -> tuple[o3.Irreps, list[tuple[int, int, int, str, bool]]]:
    """Output irreps and instructions of a channel-wise tensor product, kept to ``target``'s irreps.

    ``mode`` is ``"uvu"`` (irreps2 of multiplicity 1, e.g. spherical harmonics) or ``"uuu"``
    (both inputs of the same multiplicity). Output paths are sorted by irrep (as MACE does).
    """
    target_irs = {ir for _, ir in target}
    out: list[tuple[int, o3.Irrep]] = []
    instructions = []
    for i, (mul, ir_in) in enumerate(irreps1):
        for j, (_, ir_2) in enumerate(irreps2):
            for ir_out in ir_in * ir_2:
                if ir_out in target_irs:
                    instructions.append((i, j, len(out), mode, True))
                    out.append((mul, ir_out))
    irreps_out, permutation, _ = irreps(out).sort()
    instructions = sorted(((i, j, permutation[k], m, t) for i, j, k, m, t in instructions), key=lambda ins: ins[2])
    return irreps_out, instructions


class Interaction(nn.Module):
    """Equivariant convolution: ``A_i = Linear(sum_j R(d_ij) (Linear(h_j) x Y(r_ij))) / avg_num_neighbors``.

    Args:
        irreps_in: node feature irreps ``h``.
        sh_irreps: spherical-harmonics irreps of the edges.
        target_irreps: irreps of the output ``A`` (the channels the product basis consumes).
        num_radial: size of the radial basis.
        radial_mlp_dim, radial_mlp_layers: radial MLP producing the tensor-product weights.
        avg_num_neighbors: the constant normalising the neighbour sum.
    """

    def __init__(
        self,
        irreps_in: o3.Irreps,
        sh_irreps: o3.Irreps,
        target_irreps: o3.Irreps,
        num_radial: int,
        radial_mlp_dim: int,
        radial_mlp_layers: int,
        avg_num_neighbors: float,
    ) -> None:
        super().__init__()
        self.linear_up = E3nnLinear(irreps_in, irreps_in)
        irreps_mid, instructions = tp_out_irreps_with_instructions(irreps_in, sh_irreps, target_irreps, "uvu")
        self.conv_tp = E3nnProduct(
            irreps_in, sh_irreps, irreps_mid, instructions, shared_weights=False, internal_weights=False
        )
        self.radial_mlp = RadialMLP(
            [num_radial] + [radial_mlp_dim] * radial_mlp_layers + [self.conv_tp.weight_numel], torch.nn.functional.silu
        )
        self.linear = E3nnLinear(irreps_mid, target_irreps)
        self.inv_avg = 1.0 / float(avg_num_neighbors)

    def forward(
        self, h: torch.Tensor, edge_sh: torch.Tensor, edge_radial: torch.Tensor, edge_index: torch.Tensor
    ) -> torch.Tensor:
        """``h [N, irreps_in]`` -> ``A [N, target_irreps]``."""
        src, dst = edge_index[0], edge_index[1]
        h = self.linear_up(h)
        weights = self.radial_mlp(edge_radial)  # [E, weight_numel]
        messages = self.conv_tp(h.index_select(0, src), edge_sh, weights)  # [E, irreps_mid]
        agg = scatter(messages, dst, dim=0, dim_size=h.shape[0], reduce="sum")
        return self.linear(agg) * self.inv_avg


def _uuu_instructions(
    irreps1: o3.Irreps, irreps2: o3.Irreps, irreps_out: o3.Irreps
) -> list[tuple[int, int, int, str, bool]]:
    """Every channel-wise path ``ir1 x ir2 -> ir3`` with ``ir3`` in ``irreps_out`` (paths into one slot are summed)."""
    return [
        (i, j, k, "uuu", True)
        for i, (_, ir1) in enumerate(irreps1)
        for j, (_, ir2) in enumerate(irreps2)
        for k, (_, ir3) in enumerate(irreps_out)
        if ir3 in ir1 * ir2
    ]


class ProductBasis(nn.Module):
    """Equivariant many-body product up to ``correlation``: a compact symmetric contraction.

    ``B_0 = 1`` (one scalar per channel), ``B_nu = TP_uuu(B_{nu-1}, A; w_nu(species))`` for
    ``nu = 1..correlation``, and ``out = sum_nu Linear_nu(B_nu)`` onto ``irreps_out``. ``B_nu``
    is a channel-wise product of ``nu`` copies of ``A`` (body order ``nu + 1``) with
    element-dependent path weights ``w_nu = W_nu[species]`` (one row per species, selected by the
    ``node_attrs`` one-hot). Products of the same ``A`` are symmetric by construction (only
    natural-parity paths exist, and those are swap-symmetric).

    Differences from MACE's U-matrix ``SymmetricContraction``: intermediate products keep irreps
    up to ``A``'s ``lmax`` only, and the weight of a full coupling path of order ``nu >= 3`` is
    the product of per-step path weights (factorised) instead of one free weight per path. For
    ``correlation <= 2`` both span the same features.
    """

    def __init__(self, irreps_a: o3.Irreps, irreps_out: o3.Irreps, correlation: int, num_attrs: int) -> None:
        super().__init__()
        mul = mul_ir(irreps_a, 0).mul
        current = irreps([(mul, (0, 1))])
        self.tps = nn.ModuleList()
        self.path_weights = nn.ModuleList()
        self.linears = nn.ModuleList()
        for nu in range(1, correlation + 1):
            target = irreps_a if nu < correlation else irreps_out
            tp = E3nnProduct(
                current,
                irreps_a,
                target,
                _uuu_instructions(current, irreps_a, target),
                shared_weights=False,
                internal_weights=False,
            )
            self.tps.append(tp)
            weights = nn.Linear(num_attrs, tp.weight_numel, bias=False)
            # one-hot rows: each species gets its own path weights, N(0, (1/nu!)^2) like a Taylor
            # series, so that a large A does not blow the higher orders up at initialisation
            nn.init.normal_(weights.weight, std=1.0 / math.factorial(nu))
            self.path_weights.append(weights)
            self.linears.append(E3nnLinear(target, irreps_out))
            current = target
        self.mul = mul

    def forward(self, a: torch.Tensor, node_attrs: torch.Tensor) -> torch.Tensor:
        """``A [N, irreps_a]``, ``node_attrs [N, num_attrs]`` -> ``[N, irreps_out]``."""
        b = a.new_ones(a.shape[0], self.mul)
        out = None
        for tp, weights, linear in zip(self.tps, self.path_weights, self.linears, strict=True):
            b = tp(b, a, weights(node_attrs))
            term = linear(b)
            out = term if out is None else out + term
        assert out is not None  # correlation >= 1 (MACEConfig checks it): at least one term
        return out

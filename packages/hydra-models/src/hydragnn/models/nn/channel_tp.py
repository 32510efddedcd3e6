"""Channel-wise e3nn tensor products and small e3nn linears executed as a few dense ops: e3nn's
equations, another execution.

e3nn's code-generated ``TensorProduct`` runs several small ops per path (about 25 for MACE's
4-path convolution), and on small graphs each op costs more in dispatch than in arithmetic. For
the channel-wise products MACE uses (``uvu`` with a second input of multiplicity 1, the edge
harmonics; ``uuu``, the product basis) every channel ``u`` couples the same way:
``out_u = sum_p w_{p,u} C_p (x1_u (x) x2_u)``. :func:`channel_tp` reads the coefficients ``C_p``,
with e3nn's path normalisation, off the e3nn module itself (it evaluates it once on unit inputs,
in float64) and :class:`ChannelTP` runs: one gather of ``x1`` into ``[n, U, d1]``, the outer
product with ``x2``, one matmul by the stacked ``C_p``, the weights, the sum of paths that
share an output (one small matmul, only where they do), one gather into e3nn's output layout.
It computes the e3nn module's function (checked on random inputs, in float64, before it is
used; the coefficients are kept in float64 and cast per dtype on use) and holds no parameters
and no persistent buffers: the state dict is the e3nn module's. Products it cannot take (other
modes, mixed multiplicities, shared or internal weights) return ``None`` and run e3nn's forward.

:func:`dense_linear` does the same for an ``o3.Linear`` whose matrix is small (``d_in * d_out``
at most :data:`DENSE_LINEAR_MAX`): its matrix is assembled from the linear's own weight on each
call (one gather, one scatter) and applied by one matmul. Larger linears stay e3nn's: there
its per-irrep blocks do several times fewer multiply-adds than a dense matrix.
:func:`dense_bilinear` does it for a small tensor product with its own weights, on the outer
product of its inputs.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import TypeVar

import torch
from e3nn import o3
from torch import nn

from ._e3nn import Linear, TensorProduct, mul_ir

__all__ = [
    "DENSE_LINEAR_MAX",
    "DENSE_TP_MAX_WORK",
    "ChannelTP",
    "DenseLinear",
    "channel_tp",
    "dense_bilinear",
    "dense_linear",
    "outer",
]

DENSE_LINEAR_MAX = 4096
"""Largest ``d_in * d_out`` of an ``o3.Linear`` run as one dense matrix (sizes where dispatch,
not arithmetic, bounds the per-irrep blocks)."""

DENSE_TP_MAX_WORK = 65536
"""Largest ``rows * channels`` of a call that :class:`ChannelTP` runs; larger calls run e3nn's
per-path execution. The dense coefficient matmul also multiplies the coefficients' zeros, so
arithmetic, not dispatch, bounds it on many rows: on one CPU thread (forward + backward) the
dense products were up to 1.5x faster than e3nn's at 500-2,000 rows of 32 channels, even at
4,000, and 1.2-2.7x slower at 10,000-86,000 (a 2,048-atom cell's edges)."""


class _Masters:
    """float64 constants kept outside a module's buffers (a float32 -> float64 round trip of the
    model would round them), cast once per ``(dtype, device)`` met. While ``torch.compile`` traces,
    the cast is part of the graph and nothing is stored (a tensor stored from inside a traced
    ``torch.func`` transform would escape it)."""

    def __init__(self, *tensors: torch.Tensor) -> None:
        self.tensors = tensors
        self.cast: dict[tuple[torch.dtype, torch.device], tuple[torch.Tensor, ...]] = {}

    def like(self, t: torch.Tensor) -> tuple[torch.Tensor, ...]:
        key = (t.dtype, t.device)
        found = self.cast.get(key)
        if found is None:
            found = tuple(m.to(dtype=t.dtype, device=t.device) for m in self.tensors)
            if not torch.compiler.is_compiling():
                self.cast[key] = found
        return found


def _layout(irreps: o3.Irreps, mul: int) -> list[int]:
    """Gather index from e3nn's layout (irrep-major: ``start + u * (2l + 1) + m``) to the
    channel-major ``[U, d]`` one (``u * d + offset + m``, ``offset`` the irrep's place in a channel)."""
    per_channel = sum(ir.dim for _, ir in irreps)
    gather = [0] * (mul * per_channel)
    start = offset = 0
    for _, ir in irreps:
        for u in range(mul):
            for m in range(ir.dim):
                gather[u * per_channel + offset + m] = start + u * ir.dim + m
        start += mul * ir.dim
        offset += ir.dim
    return gather


def _eligible(tp: TensorProduct) -> bool:
    ins = tp.instructions
    if not ins or tp.shared_weights or tp.internal_weights:
        return False
    mode = ins[0].connection_mode
    mul = mul_ir(tp.irreps_in1, 0).mul
    mul2 = 1 if mode == "uvu" else mul
    return (
        mode in ("uvu", "uuu")
        and all(i.connection_mode == mode and i.has_weight for i in ins)
        and all(m == mul for m, _ in tp.irreps_in1)
        and all(m == mul2 for m, _ in tp.irreps_in2)
        and all(m == mul for m, _ in tp.irreps_out)
    )


class ChannelTP(nn.Module):
    """The dense execution of one channel-wise e3nn ``TensorProduct`` (see the module docstring).

    ``forward(x1 [..., irreps_in1.dim], x2 [..., irreps_in2.dim], weight [..., weight_numel])
    -> [..., irreps_out.dim]``, as the e3nn module's.
    """

    gather1: torch.Tensor
    gather2: torch.Tensor
    path_of_col: torch.Tensor
    to_e3nn: torch.Tensor

    def __init__(self, tp: TensorProduct) -> None:
        super().__init__()
        ins = tp.instructions
        self.uuu = ins[0].connection_mode == "uuu"
        self.mul = mul = mul_ir(tp.irreps_in1, 0).mul
        gather1 = _layout(tp.irreps_in1, mul)
        gather2 = _layout(tp.irreps_in2, mul if self.uuu else 1)
        self.d1, self.d2 = tp.irreps_in1.dim // mul, tp.irreps_in2.dim // (mul if self.uuu else 1)
        self.paths = len(ins)
        self.out_dim = tp.irreps_out.dim
        self.d_out = self.out_dim // mul  # one channel's output: its slots side by side
        coeffs = _probe(tp, mul, gather1, gather2, self.d1, self.d2)  # [P, d1 * d2, out_dim]: channel 0
        e3nn_start, channel_offset = [], []
        start = offset = 0
        for _, ir in tp.irreps_out:
            e3nn_start.append(start)
            channel_offset.append(offset)
            start += mul * ir.dim
            offset += ir.dim
        # one column per (path, component): its coefficients, its path, its place in a channel
        columns, path_of_col, place = [], [], []
        for p, instruction in enumerate(ins):
            for m in range(mul_ir(tp.irreps_out, instruction.i_out).ir.dim):
                columns.append(coeffs[p, :, e3nn_start[instruction.i_out] + m])
                path_of_col.append(p)
                place.append(channel_offset[instruction.i_out] + m)
        if sorted(place) == list(range(self.d_out)):  # one path per slot: order the columns by place
            order = sorted(range(len(place)), key=place.__getitem__)
            columns, path_of_col = [columns[k] for k in order], [path_of_col[k] for k in order]
            sum_paths = None
        else:  # paths summed into a slot: [width, d_out] of 0 / 1
            sum_paths = torch.zeros(len(place), self.d_out, dtype=torch.float64)
            sum_paths[torch.arange(len(place)), torch.tensor(place)] = 1.0
        to_e3nn = [0] * self.out_dim
        for k, (_, ir) in enumerate(tp.irreps_out):
            for u in range(mul):
                for m in range(ir.dim):
                    to_e3nn[e3nn_start[k] + u * ir.dim + m] = u * self.d_out + channel_offset[k] + m
        self.register_buffer("gather1", torch.tensor(gather1), persistent=False)
        self.register_buffer("gather2", torch.tensor(gather2), persistent=False)
        self.register_buffer("path_of_col", torch.tensor(path_of_col), persistent=False)
        self.register_buffer("to_e3nn", torch.tensor(to_e3nn), persistent=False)
        masters = [torch.stack(columns, dim=1)] + ([sum_paths] if sum_paths is not None else [])
        self._masters = _Masters(*masters)  # [d1 * d2, width] (+ [width, d_out])

    def forward(self, x1: torch.Tensor, x2: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        lead = x1.shape[:-1]
        n, mul = x1[..., 0].numel(), self.mul
        a = x1.reshape(n, x1.shape[-1]).index_select(1, self.gather1).view(n, mul, self.d1)
        if self.uuu:
            b = x2.reshape(n, x2.shape[-1]).index_select(1, self.gather2).view(n, mul, self.d2)
        else:
            b = x2.reshape(n, 1, self.d2)
        outer = (a.unsqueeze(-1) * b.unsqueeze(-2)).reshape(n, mul, self.d1 * self.d2)
        w = weight.reshape(n, self.paths, mul).transpose(1, 2).index_select(2, self.path_of_col)
        coupling, *sum_paths = self._masters.like(outer)
        y = (outer @ coupling) * w  # [n, U, width]
        if sum_paths:
            y = y @ sum_paths[0]
        return y.reshape(n, mul * self.d_out).index_select(1, self.to_e3nn).reshape(*lead, self.out_dim)


def _probe(tp: TensorProduct, mul: int, gather1: list[int], gather2: list[int], d1: int, d2: int) -> torch.Tensor:
    """``[P, d1 * d2, out_dim]``: e3nn's output (all channels' layout) for channel 0 fed the unit
    inputs ``e_i``, ``e_j`` with only path ``p``'s channel-0 weight set."""
    ref = copy.deepcopy(tp).to(torch.float64)
    paths = len(tp.instructions)
    x1 = torch.zeros(paths, d1, d2, tp.irreps_in1.dim, dtype=torch.float64)
    x2 = torch.zeros(paths, d1, d2, tp.irreps_in2.dim, dtype=torch.float64)
    w = torch.zeros(paths, d1, d2, tp.weight_numel, dtype=torch.float64)
    for p in range(paths):
        for i in range(d1):
            for j in range(d2):
                x1[p, i, j, gather1[i]] = 1.0  # channel 0, element i
                x2[p, i, j, gather2[j]] = 1.0
                w[p, i, j, p * mul] = 1.0  # path p, channel 0 (e3nn: path-major, then channel)
    with torch.no_grad():
        return ref(x1, x2, w).reshape(paths, d1 * d2, -1)


_Dense = TypeVar("_Dense", bound=nn.Module)


def _checked(
    dense: _Dense, run: Callable[..., torch.Tensor], ref_run: Callable[..., torch.Tensor], *dims: int
) -> _Dense | None:
    """``dense`` when ``run`` and ``ref_run`` (its e3nn module, float64) agree on random inputs of
    widths ``dims``, else ``None``."""
    gen = torch.Generator().manual_seed(0)
    inputs = [torch.randn(5, d, generator=gen, dtype=torch.float64) for d in dims]
    with torch.no_grad():
        return dense if torch.allclose(run(*inputs), ref_run(*inputs), rtol=1e-9, atol=1e-12) else None


def channel_tp(tp: TensorProduct) -> ChannelTP | None:
    """The dense execution of ``tp``, or ``None`` when ``tp`` is not a channel-wise product with
    per-sample weights or the dense version does not reproduce it on random inputs."""
    if not _eligible(tp):
        return None
    dense = ChannelTP(tp)
    ref = copy.deepcopy(tp).to(torch.float64)
    return _checked(dense, dense, ref, tp.irreps_in1.dim, tp.irreps_in2.dim, tp.weight_numel)


class DenseLinear(nn.Module):
    """A map linear in its input and in its weight, as one matrix assembled from the weight:
    ``x @ D(weight)``. ``basis [K, d_in, d_out]`` is the matrix of each weight entry alone
    (float64); only its non-zero entries are kept.

    ``forward(x [..., d_in], weight [K]) -> [..., d_out]``; ``weight`` is the e3nn module's own
    parameter (this module holds none).
    """

    source: torch.Tensor
    target: torch.Tensor

    def __init__(self, basis: torch.Tensor) -> None:
        super().__init__()
        _, self.d_in, self.d_out = basis.shape
        k, r, c = basis.nonzero(as_tuple=True)
        self.register_buffer("source", k, persistent=False)
        self.register_buffer("target", r * self.d_out + c, persistent=False)
        self._masters = _Masters(basis[k, r, c])

    def forward(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        (coef,) = self._masters.like(weight)
        values = weight.index_select(0, self.source) * coef
        matrix = values.new_zeros(self.d_in * self.d_out).index_put((self.target,), values, accumulate=True)
        return (x.reshape(-1, self.d_in) @ matrix.view(self.d_in, self.d_out)).reshape(*x.shape[:-1], self.d_out)


def _own_weights(module: Linear | TensorProduct) -> bool:
    return module.internal_weights and module.shared_weights and module.weight_numel > 0


def dense_linear(linear: Linear) -> DenseLinear | None:
    """The dense execution of ``linear``, or ``None`` when it has biases or weights passed per
    call, its matrix exceeds :data:`DENSE_LINEAR_MAX` entries, or the dense version does not
    reproduce it on random inputs."""
    d_in, d_out = linear.irreps_in.dim, linear.irreps_out.dim
    if not _own_weights(linear) or linear.bias_numel > 0 or d_in * d_out > DENSE_LINEAR_MAX:
        return None
    ref = copy.deepcopy(linear).to(torch.float64)
    eye = torch.eye(d_in, dtype=torch.float64)
    with torch.no_grad():
        basis = torch.stack([ref(eye, weight=row) for row in torch.eye(linear.weight_numel, dtype=torch.float64)])
    dense = DenseLinear(basis)
    return _checked(dense, lambda x: dense(x, ref.weight), ref, d_in)


def outer(x1: torch.Tensor, x2: torch.Tensor) -> torch.Tensor:
    """``[..., d1]``, ``[..., d2]`` -> ``[..., d1 * d2]`` (index ``i * d2 + j``)."""
    return (x1.unsqueeze(-1) * x2.unsqueeze(-2)).flatten(-2)


def dense_bilinear(tp: TensorProduct) -> DenseLinear | None:
    """The dense execution of a tensor product with its own shared weights (MACE's element-dependent
    residual, ``FullyConnectedTensorProduct(h, one-hot species)``) on ``outer(x1, x2)``, under the
    same conditions as :func:`dense_linear` (``d1 * d2 * d_out`` entries)."""
    d1, d2, d_out = tp.irreps_in1.dim, tp.irreps_in2.dim, tp.irreps_out.dim
    if not _own_weights(tp) or d1 * d2 * d_out > DENSE_LINEAR_MAX:
        return None
    ref = copy.deepcopy(tp).to(torch.float64)
    x1 = torch.eye(d1, dtype=torch.float64).repeat_interleave(d2, 0)  # row i * d2 + j: e_i, e_j
    x2 = torch.eye(d2, dtype=torch.float64).repeat(d1, 1)
    with torch.no_grad():
        basis = torch.stack([ref(x1, x2, weight=row) for row in torch.eye(tp.weight_numel, dtype=torch.float64)])
    dense = DenseLinear(basis)
    return _checked(dense, lambda a, b: dense(outer(a, b), ref.weight), ref, d1, d2)

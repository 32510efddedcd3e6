"""Channel-wise e3nn tensor products executed as a few dense ops: e3nn's equations, another execution.

e3nn's code-generated ``TensorProduct`` runs several small ops per path (about 25 for MACE's
4-path convolution), and on small graphs each op costs more in dispatch than in arithmetic. For
the channel-wise products MACE uses (``uvu`` with a second input of multiplicity 1, the edge
harmonics; ``uuu``, the product basis) every channel ``u`` couples the same way:
``out_u = sum_p w_{p,u} C_p (x1_u (x) x2_u)``. :func:`channel_tp` reads the coefficients ``C_p``,
with e3nn's path normalisation, off the e3nn module itself (it evaluates it once on unit inputs,
in float64) and :class:`ChannelTP` runs: one gather of ``x1`` into ``[n, U, d1]``, the outer
product with ``x2``, one matmul by the stacked ``C_p``, the weights, one matmul into e3nn's
output layout. It computes the e3nn module's function (checked on random inputs, in float64,
before it is used; the coefficients are kept in float64 and cast per dtype on use) and holds no
parameters and no persistent buffers: the state dict is the e3nn module's, which stays in place. Products it cannot take (other modes, mixed
multiplicities, shared or internal weights) return ``None`` and run e3nn's forward.
"""

from __future__ import annotations

import copy

import torch
from e3nn import o3
from torch import nn

__all__ = ["ChannelTP", "channel_tp"]


def _layout(irreps: o3.Irreps, mul: int) -> tuple[list[int], list[int]]:
    """Per irrep, its offset inside one channel; and the gather index e3nn layout -> ``[U, d]``
    (position ``u * d + offset + m`` reads e3nn's ``start + u * (2l + 1) + m``)."""
    offsets, off = [], 0
    for _, ir in irreps:
        offsets.append(off)
        off += ir.dim
    gather = [0] * (mul * off)
    start = 0
    for k, (_, ir) in enumerate(irreps):
        for u in range(mul):
            for m in range(ir.dim):
                gather[u * off + offsets[k] + m] = start + u * ir.dim + m
        start += mul * ir.dim
    return offsets, gather


def _eligible(tp: o3.TensorProduct) -> bool:
    ins = tp.instructions
    if not ins or tp.shared_weights or tp.internal_weights:
        return False
    mode = ins[0].connection_mode
    mul = tp.irreps_in1[0].mul
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

    def __init__(self, tp: o3.TensorProduct) -> None:
        super().__init__()
        ins = tp.instructions
        self.uuu = ins[0].connection_mode == "uuu"
        self.mul = mul = tp.irreps_in1[0].mul
        _, gather1 = _layout(tp.irreps_in1, mul)
        _, gather2 = _layout(tp.irreps_in2, mul if self.uuu else 1)
        self.d1, self.d2 = tp.irreps_in1.dim // mul, tp.irreps_in2.dim // (mul if self.uuu else 1)
        self.paths = len(ins)
        self.out_dim = tp.irreps_out.dim
        coeffs = _probe(tp, mul, gather1, gather2, self.d1, self.d2)  # [P, d1 * d2, out_dim]: channel 0
        columns, path_of_col, targets = [], [], []
        out_starts = [0]
        for m, ir in tp.irreps_out:
            out_starts.append(out_starts[-1] + m * ir.dim)
        for p, instruction in enumerate(ins):
            dim = tp.irreps_out[instruction.i_out].ir.dim
            for m in range(dim):
                columns.append(coeffs[p, :, out_starts[instruction.i_out] + m])
                path_of_col.append(p)
                targets.append((out_starts[instruction.i_out], dim, m))
        width = len(columns)
        scatter = torch.zeros(mul * width, self.out_dim, dtype=torch.float64)
        for col, (start, dim, m) in enumerate(targets):
            for u in range(mul):
                scatter[u * width + col, start + u * dim + m] = 1.0
        self.width = width
        self.register_buffer("gather1", torch.tensor(gather1), persistent=False)
        self.register_buffer("gather2", torch.tensor(gather2), persistent=False)
        self.register_buffer("path_of_col", torch.tensor(path_of_col), persistent=False)
        # float64 masters, outside the module's buffers (a float32 -> float64 round trip of the
        # model would round them); cast once per (dtype, device) that forward meets
        self._masters = (torch.stack(columns, dim=1), scatter)  # [d1*d2, width], [U * width, out_dim]
        self._cast: dict[tuple[torch.dtype, torch.device], tuple[torch.Tensor, torch.Tensor]] = {}

    def _matrices(self, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        key = (like.dtype, like.device)
        found = self._cast.get(key)
        if found is None:
            found = self._cast[key] = tuple(m.to(dtype=like.dtype, device=like.device) for m in self._masters)
        return found

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
        coupling, scatter = self._matrices(outer)
        y = ((outer @ coupling) * w).reshape(n, mul * self.width) @ scatter
        return y.reshape(*lead, self.out_dim)


def _probe(tp: o3.TensorProduct, mul: int, gather1: list[int], gather2: list[int], d1: int, d2: int) -> torch.Tensor:
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


def channel_tp(tp: o3.TensorProduct) -> ChannelTP | None:
    """The dense execution of ``tp``, or ``None`` when ``tp`` is not a channel-wise product with
    per-sample weights or the dense version does not reproduce it on random inputs."""
    if not _eligible(tp):
        return None
    dense = ChannelTP(tp)
    ref = copy.deepcopy(tp).to(torch.float64)
    gen = torch.Generator().manual_seed(0)
    x1 = torch.randn(5, tp.irreps_in1.dim, generator=gen, dtype=torch.float64)
    x2 = torch.randn(5, tp.irreps_in2.dim, generator=gen, dtype=torch.float64)
    w = torch.randn(5, tp.weight_numel, generator=gen, dtype=torch.float64)
    with torch.no_grad():
        if not torch.allclose(dense(x1, x2, w), ref(x1, x2, w), rtol=1e-9, atol=1e-12):
            return None
    return dense

"""Fused ops with autograd: Triton forward and Triton backward (first order only).

Each op equals a few lines of PyTorch (:mod:`.reference` spells them out) but keeps the edge
intermediates (radial basis ``[E, R]``, filters ``[E, F]``, messages ``[E, F]``) in registers:

* :func:`schnet_filter`: ``ssp(gaussians(r) @ W1^T + b1)``, SchNet's filter network up to its
  second linear layer (which stays a cuBLAS matmul).
* :func:`cfconv`: ``scatter_sum(x[src] * w * cosine_cutoff(r), dst)``, SchNet's continuous-filter
  convolution (gather, filter, envelope, scatter-add).
* :func:`painn_message`: PaiNN's whole message block: Bessel basis, filter linear layer,
  cosine cutoff, gating of ``phi(s)[src]``, the vector message and both scatter-adds.

Backward passes give the gradients w.r.t. every tensor input that needs one: edge lengths and
unit vectors (forces), node features, and the weights (through a stored ``[E, F]`` filter
gradient and a torch matmul, only when the weights require grad). They are
``once_differentiable``: forces by ``autograd.grad`` work, double backward (training on
forces) does not. Sums over edges use atomic adds (any edge order; float results may differ
from ``index_add`` in the last bits and between runs).

All float inputs of one call must share a dtype (float32 or float64) and device; Triton is
imported on the first call.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.autograd.function import once_differentiable


def _k():
    from . import _triton

    return _triton


def _blocks(width: int, interpreted: bool) -> tuple[int, int]:
    """(BLOCK_E, BLOCK_W) for a row width: a power of two up to 64 columns, ~2-4k elements a tile."""
    bw = min(64, max(1, 1 << (max(width, 1) - 1).bit_length()))
    be = 128 if interpreted else max(16, min(64, 2048 // bw))
    return be, bw


class _Launch:
    """Context for one launch: the CUDA device guard (a no-op on CPU)."""

    def __init__(self, t: torch.Tensor) -> None:
        self.guard = torch.cuda.device(t.device) if t.device.type == "cuda" else None

    def __enter__(self) -> Any:  # the _triton module: Triton launches pass ints / bools for tl.constexpr
        if self.guard is not None:
            self.guard.__enter__()
        return _k()

    def __exit__(self, *exc):
        if self.guard is not None:
            self.guard.__exit__(*exc)
        return False


def _cdiv(a: int, b: int) -> int:
    return (a + b - 1) // b


# --------------------------------------------------------------------------- SchNet filter
def gaussians(r: torch.Tensor, centers: torch.Tensor, coeff: torch.Tensor) -> torch.Tensor:
    """``exp(coeff (r - c)^2)``: ``[E] -> [E, R]`` (torch; used for the weight gradients)."""
    return torch.exp(coeff * (r.unsqueeze(-1) - centers).pow(2))


class SchNetFilter(torch.autograd.Function):
    @staticmethod
    def forward(ctx, r, centers, consts, w1, b1):
        E, (F, R) = r.shape[0], w1.shape
        out = r.new_empty((E, F))
        if E:
            with _Launch(r) as K:
                be, bf = _blocks(F, K.INTERPRETED)
                K.schnet_filter_fwd[(_cdiv(E, be), _cdiv(F, bf))](
                    r, centers, consts, w1, b1, out, E, F, R, BLOCK_E=be, BLOCK_F=bf
                )
        ctx.save_for_backward(r, centers, consts, w1, b1)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, g):  # pyright: ignore[reportIncompatibleMethodOverride]  (once_differentiable's typing)
        r, centers, consts, w1, b1 = ctx.saved_tensors
        need_r, _, _, need_w, need_b = ctx.needs_input_grad
        E, (F, R) = r.shape[0], w1.shape
        if not (need_r or need_w or need_b):
            return None, None, None, None, None
        g = g.contiguous()
        gr = r.new_zeros(E)
        gz = r.new_zeros((E, F)) if (need_w or need_b) else gr
        if E:
            with _Launch(r) as K:
                be, bf = _blocks(F, K.INTERPRETED)
                K.schnet_filter_bwd[(_cdiv(E, be),)](
                    g,
                    r,
                    centers,
                    consts,
                    w1,
                    b1,
                    gr,
                    gz,
                    E,
                    F,
                    R,
                    STORE_GZ=bool(need_w or need_b),
                    BLOCK_E=be,
                    BLOCK_F=bf,
                )
        gw1 = gz.t() @ gaussians(r, centers, consts[0]) if need_w else None
        gb1 = gz.sum(0) if need_b else None
        return (gr if need_r else None), None, None, gw1, gb1


def schnet_filter(
    r: torch.Tensor, centers: torch.Tensor, consts: torch.Tensor, w1: torch.Tensor, b1: torch.Tensor
) -> torch.Tensor:
    """``softplus(gaussians(r) @ w1^T + b1) - log 2``.

    Args:
        r: ``[E]`` edge lengths.
        centers: ``[R]`` Gaussian centres (no gradient).
        consts: ``[>=1]``, ``consts[0]`` the Gaussian coefficient (``-0.5 / spacing^2``).
        w1: ``[F, R]``, b1: ``[F]``: the filter network's first linear layer.

    Returns:
        ``[E, F]``.
    """
    return SchNetFilter.apply(r.contiguous(), centers.contiguous(), consts, w1.contiguous(), b1.contiguous())


# --------------------------------------------------------------------------- SchNet cfconv
class CFConv(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, r, src, dst, consts, num_nodes):
        E, F = w.shape
        out = x.new_zeros((num_nodes, F))
        if E:
            with _Launch(x) as K:
                be, bf = _blocks(F, K.INTERPRETED)
                K.cfconv_fwd[(_cdiv(E, be), _cdiv(F, bf))](x, w, r, src, dst, consts, out, E, F, BLOCK_E=be, BLOCK_F=bf)
        ctx.save_for_backward(x, w, r, src, dst, consts)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, g):  # pyright: ignore[reportIncompatibleMethodOverride]  (once_differentiable's typing)
        x, w, r, src, dst, consts = ctx.saved_tensors
        need_x, need_w, need_r = ctx.needs_input_grad[:3]
        E, F = w.shape
        gx = torch.zeros_like(x) if need_x else None
        gw = torch.zeros_like(w) if need_w else None
        gr = torch.zeros_like(r) if need_r else None
        if E and (need_x or need_w or need_r):
            g = g.contiguous()
            with _Launch(x) as K:
                be, bf = _blocks(F, K.INTERPRETED)
                K.cfconv_bwd[(_cdiv(E, be),)](
                    g,
                    x,
                    w,
                    r,
                    src,
                    dst,
                    consts,
                    gx if need_x else g,
                    gw if need_w else g,
                    gr if need_r else r,
                    E,
                    F,
                    NEED_X=bool(need_x),
                    NEED_W=bool(need_w),
                    NEED_R=bool(need_r),
                    BLOCK_E=be,
                    BLOCK_F=bf,
                )
        return gx, gw, gr, None, None, None, None


def cfconv(
    x: torch.Tensor,
    w: torch.Tensor,
    r: torch.Tensor,
    src: torch.Tensor,
    dst: torch.Tensor,
    consts: torch.Tensor,
    num_nodes: int,
) -> torch.Tensor:
    """``scatter_sum(x[src] * w * cosine_cutoff(r), dst, num_nodes)``.

    Args:
        x: ``[N, F]`` node features (``lin1(h)``).
        w: ``[E, F]`` filters (without the envelope).
        r: ``[E]`` edge lengths.
        src, dst: ``[E]`` int64 source / target of each edge.
        consts: ``consts[1]`` is the cutoff radius.
        num_nodes: N (a Python int).

    Returns:
        ``[num_nodes, F]``.
    """
    return CFConv.apply(
        x.contiguous(), w.contiguous(), r.contiguous(), src.contiguous(), dst.contiguous(), consts, num_nodes
    )


# --------------------------------------------------------------------------- PaiNN message
def bessel(r: torch.Tensor, freqs: torch.Tensor, prefactor: torch.Tensor) -> torch.Tensor:
    """``prefactor sin(f r) / r`` (``prefactor f`` at r ~ 0): ``[E] -> [E, R]`` (torch)."""
    r = r.unsqueeze(-1)
    small = r.abs() < 1e-9
    safe = torch.where(small, torch.ones_like(r), r)
    value = torch.sin(freqs * safe) / safe
    return prefactor * torch.where(small, freqs.expand_as(value), value)


class PaiNNMessage(torch.autograd.Function):
    @staticmethod
    def forward(ctx, phi, v, r, u, freqs, wf, bf, src, dst, consts, num_nodes):
        E, (H3, R) = r.shape[0], wf.shape
        H = H3 // 3
        out_s = phi.new_zeros((num_nodes, H))
        out_v = phi.new_zeros((num_nodes, 3, H))
        if E:
            with _Launch(phi) as K:
                be, bh = _blocks(H, K.INTERPRETED)
                K.painn_message_fwd[(_cdiv(E, be), _cdiv(H, bh))](
                    phi,
                    v,
                    r,
                    u,
                    freqs,
                    wf,
                    bf,
                    src,
                    dst,
                    consts,
                    out_s,
                    out_v,
                    E,
                    H,
                    R,
                    BLOCK_E=be,
                    BLOCK_H=bh,
                )
        ctx.save_for_backward(phi, v, r, u, freqs, wf, bf, src, dst, consts)
        return out_s, out_v

    @staticmethod
    @once_differentiable
    def backward(ctx, gs, gv):  # pyright: ignore[reportIncompatibleMethodOverride]  (once_differentiable's typing)
        phi, v, r, u, freqs, wf, bf, src, dst, consts = ctx.saved_tensors
        need_phi, need_v, need_r, need_u, need_freqs, need_wf, need_bf = ctx.needs_input_grad[:7]
        E, (H3, R) = r.shape[0], wf.shape
        H = H3 // 3
        need_gf = bool(need_freqs or need_wf or need_bf)
        gphi = torch.zeros_like(phi) if need_phi else None
        gvin = torch.zeros_like(v) if need_v else None
        gr = torch.zeros_like(r) if need_r else None
        gu = torch.zeros_like(u) if need_u else None
        gf = r.new_zeros((E, H3)) if need_gf else None
        if E and (need_phi or need_v or need_r or need_u or need_gf):
            gs, gv = gs.contiguous(), gv.contiguous()
            with _Launch(phi) as K:
                be, bh = _blocks(H, K.INTERPRETED)
                K.painn_message_bwd[(_cdiv(E, be),)](
                    gs,
                    gv,
                    phi,
                    v,
                    r,
                    u,
                    freqs,
                    wf,
                    bf,
                    src,
                    dst,
                    consts,
                    gphi if need_phi else gs,
                    gvin if need_v else gs,
                    gr if need_r else r,
                    gu if need_u else u,
                    gf if need_gf else gs,
                    E,
                    H,
                    R,
                    NEED_PHI=bool(need_phi),
                    NEED_V=bool(need_v),
                    NEED_R=bool(need_r),
                    NEED_U=bool(need_u),
                    STORE_GF=need_gf,
                    BLOCK_E=be,
                    BLOCK_H=bh,
                )
        gfreqs = gwf = gbf = None
        if gf is not None:  # need_gf
            pref = consts[0]
            if need_wf:
                gwf = gf.t() @ bessel(r, freqs, pref)
            if need_bf:
                gbf = gf.sum(0)
            if need_freqs:
                rr = r.unsqueeze(-1)
                small = rr.abs() < 1e-9
                d_dfreq = torch.where(small, torch.ones_like(rr), torch.cos(freqs * rr))
                gfreqs = pref * ((gf @ wf) * d_dfreq).sum(0)
        return gphi, gvin, gr, gu, gfreqs, gwf, gbf, None, None, None, None


def painn_message(
    phi: torch.Tensor,
    v: torch.Tensor,
    r: torch.Tensor,
    u: torch.Tensor,
    freqs: torch.Tensor,
    wf: torch.Tensor,
    bf: torch.Tensor,
    src: torch.Tensor,
    dst: torch.Tensor,
    consts: torch.Tensor,
    num_nodes: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """PaiNN's message block, aggregated: ``(sum ds, sum dv)`` per target node.

    ``x = phi[src] * (bessel(r) @ wf^T + bf) * cosine_cutoff(r)``, split into ``(ds, g_vv, g_vs)``;
    ``dv = v[src] * g_vv + g_vs * u``; both summed into ``dst``.

    Args:
        phi: ``[N, 3H]`` ``phi(s)``.
        v: ``[N, 3, H]`` vector features.
        r: ``[E]`` edge lengths; u: ``[E, 3]`` unit vectors.
        freqs: ``[R]`` Bessel frequencies; wf: ``[3H, R]``, bf: ``[3H]`` the filter layer.
        src, dst: ``[E]`` int64.
        consts: ``consts[0]`` the Bessel prefactor ``sqrt(2 / rc)``, ``consts[1]`` the cutoff.
        num_nodes: N.

    Returns:
        ``[N, H]`` and ``[N, 3, H]``.
    """
    return PaiNNMessage.apply(
        phi.contiguous(),
        v.contiguous(),
        r.contiguous(),
        u.contiguous(),
        freqs.contiguous(),
        wf.contiguous(),
        bf.contiguous(),
        src.contiguous(),
        dst.contiguous(),
        consts,
        num_nodes,
    )


def constants(*values: float, like: torch.Tensor) -> torch.Tensor:
    """The ``consts`` tensor of the ops (dtype and device of ``like``)."""
    return torch.tensor([float(v) for v in values], dtype=like.dtype, device=like.device)

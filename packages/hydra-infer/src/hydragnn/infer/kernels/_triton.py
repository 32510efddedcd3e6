"""The Triton kernels (imported only when triton is installed; see :mod:`.ops` for the math).

Whether these run compiled (CUDA) or in Triton's interpreter (CPU tensors, for tests) is
decided when this module is imported: ``@triton.jit`` reads ``TRITON_INTERPRET`` at decoration
time. :data:`INTERPRETED` records which it was.

Layouts (row-major, contiguous): node tensors ``[N, F]`` / ``[N, 3, H]``, edge tensors
``[E, F]``, ``src`` / ``dst`` int64 ``[E]``. All float tensors of one launch share a dtype
(float32 or float64); ``consts`` is a small tensor of that dtype holding the scalars so that
float64 models keep float64 constants (a Python float argument would be float32).
Aggregations into nodes use atomic adds, so the edge order does not matter.
"""

from __future__ import annotations

import triton
import triton.language as tl

try:  # where the interpreter's function type lives (triton 3.x)
    from triton.runtime.interpreter import InterpretedFunction as _Interpreted
except ImportError:  # pragma: no cover - layout of other triton versions
    _Interpreted = ()

LOG2 = tl.constexpr(0.6931471805599453)
PI = tl.constexpr(3.141592653589793)


@triton.jit
def _ssp_parts(z):
    """softplus(z) - log 2 and its derivative sigmoid(z), overflow-safe."""
    sp = tl.maximum(z, 0.0) + tl.log(1.0 + tl.exp(-tl.abs(z)))
    return sp - LOG2, 1.0 / (1.0 + tl.exp(-z))


# --------------------------------------------------------------------------- SchNet filter
@triton.jit
def schnet_filter_fwd(
    r_ptr,
    centers_ptr,
    consts_ptr,
    w1_ptr,
    b1_ptr,
    out_ptr,
    E,
    F,
    R,
    BLOCK_E: tl.constexpr,
    BLOCK_F: tl.constexpr,
):
    """out[e, f] = ssp(sum_k exp(coeff (r_e - c_k)^2) W1[f, k] + b1[f]); grid (E blocks, F blocks)."""
    offs_e = tl.program_id(0) * BLOCK_E + tl.arange(0, BLOCK_E)
    offs_f = tl.program_id(1) * BLOCK_F + tl.arange(0, BLOCK_F)
    me = offs_e < E
    mf = offs_f < F
    coeff = tl.load(consts_ptr)
    r = tl.load(r_ptr + offs_e, mask=me, other=0.0)
    b1 = tl.load(b1_ptr + offs_f, mask=mf, other=0.0)
    z = tl.zeros((BLOCK_E, BLOCK_F), dtype=b1.dtype) + b1[None, :]
    for k in range(R):
        d = r - tl.load(centers_ptr + k)
        g = tl.exp(coeff * d * d)
        w = tl.load(w1_ptr + offs_f * R + k, mask=mf, other=0.0)
        z += g[:, None] * w[None, :]
    t, _ = _ssp_parts(z)
    tl.store(out_ptr + offs_e[:, None] * F + offs_f[None, :], t, mask=me[:, None] & mf[None, :])


@triton.jit
def schnet_filter_bwd(
    g_ptr,
    r_ptr,
    centers_ptr,
    consts_ptr,
    w1_ptr,
    b1_ptr,
    gr_ptr,
    gz_ptr,
    E,
    F,
    R,
    STORE_GZ: tl.constexpr,
    BLOCK_E: tl.constexpr,
    BLOCK_F: tl.constexpr,
):
    """grad_r[e] = sum_k dg_k/dr sum_f g[e, f] sigmoid(z[e, f]) W1[f, k]; optionally gz = g sigmoid(z)."""
    offs_e = tl.program_id(0) * BLOCK_E + tl.arange(0, BLOCK_E)
    me = offs_e < E
    coeff = tl.load(consts_ptr)
    r = tl.load(r_ptr + offs_e, mask=me, other=0.0)
    gr = tl.zeros((BLOCK_E,), dtype=r.dtype)
    for f0 in range(0, F, BLOCK_F):
        offs_f = f0 + tl.arange(0, BLOCK_F)
        mf = offs_f < F
        m2 = me[:, None] & mf[None, :]
        b1 = tl.load(b1_ptr + offs_f, mask=mf, other=0.0)
        z = tl.zeros((BLOCK_E, BLOCK_F), dtype=r.dtype) + b1[None, :]
        for k in range(R):
            d = r - tl.load(centers_ptr + k)
            g = tl.exp(coeff * d * d)
            w = tl.load(w1_ptr + offs_f * R + k, mask=mf, other=0.0)
            z += g[:, None] * w[None, :]
        _, sig = _ssp_parts(z)
        gt = tl.load(g_ptr + offs_e[:, None] * F + offs_f[None, :], mask=m2, other=0.0)
        gz = gt * sig
        if STORE_GZ:
            tl.store(gz_ptr + offs_e[:, None] * F + offs_f[None, :], gz, mask=m2)
        for k in range(R):
            d = r - tl.load(centers_ptr + k)
            dg = 2.0 * coeff * d * tl.exp(coeff * d * d)
            w = tl.load(w1_ptr + offs_f * R + k, mask=mf, other=0.0)
            gr += dg * tl.sum(gz * w[None, :], axis=1)
    tl.store(gr_ptr + offs_e, gr, mask=me)


# --------------------------------------------------------------------------- SchNet cfconv
@triton.jit
def _cosine_cutoff(r, rc):
    """0.5 (cos(pi r / rc) + 1) for r < rc else 0, and its derivative."""
    inside = r < rc
    arg = r * (PI / rc)
    env = tl.where(inside, 0.5 * (tl.cos(arg) + 1.0), 0.0)
    denv = tl.where(inside, -0.5 * (PI / rc) * tl.sin(arg), 0.0)
    return env, denv


@triton.jit
def cfconv_fwd(
    x_ptr,
    w_ptr,
    r_ptr,
    src_ptr,
    dst_ptr,
    consts_ptr,
    out_ptr,
    E,
    F,
    BLOCK_E: tl.constexpr,
    BLOCK_F: tl.constexpr,
):
    """out[dst_e] += x[src_e] * w[e] * env(r_e); grid (E blocks, F blocks)."""
    offs_e = tl.program_id(0) * BLOCK_E + tl.arange(0, BLOCK_E)
    offs_f = tl.program_id(1) * BLOCK_F + tl.arange(0, BLOCK_F)
    me = offs_e < E
    mf = offs_f < F
    m2 = me[:, None] & mf[None, :]
    rc = tl.load(consts_ptr + 1)
    r = tl.load(r_ptr + offs_e, mask=me, other=0.0)
    src = tl.load(src_ptr + offs_e, mask=me, other=0)
    dst = tl.load(dst_ptr + offs_e, mask=me, other=0)
    env, _ = _cosine_cutoff(r, rc)  # pyright: ignore[reportGeneralTypeIssues]  # a @triton.jit helper, inlined when compiled
    x = tl.load(x_ptr + src[:, None] * F + offs_f[None, :], mask=m2, other=0.0)
    w = tl.load(w_ptr + offs_e[:, None] * F + offs_f[None, :], mask=m2, other=0.0)
    msg = x * (w * env[:, None])
    tl.atomic_add(out_ptr + dst[:, None] * F + offs_f[None, :], msg, mask=m2, sem="relaxed")


@triton.jit
def cfconv_bwd(
    g_ptr,
    x_ptr,
    w_ptr,
    r_ptr,
    src_ptr,
    dst_ptr,
    consts_ptr,
    gx_ptr,
    gw_ptr,
    gr_ptr,
    E,
    F,
    NEED_X: tl.constexpr,
    NEED_W: tl.constexpr,
    NEED_R: tl.constexpr,
    BLOCK_E: tl.constexpr,
    BLOCK_F: tl.constexpr,
):
    """Gradients of :func:`cfconv_fwd` w.r.t. x (atomic, by src), w and r; grid (E blocks,)."""
    offs_e = tl.program_id(0) * BLOCK_E + tl.arange(0, BLOCK_E)
    me = offs_e < E
    rc = tl.load(consts_ptr + 1)
    r = tl.load(r_ptr + offs_e, mask=me, other=0.0)
    src = tl.load(src_ptr + offs_e, mask=me, other=0)
    dst = tl.load(dst_ptr + offs_e, mask=me, other=0)
    env, denv = _cosine_cutoff(r, rc)  # pyright: ignore[reportGeneralTypeIssues]  # a @triton.jit helper, inlined when compiled
    gr = tl.zeros((BLOCK_E,), dtype=r.dtype)
    for f0 in range(0, F, BLOCK_F):
        offs_f = f0 + tl.arange(0, BLOCK_F)
        m2 = me[:, None] & (offs_f < F)[None, :]
        g = tl.load(g_ptr + dst[:, None] * F + offs_f[None, :], mask=m2, other=0.0)
        w = tl.load(w_ptr + offs_e[:, None] * F + offs_f[None, :], mask=m2, other=0.0)
        if NEED_X:
            tl.atomic_add(gx_ptr + src[:, None] * F + offs_f[None, :], g * (w * env[:, None]), mask=m2, sem="relaxed")
        if NEED_W or NEED_R:
            x = tl.load(x_ptr + src[:, None] * F + offs_f[None, :], mask=m2, other=0.0)
            if NEED_W:
                tl.store(gw_ptr + offs_e[:, None] * F + offs_f[None, :], g * x * env[:, None], mask=m2)
            if NEED_R:
                gr += tl.sum(g * x * w, axis=1)
    if NEED_R:
        tl.store(gr_ptr + offs_e, gr * denv, mask=me)


# --------------------------------------------------------------------------- PaiNN message
@triton.jit
def _bessel(r, freq, pref):
    """pref sin(freq r) / r (limit pref freq at r ~ 0) and its r-derivative (0 at r ~ 0)."""
    small = tl.abs(r) < 1e-9
    safe = tl.where(small, 1.0, r)
    s = tl.sin(freq * safe)
    c = tl.cos(freq * safe)
    val = tl.where(small, pref * freq, pref * s / safe)
    dval = tl.where(small, 0.0, pref * (freq * safe * c - s) / (safe * safe))
    return val, dval


@triton.jit
def painn_message_fwd(
    phi_ptr,
    v_ptr,
    r_ptr,
    u_ptr,
    freqs_ptr,
    wf_ptr,
    bf_ptr,
    src_ptr,
    dst_ptr,
    consts_ptr,
    out_s_ptr,
    out_v_ptr,
    E,
    H,
    R,
    BLOCK_E: tl.constexpr,
    BLOCK_H: tl.constexpr,
):
    """PaiNN message + aggregation; grid (E blocks, H blocks).

    f = bessel(r) @ Wf^T + bf ([E, 3H]); a = phi[src] * f * fcut(r); (a_s, a_vv, a_vs) = split(a);
    out_s[dst] += a_s; out_v[dst, d] += v[src, d] * a_vv + a_vs * u[e, d].
    """
    offs_e = tl.program_id(0) * BLOCK_E + tl.arange(0, BLOCK_E)
    offs_h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    me = offs_e < E
    mh = offs_h < H
    m2 = me[:, None] & mh[None, :]
    pref = tl.load(consts_ptr)
    rc = tl.load(consts_ptr + 1)
    r = tl.load(r_ptr + offs_e, mask=me, other=0.0)
    src = tl.load(src_ptr + offs_e, mask=me, other=0)
    dst = tl.load(dst_ptr + offs_e, mask=me, other=0)
    fc, _ = _cosine_cutoff(r, rc)  # pyright: ignore[reportGeneralTypeIssues]  # a @triton.jit helper, inlined when compiled
    H3 = 3 * H
    f_s = tl.zeros((BLOCK_E, BLOCK_H), dtype=r.dtype) + tl.load(bf_ptr + offs_h, mask=mh, other=0.0)[None, :]
    f_vv = tl.zeros((BLOCK_E, BLOCK_H), dtype=r.dtype) + tl.load(bf_ptr + H + offs_h, mask=mh, other=0.0)[None, :]
    f_vs = tl.zeros((BLOCK_E, BLOCK_H), dtype=r.dtype) + tl.load(bf_ptr + 2 * H + offs_h, mask=mh, other=0.0)[None, :]
    for k in range(R):
        rb, _ = _bessel(r, tl.load(freqs_ptr + k), pref)
        f_s += rb[:, None] * tl.load(wf_ptr + offs_h * R + k, mask=mh, other=0.0)[None, :]
        f_vv += rb[:, None] * tl.load(wf_ptr + (H + offs_h) * R + k, mask=mh, other=0.0)[None, :]
        f_vs += rb[:, None] * tl.load(wf_ptr + (2 * H + offs_h) * R + k, mask=mh, other=0.0)[None, :]
    row = src[:, None] * H3 + offs_h[None, :]
    a_s = tl.load(phi_ptr + row, mask=m2, other=0.0) * f_s * fc[:, None]
    a_vv = tl.load(phi_ptr + row + H, mask=m2, other=0.0) * f_vv * fc[:, None]
    a_vs = tl.load(phi_ptr + row + 2 * H, mask=m2, other=0.0) * f_vs * fc[:, None]
    tl.atomic_add(out_s_ptr + dst[:, None] * H + offs_h[None, :], a_s, mask=m2, sem="relaxed")
    for d in range(3):
        u = tl.load(u_ptr + offs_e * 3 + d, mask=me, other=0.0)
        vj = tl.load(v_ptr + (src[:, None] * 3 + d) * H + offs_h[None, :], mask=m2, other=0.0)
        dv = vj * a_vv + a_vs * u[:, None]
        tl.atomic_add(out_v_ptr + (dst[:, None] * 3 + d) * H + offs_h[None, :], dv, mask=m2, sem="relaxed")


@triton.jit
def painn_message_bwd(
    gs_ptr,
    gv_ptr,
    phi_ptr,
    v_ptr,
    r_ptr,
    u_ptr,
    freqs_ptr,
    wf_ptr,
    bf_ptr,
    src_ptr,
    dst_ptr,
    consts_ptr,
    gphi_ptr,
    gvin_ptr,
    gr_ptr,
    gu_ptr,
    gf_ptr,
    E,
    H,
    R,
    NEED_PHI: tl.constexpr,
    NEED_V: tl.constexpr,
    NEED_R: tl.constexpr,
    NEED_U: tl.constexpr,
    STORE_GF: tl.constexpr,
    BLOCK_E: tl.constexpr,
    BLOCK_H: tl.constexpr,
):
    """Gradients of :func:`painn_message_fwd`; grid (E blocks,), a loop over H blocks.

    phi and v gradients are atomically added by src; r and u gradients are per edge; the filter
    gradient ``gf [E, 3H]`` (for the weights) is stored when STORE_GF.
    """
    offs_e = tl.program_id(0) * BLOCK_E + tl.arange(0, BLOCK_E)
    me = offs_e < E
    pref = tl.load(consts_ptr)
    rc = tl.load(consts_ptr + 1)
    r = tl.load(r_ptr + offs_e, mask=me, other=0.0)
    src = tl.load(src_ptr + offs_e, mask=me, other=0)
    dst = tl.load(dst_ptr + offs_e, mask=me, other=0)
    fc, dfc = _cosine_cutoff(r, rc)  # pyright: ignore[reportGeneralTypeIssues]  # a @triton.jit helper, inlined when compiled
    u0 = tl.load(u_ptr + offs_e * 3 + 0, mask=me, other=0.0)
    u1 = tl.load(u_ptr + offs_e * 3 + 1, mask=me, other=0.0)
    u2 = tl.load(u_ptr + offs_e * 3 + 2, mask=me, other=0.0)
    gr = tl.zeros((BLOCK_E,), dtype=r.dtype)
    gfc = tl.zeros((BLOCK_E,), dtype=r.dtype)
    gu0 = tl.zeros((BLOCK_E,), dtype=r.dtype)
    gu1 = tl.zeros((BLOCK_E,), dtype=r.dtype)
    gu2 = tl.zeros((BLOCK_E,), dtype=r.dtype)
    H3 = 3 * H
    for h0 in range(0, H, BLOCK_H):
        offs_h = h0 + tl.arange(0, BLOCK_H)
        mh = offs_h < H
        m2 = me[:, None] & mh[None, :]
        f_s = tl.zeros((BLOCK_E, BLOCK_H), dtype=r.dtype) + tl.load(bf_ptr + offs_h, mask=mh, other=0.0)[None, :]
        f_vv = tl.zeros((BLOCK_E, BLOCK_H), dtype=r.dtype) + tl.load(bf_ptr + H + offs_h, mask=mh, other=0.0)[None, :]
        f_vs = (
            tl.zeros((BLOCK_E, BLOCK_H), dtype=r.dtype) + tl.load(bf_ptr + 2 * H + offs_h, mask=mh, other=0.0)[None, :]
        )
        for k in range(R):
            rb, _ = _bessel(r, tl.load(freqs_ptr + k), pref)
            f_s += rb[:, None] * tl.load(wf_ptr + offs_h * R + k, mask=mh, other=0.0)[None, :]
            f_vv += rb[:, None] * tl.load(wf_ptr + (H + offs_h) * R + k, mask=mh, other=0.0)[None, :]
            f_vs += rb[:, None] * tl.load(wf_ptr + (2 * H + offs_h) * R + k, mask=mh, other=0.0)[None, :]
        row = src[:, None] * H3 + offs_h[None, :]
        p_s = tl.load(phi_ptr + row, mask=m2, other=0.0)
        p_vv = tl.load(phi_ptr + row + H, mask=m2, other=0.0)
        p_vs = tl.load(phi_ptr + row + 2 * H, mask=m2, other=0.0)
        gnode = dst[:, None] * H + offs_h[None, :]
        ga_s = tl.load(gs_ptr + gnode, mask=m2, other=0.0)
        vrow = src[:, None] * 3 * H + offs_h[None, :]
        grow = dst[:, None] * 3 * H + offs_h[None, :]
        gv0 = tl.load(gv_ptr + grow, mask=m2, other=0.0)
        gv1 = tl.load(gv_ptr + grow + H, mask=m2, other=0.0)
        gv2 = tl.load(gv_ptr + grow + 2 * H, mask=m2, other=0.0)
        v0 = tl.load(v_ptr + vrow, mask=m2, other=0.0)
        v1 = tl.load(v_ptr + vrow + H, mask=m2, other=0.0)
        v2 = tl.load(v_ptr + vrow + 2 * H, mask=m2, other=0.0)
        ga_vv = gv0 * v0 + gv1 * v1 + gv2 * v2
        ga_vs = gv0 * u0[:, None] + gv1 * u1[:, None] + gv2 * u2[:, None]
        a_vs = p_vs * f_vs * fc[:, None]
        if NEED_V:
            a_vv = p_vv * f_vv * fc[:, None]
            tl.atomic_add(gvin_ptr + vrow, gv0 * a_vv, mask=m2, sem="relaxed")
            tl.atomic_add(gvin_ptr + vrow + H, gv1 * a_vv, mask=m2, sem="relaxed")
            tl.atomic_add(gvin_ptr + vrow + 2 * H, gv2 * a_vv, mask=m2, sem="relaxed")
        if NEED_U:
            gu0 += tl.sum(gv0 * a_vs, axis=1)
            gu1 += tl.sum(gv1 * a_vs, axis=1)
            gu2 += tl.sum(gv2 * a_vs, axis=1)
        if NEED_PHI:
            tl.atomic_add(gphi_ptr + row, ga_s * f_s * fc[:, None], mask=m2, sem="relaxed")
            tl.atomic_add(gphi_ptr + row + H, ga_vv * f_vv * fc[:, None], mask=m2, sem="relaxed")
            tl.atomic_add(gphi_ptr + row + 2 * H, ga_vs * f_vs * fc[:, None], mask=m2, sem="relaxed")
        gf_s = ga_s * p_s * fc[:, None]
        gf_vv = ga_vv * p_vv * fc[:, None]
        gf_vs = ga_vs * p_vs * fc[:, None]
        if STORE_GF:
            frow = offs_e[:, None] * H3 + offs_h[None, :]
            tl.store(gf_ptr + frow, gf_s, mask=m2)
            tl.store(gf_ptr + frow + H, gf_vv, mask=m2)
            tl.store(gf_ptr + frow + 2 * H, gf_vs, mask=m2)
        if NEED_R:
            gfc += tl.sum(ga_s * p_s * f_s + ga_vv * p_vv * f_vv + ga_vs * p_vs * f_vs, axis=1)
            for k in range(R):
                _, drb = _bessel(r, tl.load(freqs_ptr + k), pref)
                w_s = tl.load(wf_ptr + offs_h * R + k, mask=mh, other=0.0)
                w_vv = tl.load(wf_ptr + (H + offs_h) * R + k, mask=mh, other=0.0)
                w_vs = tl.load(wf_ptr + (2 * H + offs_h) * R + k, mask=mh, other=0.0)
                proj = gf_s * w_s[None, :] + gf_vv * w_vv[None, :] + gf_vs * w_vs[None, :]
                gr += drb * tl.sum(proj, axis=1)
    if NEED_R:
        tl.store(gr_ptr + offs_e, gr + gfc * dfc, mask=me)
    if NEED_U:
        tl.store(gu_ptr + offs_e * 3 + 0, gu0, mask=me)
        tl.store(gu_ptr + offs_e * 3 + 1, gu1, mask=me)
        tl.store(gu_ptr + offs_e * 3 + 2, gu2, mask=me)


KERNELS = (schnet_filter_fwd, schnet_filter_bwd, cfconv_fwd, cfconv_bwd, painn_message_fwd, painn_message_bwd)
INTERPRETED: bool = bool(_Interpreted) and isinstance(schnet_filter_fwd, _Interpreted)
"""True when these kernels were decorated under ``TRITON_INTERPRET=1`` (they run on CPU tensors)."""

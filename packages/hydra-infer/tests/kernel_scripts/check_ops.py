"""Each fused op vs its PyTorch reference (values and gradients); run with TRITON_INTERPRET=1.

Prints one JSON object ``{check: max relative error}`` and exits 1 when one exceeds its
tolerance. Used by ``tests/test_kernels.py`` (a subprocess, so that the interpreter flag is set
before triton is imported) and by ``tools/bench/kernels.py``.
"""

from __future__ import annotations

import json
import math
import sys

import torch

from hydragnn.infer.kernels import ops, reference

TOL = {torch.float32: 1e-5, torch.float64: 1e-10}


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b| / max(max |b|, tiny)."""
    a, b = a.detach(), b.detach()
    scale = float(b.abs().max()) if b.numel() else 0.0
    return float((a - b).abs().max()) / max(scale, 1e-30) if a.numel() else 0.0


def _graph(n: int, e: int, cutoff: float, dtype, gen, sink: bool = True):
    """Random edges (unsorted), lengths in (0, 1.2 cutoff) so some lie beyond the cutoff; zero-length sink edges."""
    src = torch.randint(0, n, (e,), generator=gen)
    dst = torch.randint(0, n, (e,), generator=gen)
    r = torch.rand(e, generator=gen, dtype=dtype) * 1.2 * cutoff + 0.05
    if sink:  # padded sink -> sink edges: zero length on the last node
        src[-3:] = n - 1
        dst[-3:] = n - 1
        r[-3:] = 0.0
    return src, dst, r


def _compare(name, fused, ref, inputs, out_grads, results):
    for i, (a, b) in enumerate(zip(fused, ref)):
        results[f"{name}.out{i}"] = rel_err(a, b)
    ga = torch.autograd.grad(fused, inputs, out_grads, allow_unused=True)
    gb = torch.autograd.grad(ref, inputs, out_grads, allow_unused=True)
    for i, (a, b) in enumerate(zip(ga, gb)):
        if b is None:
            continue
        results[f"{name}.grad{i}"] = rel_err(a, b)


def check(dtype, gen) -> dict[str, float]:
    results: dict[str, float] = {}
    n, e, cutoff = 13, 150, 4.0
    src, dst, r = _graph(n, e, cutoff, dtype, gen)
    like = r
    # SchNet filter: R=7 gaussians, F=20 (not a power of two)
    R, F = 7, 20
    centers = torch.linspace(0.0, cutoff, R, dtype=dtype)
    coeff = -0.5 / (cutoff / (R - 1)) ** 2
    w1 = torch.randn(F, R, dtype=dtype, generator=gen).requires_grad_()
    b1 = torch.randn(F, dtype=dtype, generator=gen).requires_grad_()
    rr = r.clone().requires_grad_()
    consts = ops.constants(coeff, cutoff, like=like)
    fused = ops.schnet_filter(rr, centers, consts, w1, b1)
    ref = reference.schnet_filter(rr, centers, coeff, w1, b1)
    _compare("schnet_filter", (fused,), (ref,), (rr, w1, b1), (torch.randn(e, F, dtype=dtype, generator=gen),), results)
    # cfconv
    x = torch.randn(n, F, dtype=dtype, generator=gen).requires_grad_()
    w = torch.randn(e, F, dtype=dtype, generator=gen).requires_grad_()
    fused = ops.cfconv(x, w, rr, src, dst, consts, n)
    ref = reference.cfconv(x, w, rr, src, dst, cutoff, n)
    _compare("cfconv", (fused,), (ref,), (x, w, rr), (torch.randn(n, F, dtype=dtype, generator=gen),), results)
    # PaiNN message: H=10 (3H = 30 columns), R=6 Bessel functions
    H, R = 10, 6
    freqs = (torch.arange(1, R + 1, dtype=dtype) * math.pi / cutoff).requires_grad_()
    pref = math.sqrt(2.0 / cutoff)
    wf = torch.randn(3 * H, R, dtype=dtype, generator=gen).requires_grad_()
    bf = torch.randn(3 * H, dtype=dtype, generator=gen).requires_grad_()
    phi = torch.randn(n, 3 * H, dtype=dtype, generator=gen).requires_grad_()
    v = torch.randn(n, 3, H, dtype=dtype, generator=gen).requires_grad_()
    u = torch.nn.functional.normalize(torch.randn(e, 3, dtype=dtype, generator=gen), dim=-1)
    u[-3:] = 0.0
    u.requires_grad_()
    pconsts = ops.constants(pref, cutoff, like=like)
    fused = ops.painn_message(phi, v, rr, u, freqs, wf, bf, src, dst, pconsts, n)
    ref = reference.painn_message(phi, v, rr, u, freqs, wf, bf, src, dst, pref, cutoff, n)
    grads = (torch.randn(n, H, dtype=dtype, generator=gen), torch.randn(n, 3, H, dtype=dtype, generator=gen))
    _compare("painn_message", fused, ref, (phi, v, rr, u, freqs, wf, bf), grads, results)
    # forces-only backward (weights frozen, v constant): the inference configuration
    fused = ops.painn_message(
        phi.detach(), v.detach(), rr, u, freqs.detach(), wf.detach(), bf.detach(), src, dst, pconsts, n
    )
    ref = reference.painn_message(
        phi.detach(), v.detach(), rr, u, freqs.detach(), wf.detach(), bf.detach(), src, dst, pref, cutoff, n
    )
    _compare("painn_message_geom", fused, ref, (rr, u), grads, results)
    # no edges
    empty = torch.zeros(0, dtype=torch.long)
    out = ops.cfconv(x.detach(), w.detach()[:0], r[:0], empty, empty, consts, n)
    results["cfconv_no_edges"] = float(out.abs().max())
    return results


def main() -> int:
    torch.set_num_threads(1)
    failed = False
    report = {}
    for dtype in (torch.float32, torch.float64):
        gen = torch.Generator().manual_seed(0)
        res = check(dtype, gen)
        name = str(dtype).removeprefix("torch.")
        report[name] = res
        failed |= any(not (val <= TOL[dtype]) for val in res.values())
    print(json.dumps({"ok": not failed, "max_rel_err": report}))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

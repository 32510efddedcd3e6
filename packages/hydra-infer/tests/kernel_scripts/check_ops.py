"""Each Triton primitive vs the primitive's stock forward (values and gradients); run with TRITON_INTERPRET=1.

The stock ``forward`` of a hydra-models primitive is the reference of its kernel: each check
builds a primitive, a copy switched to the ``"triton"`` backend, runs both on the same random
edges (unsorted, some beyond the cutoff, zero-length sink edges) and compares outputs and the
gradients w.r.t. every input and parameter. Prints one JSON object ``{check: max relative
error}`` and exits 1 when one exceeds its tolerance. Used by ``tests/test_kernels.py`` (a
subprocess, so that the interpreter flag is set before triton is imported) and by
``tools/bench/kernels.py``.
"""

from __future__ import annotations

import copy
import json
import sys

import torch

from hydragnn.infer.kernels import primitives
from hydragnn.models.nn import (
    BesselRBF,
    ContinuousFilterConv,
    CosineCutoff,
    EquivariantMessage,
    GaussianRBF,
    RadialEdges,
    RadialFilter,
    use_backend,
)

TOL = {torch.float32: 1e-5, torch.float64: 1e-10}


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b| / max(max |b|, tiny)."""
    a, b = a.detach(), b.detach()
    scale = float(b.abs().max()) if b.numel() else 0.0
    return float((a - b).abs().max()) / max(scale, 1e-30) if a.numel() else 0.0


def _graph(n: int, e: int, cutoff: float, dtype, gen):
    """Random edges (unsorted), lengths in (0, 1.2 cutoff); zero-length sink edges on the last node."""
    src = torch.randint(0, n, (e,), generator=gen)
    dst = torch.randint(0, n, (e,), generator=gen)
    r = torch.rand(e, generator=gen, dtype=dtype) * 1.2 * cutoff + 0.05
    src[-3:] = n - 1
    dst[-3:] = n - 1
    r[-3:] = 0.0
    u = torch.nn.functional.normalize(torch.randn(e, 3, dtype=dtype, generator=gen), dim=-1)
    u[-3:] = 0.0
    return src, dst, r, u


def _compare(name, stock, fast, run, inputs, gen, results):
    """``run(module) -> outputs`` for both modules; outputs and grads w.r.t. inputs and parameters."""
    ref, got = run(stock), run(fast)
    ref = ref if isinstance(ref, tuple) else (ref,)
    got = got if isinstance(got, tuple) else (got,)
    assert fast.backend == "triton" and stock.backend == "torch", (fast.backend, stock.backend)
    for i, (a, b) in enumerate(zip(got, ref)):
        results[f"{name}.out{i}"] = rel_err(a, b)
    grads = [torch.randn(t.shape, dtype=t.dtype, generator=gen) for t in ref]
    params_ref = [p for p in stock.parameters() if p.requires_grad]
    params_got = [p for p in fast.parameters() if p.requires_grad]
    gb = torch.autograd.grad(ref, [*inputs, *params_ref], grads, allow_unused=True)
    ga = torch.autograd.grad(got, [*inputs, *params_got], grads, allow_unused=True)
    for i, (a, b) in enumerate(zip(ga, gb)):
        if b is not None:
            results[f"{name}.grad{i}"] = rel_err(a, b)


def _switched(module):
    fast = copy.deepcopy(module)
    report = use_backend(fast, primitives.BACKEND)
    assert report.switched, report
    return fast


def check(dtype, gen) -> dict[str, float]:
    results: dict[str, float] = {}
    n, e, cutoff = 13, 150, 4.0
    src, dst, r, u = _graph(n, e, cutoff, dtype, gen)
    rr = r.clone().requires_grad_()
    # SchNet filter (R=7 Gaussians, F=20: not a power of two) and the continuous-filter convolution
    R, F = 7, 20
    gauss, cos = GaussianRBF(cutoff, R).to(dtype), CosineCutoff(cutoff)
    filt = RadialFilter(R, F).to(dtype)

    def edges(basis, length=rr, unit=None):
        return RadialEdges(src, dst, length, n, dtype, basis, cos, unit=unit)

    _compare("radial_filter", filt, _switched(filt), lambda m: m(edges(gauss)), [rr], gen, results)
    x = torch.randn(n, F, dtype=dtype, generator=gen).requires_grad_()
    w = torch.randn(e, F, dtype=dtype, generator=gen).requires_grad_()
    conv = ContinuousFilterConv()
    _compare("cfconv", conv, _switched(conv), lambda m: m(x, w, edges(gauss)), [x, w, rr], gen, results)
    # PaiNN message: H=10 (3H = 30 columns), R=6 Bessel functions with trainable frequencies
    H, R = 10, 6
    bessel = BesselRBF(cutoff, R, trainable=True).to(dtype)
    msg = EquivariantMessage(R, H).to(dtype)
    phi = torch.randn(n, 3 * H, dtype=dtype, generator=gen).requires_grad_()
    v = torch.randn(n, 3, H, dtype=dtype, generator=gen).requires_grad_()
    uu = u.clone().requires_grad_()
    fast_msg = _switched(msg)

    def message(m):
        return m(phi, v, edges(bessel, unit=uu))

    _compare("painn_message", msg, fast_msg, message, [phi, v, rr, uu, bessel.freqs], gen, results)
    # forces-only backward (weights frozen, features constant): the inference configuration
    frozen, fast_frozen = copy.deepcopy(msg).requires_grad_(False), copy.deepcopy(fast_msg).requires_grad_(False)

    def geometry_only(m):
        return m(phi.detach(), v.detach(), RadialEdges(src, dst, rr, n, dtype, bessel, cos, unit=uu))

    _compare("painn_message_geom", frozen, fast_frozen, geometry_only, [rr, uu], gen, results)
    # no edges
    empty = torch.zeros(0, dtype=torch.long)
    none = RadialEdges(empty, empty, r[:0], n, dtype, gauss, cos)
    out = _switched(conv)(x.detach(), w.detach()[:0], none)
    results["cfconv_no_edges"] = float(out.abs().max())
    # a call the kernel cannot serve (Bessel basis under the Gaussian filter) runs the stock forward
    mixed = RadialEdges(src, dst, rr, n, dtype, BesselRBF(cutoff, 7).to(dtype), cos)
    results["filter_declines_other_basis"] = rel_err(_switched(filt)(mixed), filt(mixed))
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

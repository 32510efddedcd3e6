"""Fraction of the machine's peak for ``infer.py`` (not a benchmark itself).

The arithmetic of one call is what torch's ``FlopCounterMode`` counts while it runs: the
floating-point operations of every matrix product (``mm``, ``addmm``, ``bmm``, convolutions,
einsums lowered to them) of the forward and, for E+F, of the autograd backward, from the
operand shapes, hence from the layer widths and the edge count of that call. Element-wise work
and scatters are not counted: they are the traffic that keeps a model below the matmul rate. The
machine's rate is a square ``n x n`` fp32 (or the model's dtype) matrix product measured in the
same process with the same threads. Their ratio is the fraction of peak a call reaches.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
from torch.utils.flop_counter import FlopCounterMode


def call_flops(call: Callable[[], object]) -> int:
    """Matrix-product FLOPs (2 x multiply-adds) of one ``call()``, forward and backward."""
    with FlopCounterMode(display=False) as counter:
        call()
    return int(counter.get_total_flops())


def matmul_rate(device: torch.device, dtype: torch.dtype, n: int = 1024, min_time: float = 0.5) -> float:
    """FLOP/s of an ``n x n`` matrix product on ``device`` in ``dtype`` (best of repeated runs)."""
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    best = float("inf")
    start = time.perf_counter()
    while time.perf_counter() - start < min_time or best == float("inf"):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        a @ b
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        best = min(best, time.perf_counter() - t0)
    return 2 * n**3 / best

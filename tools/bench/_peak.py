"""Fraction of the machine's peak for ``infer.py`` (not a benchmark itself).

The arithmetic of one call is what torch's ``FlopCounterMode`` counts while it runs: the
floating-point operations of every matrix product (``mm``, ``addmm``, ``bmm``, convolutions,
einsums lowered to them) of the forward and, for E+F, of the autograd backward, from the
operand shapes, hence from the layer widths and the edge count of that call. Element-wise work
and scatters are not counted: they are the traffic that keeps a model below the matmul rate; a
product run as a dense matrix with structural zeros (MACE's products on small calls) counts its
zeros, so compare calls/s, not fractions, across executions of the same model. The
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


KINDS: dict[str, frozenset[str]] = {
    "matrix products": frozenset(
        {"mm", "addmm", "bmm", "baddbmm", "addbmm", "matmul", "mv", "addmv", "dot", "convolution", "_convolution"}
    ),
    "gathers / scatters": frozenset(
        {
            "index",
            "index_select",
            "index_add",
            "index_add_",
            "index_put_",
            "_index_put_impl_",
            "scatter",
            "scatter_",
            "scatter_add",
            "scatter_add_",
            "scatter_reduce",
            "scatter_reduce_",
            "gather",
            "segment_reduce",
            "embedding",
            "embedding_dense_backward",
            "index_select_backward",
        }  # fmt: skip
    ),
}
"""aten operators by kind; every other aten operator counts as element-wise / reduction / copy."""


def time_shares(call: Callable[[], object]) -> dict[str, float]:
    """Where one ``call()`` spends its host time, as fractions of its wall time.

    From torch's profiler (self time of each operator on the calling thread): matrix products,
    gathers / scatters, element-wise / reductions / copies (the other aten operators), custom
    operators (neighbour search: ``nvalchemiops::`` and the like), the autograd engine, and the
    rest of the wall time (Python between operators, untracked work). With one thread, the
    shares say whether arithmetic, memory traffic or overhead bounds the call.
    """
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        start = time.perf_counter()
        call()
        wall_us = (time.perf_counter() - start) * 1e6
    shares = dict.fromkeys([*KINDS, "element-wise / reductions", "custom operators", "autograd engine"], 0.0)
    for event in prof.key_averages():
        namespace, _, op = event.key.partition("::")
        if namespace == "aten":
            kind = next((k for k, ops in KINDS.items() if op in ops), "element-wise / reductions")
        elif namespace == "autograd" or namespace == "torch":
            kind = "autograd engine"
        elif op and namespace.isidentifier() and " " not in event.key:
            kind = "custom operators"
        else:
            continue  # profiler ranges (record_function), whose time their operators already hold
        shares[kind] += event.self_cpu_time_total / wall_us
    shares["Python / untracked"] = max(0.0, 1.0 - sum(shares.values()))
    return shares

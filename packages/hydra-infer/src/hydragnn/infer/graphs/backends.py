"""Capture backends: a real CUDA graph, and a CPU replay backend that runs the same code path.

An engine hands a backend one callable ``fn() -> {name: tensor}`` that reads only the engine's
static input buffers. :meth:`capture` warms it up once, records it and returns a
:class:`Captured` whose :meth:`Captured.replay` refreshes :attr:`Captured.outputs` in place
(the same tensors every time, like a CUDA graph's outputs).

* :class:`CudaGraphBackend`: ``torch.cuda.CUDAGraph`` captured with ``torch.cuda.graph`` into
  one memory pool shared by every engine of a calculator, after a warm-up on a side stream.
* :class:`ReplayBackend` (testing, CPU or CUDA): "capture" keeps the callable and its first
  outputs; "replay" re-runs it on the same static buffers and copies the results into those
  outputs. Everything around the capture (static buffers, keys, capacity, LRU, budget,
  admission, invalidation) is the identical code path. ``total_memory`` fakes the device size
  (budget tests) and ``perturb`` alters replayed outputs (admission tests).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

Outputs = dict[str, torch.Tensor]

DEFAULT_FAKE_TOTAL = 16 * 2**30
"""Device size the replay backend reports unless told otherwise (16 GiB)."""


def tensor_bytes(tensors: Any) -> int:
    """Bytes of a tensor, or of the tensors in a dict / list."""
    if isinstance(tensors, torch.Tensor):
        return tensors.numel() * tensors.element_size()
    if isinstance(tensors, dict):
        tensors = tensors.values()
    return sum(tensor_bytes(t) for t in tensors if t is not None)


class Captured:
    """One recorded graph.

    Attributes:
        outputs: the static output tensors (refreshed by every :meth:`replay`).
        pool_bytes: memory the capture added to the pool (bytes).
    """

    def __init__(self, replay: Callable[[], None], outputs: Outputs, pool_bytes: int, handle: Any = None) -> None:
        self._replay = replay
        self.outputs = outputs
        self.pool_bytes = int(pool_bytes)
        self.handle = handle

    def replay(self) -> Outputs:
        self._replay()
        return self.outputs

    def release(self) -> None:
        self._replay = _released
        self.outputs = {}
        self.handle = None


def _released() -> None:
    raise RuntimeError("hydra-infer: replay of a released graph")


class ReplayBackend:
    """CPU stand-in for CUDA-graph capture (for tests): same static buffers, re-run on replay.

    Args:
        total_memory: device size in bytes reported to the budget (fake; default 16 GiB).
        perturb: test hook called on the static outputs after each replay (in place).
    """

    name = "replay"
    runs_on_cpu = True

    def __init__(self, total_memory: int = DEFAULT_FAKE_TOTAL, perturb: Callable[[Outputs], None] | None = None):
        self.fake_total = int(total_memory)
        self.perturb = perturb

    def total_memory(self, device: torch.device) -> int:
        return self.fake_total

    def capture(self, fn: Callable[[], Outputs], device: torch.device) -> Captured:
        fn()  # warm-up, as before a real capture
        outputs = {k: v.detach().clone() for k, v in fn().items()}

        def replay() -> None:
            fresh = fn()
            for k, v in outputs.items():
                v.copy_(fresh[k])
            if self.perturb is not None:
                self.perturb(outputs)

        return Captured(replay, outputs, tensor_bytes(outputs))

    def release_pool(self) -> None:
        pass


class CudaGraphBackend:
    """Real CUDA-graph capture; every engine of one calculator shares one memory pool."""

    name = "cuda"
    runs_on_cpu = False

    def __init__(self) -> None:
        self.pool: Any = None

    def total_memory(self, device: torch.device) -> int:
        _, total = torch.cuda.mem_get_info(device)
        return int(total)

    def capture(self, fn: Callable[[], Outputs], device: torch.device) -> Captured:  # pragma: no cover - GPU only
        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()
        torch.cuda.synchronize(device)
        before = torch.cuda.memory_reserved(device)
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            fn()  # warm-up: autograd, cuBLAS workspaces, lazy inits happen outside the capture
        torch.cuda.current_stream(device).wait_stream(side)
        torch.cuda.synchronize(device)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            outputs = fn()
        torch.cuda.synchronize(device)
        grown = max(0, torch.cuda.memory_reserved(device) - before)
        return Captured(graph.replay, outputs, max(grown, tensor_bytes(outputs)), handle=graph)

    def release_pool(self) -> None:
        self.pool = None
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def make_backend(spec: Any) -> Any:
    """``"replay"`` / ``"cuda"`` / a backend instance -> a backend."""
    if spec == "replay":
        return ReplayBackend()
    if spec == "cuda":
        return CudaGraphBackend()
    if hasattr(spec, "capture") and hasattr(spec, "total_memory"):
        return spec
    raise ValueError(f"graph backend: expected 'replay', 'cuda' or a backend object, found {spec!r}")

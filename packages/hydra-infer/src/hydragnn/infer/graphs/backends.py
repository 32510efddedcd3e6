"""Capture backends: a real CUDA graph, and a CPU replay backend that runs the same code path.

An engine hands a backend one callable ``fn() -> {name: tensor}`` that reads only the engine's
static input buffers. :meth:`capture` warms it up once, records it and returns a
:class:`Captured` whose :meth:`Captured.replay` refreshes :attr:`Captured.outputs` in place
(the same tensors every time, like a CUDA graph's outputs). A backend also owns the memory pool
of one generation (:meth:`pool_bytes`, :meth:`release_pool`) and orders replays
(:meth:`begin` / :meth:`end` around each use of the static buffers, :meth:`synchronize`).

* :class:`CudaGraphBackend`: ``torch.cuda.CUDAGraph`` captured with ``torch.cuda.graph`` into
  one ``torch.cuda.MemPool`` shared by every engine of a calculator, after a warm-up on a side
  stream; the retained bytes are the pool's own segments (allocator snapshot of that pool).
  ``begin`` makes the current stream wait on an event recorded by the previous ``end`` (device
  side, no host synchronisation), so replays issued from different streams never overlap on
  the shared buffers.
* :class:`ReplayBackend` (testing, CPU or CUDA): "capture" keeps the callable and its first
  outputs; "replay" re-runs it on the same static buffers and copies the results into those
  outputs. Everything around the capture (static buffers, keys, capacity, LRU, budget,
  admission, invalidation, failures) is the identical code path. ``total_memory`` fakes the
  device size (budget tests), ``perturb`` alters replayed outputs (admission tests), and the
  pool grows by each capture's outputs until :meth:`release_pool`, like a real graph pool.
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
    """

    def __init__(self, replay: Callable[[], None], outputs: Outputs) -> None:
        self._replay = replay  # a real graph's bound ``replay`` keeps the graph alive until :meth:`release`
        self.outputs = outputs

    def replay(self) -> Outputs:
        self._replay()
        return self.outputs

    def release(self) -> None:
        self._replay = _released
        self.outputs = {}


def _released() -> None:
    raise RuntimeError("hydra-infer: replay of a released graph")


class ReplayBackend:
    """CPU stand-in for CUDA-graph capture (for tests): same static buffers, re-run on replay.

    Args:
        total_memory: device size in bytes reported to the budget (fake; default 16 GiB).
        perturb: test hook called on the static outputs after each replay (in place).
    """

    def __init__(self, total_memory: int = DEFAULT_FAKE_TOTAL, perturb: Callable[[Outputs], None] | None = None):
        self.fake_total = int(total_memory)
        self.perturb = perturb
        self.pool = 0

    def total_memory(self, device: torch.device) -> int:
        return self.fake_total

    def capture(self, fn: Callable[[], Outputs], device: torch.device) -> Captured:
        fn()  # warm-up, as before a real capture
        outputs = {k: v.detach().clone() for k, v in fn().items()}
        self.pool += tensor_bytes(outputs)

        def replay() -> None:
            fresh = fn()
            for k, v in outputs.items():
                v.copy_(fresh[k])
            if self.perturb is not None:
                self.perturb(outputs)

        return Captured(replay, outputs)

    def pool_bytes(self) -> int:
        return self.pool

    def release_pool(self) -> None:
        self.pool = 0

    def begin(self, device: torch.device) -> None:
        pass  # replays run synchronously on the caller's thread

    def end(self, device: torch.device) -> None:
        pass

    def synchronize(self) -> None:
        pass


class CudaGraphBackend:  # pragma: no cover - GPU only (tests/test_graphs_gpu.py, tools/gpu/qualify.sh)
    """Real CUDA-graph capture; every engine of one calculator shares one memory pool (a generation)."""

    def __init__(self) -> None:
        self.pool: Any = None
        self._last: Any = None  # event recorded after the last use of the static buffers

    def total_memory(self, device: torch.device) -> int:
        _, total = torch.cuda.mem_get_info(device)
        return int(total)

    def capture(self, fn: Callable[[], Outputs], device: torch.device) -> Captured:
        if self.pool is None:
            self.pool = torch.cuda.MemPool()
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()  # blocks cached for the caller's stream cannot serve the capture stream
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            fn()  # warm-up: autograd, cuBLAS workspaces, lazy inits happen outside the capture
        torch.cuda.current_stream(device).wait_stream(side)
        torch.cuda.synchronize(device)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool.id):
            outputs = fn()
        torch.cuda.synchronize(device)
        return Captured(graph.replay, outputs)

    def pool_bytes(self) -> int:
        """Reserved bytes of this backend's pool, from the allocator snapshot of that pool."""
        if self.pool is None:
            return 0
        pool_id = tuple(self.pool.id)
        segments = torch.cuda.memory_snapshot(pool_id, include_traces=False)
        return sum(int(seg["total_size"]) for seg in segments if tuple(seg.get("segment_pool_id", pool_id)) == pool_id)

    def release_pool(self) -> None:
        self.pool = None
        if torch.cuda.is_available():
            torch.cuda.empty_cache()

    def begin(self, device: torch.device) -> None:
        if self._last is not None:
            torch.cuda.current_stream(device).wait_event(self._last)

    def end(self, device: torch.device) -> None:
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream(device))
        self._last = event

    def synchronize(self) -> None:
        if self._last is not None:
            self._last.synchronize()


def make_backend(spec: Any) -> Any:
    """``"replay"`` / ``"cuda"`` / a backend instance -> a backend."""
    if spec == "replay":
        return ReplayBackend()
    if spec == "cuda":
        return CudaGraphBackend()
    if hasattr(spec, "capture") and hasattr(spec, "total_memory"):
        return spec
    raise ValueError(f"graph backend: expected 'replay', 'cuda' or a backend object, found {spec!r}")

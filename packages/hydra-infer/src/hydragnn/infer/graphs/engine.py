"""``GraphEngineCache``: the CUDA-graph policy of one calculator (the ``_graph_engine`` seam).

Policy, per layout key (``("dense", rows, N, forces)`` or ``("sparse", N, B, forces)``):

1. first sighting: the regular path answers (``run`` returns ``None``) and the key is noted;
2. second sighting: an engine is built (static buffers), captured after one warm-up, checked
   against the memory budget, replayed on the call and compared with a fresh regular evaluation
   (:mod:`.admission`); admitted, it joins the LRU cache, else the key stays on the regular path
   for good (until the model changes or :meth:`clear`); the regular result answers;
3. later sightings replay the engine; a dense batch of ``B`` rows also replays the smallest
   recorded graph of the same ``N`` and force request with at most ``max(1, B // 3)`` extra rows.

A sparse engine whose in-graph neighbour list overflowed its spare capacity is rebuilt with more
room and re-validated. Engines live in an LRU of :data:`MAX_ENGINES` per calculator, share one
memory pool and are admitted while their bytes (static buffers + pool growth measured around the
capture) fit :data:`BUDGET_FRACTION` of the device memory (measured at capture); older engines
are evicted to make room. A change of the model (``load_state_dict``, in-place parameter
updates, replaced tensors) drops every engine. Results are copies the caller owns.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import torch

from ..inputs import CallInputs
from ..outputs import convert
from .admission import mismatch
from .backends import Outputs
from .base import StaticEngine
from .dense import DenseEngine
from .sparse import SparseEngine, capacity_for, estimated_bytes

MAX_ENGINES = 16
BUDGET_FRACTION = 0.25
COUNTERS = (
    "first_sightings",
    "regular_calls",
    "captures",
    "admitted",
    "rejected",
    "budget_rejected",
    "replays",
    "padded_replays",
    "evictions",
    "overflows",
    "rebuilds",
    "invalidations",
)


def model_fingerprint(model: torch.nn.Module) -> tuple:
    """Cheap identity of the weights: every parameter / buffer's id, storage and version counter.

    ``load_state_dict`` and in-place updates (``optimizer.step``, ``p.add_`` under ``no_grad``) bump
    the version counters; replacing a tensor changes its id. Writes through ``p.data`` are not
    seen: call ``clear_cuda_graphs()`` after those.
    """
    return tuple((id(t), t.data_ptr(), t._version) for t in (*model.parameters(), *model.buffers()))


class GraphEngineCache:
    """Per-calculator cache of captured engines (see the module docstring).

    Args:
        backend: :class:`~.backends.CudaGraphBackend` or :class:`~.backends.ReplayBackend`.
        max_engines: LRU size.
        budget_fraction: share of the device memory the engines may hold.
    """

    def __init__(self, backend: Any, *, max_engines: int = MAX_ENGINES, budget_fraction: float = BUDGET_FRACTION):
        self.backend = backend
        self.max_engines = max_engines
        self.budget_fraction = budget_fraction
        self.runs_on_cpu = bool(getattr(backend, "runs_on_cpu", False))
        self.engines: OrderedDict[tuple, StaticEngine] = OrderedDict()
        self.seen: set[tuple] = set()
        self.rejected: dict[tuple, str] = {}
        self.counters = dict.fromkeys(COUNTERS, 0)
        self.budget_bytes = 0
        self._fingerprint: tuple | None = None
        self.last_event = ""

    # ------------------------------------------------------------------ seam API
    def run(self, calc: Any, call: CallInputs, *, forces: bool) -> Outputs | None:
        """Raw outputs of ``call`` (the call's flat layout) from a graph, or ``None``: use the regular path."""
        self._check_model(calc.model)
        if call.pos.shape[0] == 0 or call.num_graphs == 0:
            return self._regular("empty")
        kind, key = self._key(calc, call, forces)
        if key in self.rejected:
            return self._regular("rejected")
        engine = self._lookup(key, call)
        if engine is not None:
            return self._replay(calc, engine, call, forces)
        if key not in self.seen:
            self.seen.add(key)
            self.counters["first_sightings"] += 1
            return self._regular("first")
        return self._build_and_admit(calc, call, key, forces)

    def memory_stats(self) -> dict[str, int]:
        pool = sum(e.pool_bytes for e in self.engines.values())
        static = sum(e.static_bytes for e in self.engines.values())
        return {
            "engines": len(self.engines),
            "graphs": sum(e.graph is not None for e in self.engines.values()),
            "graph_pool_bytes": pool,
            "static_buffer_bytes": static,
            "budget_bytes": self.budget_bytes,
            **self.counters,
        }

    def clear(self) -> None:
        """Release every engine, the pool and the per-layout history."""
        for engine in self.engines.values():
            engine.release()
        self.engines.clear()
        self.seen.clear()
        self.rejected.clear()
        self.backend.release_pool()

    # ------------------------------------------------------------------ policy
    def _check_model(self, model: torch.nn.Module) -> None:
        fp = model_fingerprint(model)
        if self._fingerprint is not None and fp != self._fingerprint and (self.engines or self.seen or self.rejected):
            self.clear()
            self.counters["invalidations"] += 1
        self._fingerprint = fp

    def _regular(self, why: str) -> None:
        self.counters["regular_calls"] += 1
        self.last_event = why
        return None

    @staticmethod
    def _key(calc: Any, call: CallInputs, forces: bool) -> tuple[str, tuple]:
        width = call.mask.shape[1] if call.mask is not None else call.pos.shape[0]
        if call.layout in ("single", "dense") and width < calc.nb_threshold:
            rows = call.num_graphs if call.layout == "dense" else 1
            return "dense", ("dense", rows, width, bool(forces))
        return "sparse", ("sparse", call.pos.shape[0], call.num_graphs, bool(forces))

    def _lookup(self, key: tuple, call: CallInputs) -> StaticEngine | None:
        if key in self.engines:
            return self.engines[key]
        if key[0] != "dense":
            return None
        _, rows, width, forces = key
        slack = max(1, rows // 3)
        fits = [
            k
            for k in self.engines
            if k[0] == "dense" and k[2] == width and k[3] == forces and rows < k[1] <= rows + slack
        ]
        return self.engines[min(fits, key=lambda k: k[1])] if fits else None

    def _replay(self, calc: Any, engine: StaticEngine, call: CallInputs, forces: bool) -> Outputs | None:
        raw = engine.replay(call)
        if isinstance(engine, SparseEngine):
            count = engine.overflowed()
            if count is not None:
                self.counters["overflows"] += 1
                self._drop(engine.key)
                self.counters["rebuilds"] += 1
                return self._build_and_admit(calc, call, engine.key, forces, edges=count)
        self.engines.move_to_end(engine.key)
        self.counters["replays"] += 1
        if engine.key != self._key(calc, call, forces)[1]:
            self.counters["padded_replays"] += 1
        self.last_event = "replay"
        return raw

    def _build(self, calc: Any, call: CallInputs, key: tuple, forces: bool, edges: int | None) -> StaticEngine:
        if key[0] == "dense":
            engine: StaticEngine = DenseEngine(calc, key[1], key[2], forces)
        else:
            probe = SparseEngine(calc, key[1], key[2], forces, capacity=1)
            needed = probe.edge_count(call) if edges is None else edges
            probe.release()
            engine = SparseEngine(calc, key[1], key[2], forces, capacity=capacity_for(needed))
        engine.load(call)
        engine.capture(self.backend)
        self.counters["captures"] += 1
        return engine

    def _build_and_admit(
        self, calc: Any, call: CallInputs, key: tuple, forces: bool, edges: int | None = None
    ) -> Outputs | None:
        self.budget_bytes = int(self.budget_fraction * self.backend.total_memory(calc.device))
        if key[0] == "sparse" and estimated_bytes(key[1]) > self.budget_bytes:
            return self._reject_budget(calc, key, estimated_bytes(key[1]))  # never allocate the O(N^2) pairs
        engine = self._build(calc, call, key, forces, edges)
        size = engine.total_bytes
        if size > self.budget_bytes:
            engine.release()
            return self._reject_budget(calc, key, size)
        got = engine.replay(call)
        want = calc._run_regular(call, forces=forces, stress=False)
        problem = mismatch(convert(got, call, calc.info), convert(want, call, calc.info), call.counts)
        if problem is None and isinstance(engine, SparseEngine) and engine.overflowed() is not None:
            problem = "edge buffer overflow during validation"
        if problem is not None:
            engine.release()
            self.rejected[key] = problem
            self.counters["rejected"] += 1
            calc._warnings.warn(
                "cuda_graph",
                "rejected",
                f"a captured CUDA graph did not match the regular path ({problem}); that layout stays on the "
                "regular path",
            )
            self.counters["regular_calls"] += 1
            self.last_event = "rejected"
            return want
        self._make_room(size)
        self.engines[key] = engine
        self.counters["admitted"] += 1
        self.counters["regular_calls"] += 1
        self.last_event = "admitted"
        return want

    def _reject_budget(self, calc: Any, key: tuple, size: int) -> None:
        self.rejected[key] = "budget"
        self.counters["budget_rejected"] += 1
        calc._warnings.warn(
            "cuda_graph",
            "budget",
            f"a CUDA graph of {size} bytes does not fit the budget of {self.budget_bytes} bytes "
            f"({self.budget_fraction:.0%} of device memory); that layout stays on the regular path",
        )
        return self._regular("budget")

    def _make_room(self, size: int) -> None:
        held = sum(e.total_bytes for e in self.engines.values())
        while self.engines and (len(self.engines) >= self.max_engines or held + size > self.budget_bytes):
            key, old = self.engines.popitem(last=False)
            held -= old.total_bytes
            old.release()
            self.counters["evictions"] += 1

    def _drop(self, key: tuple) -> None:
        engine = self.engines.pop(key, None)
        if engine is not None:
            engine.release()

"""``GraphEngineCache``: the CUDA-graph policy of one calculator (its :class:`~.host.EngineHost`).

Policy, per layout key (``("periodic", counts, forces)`` for fully periodic cells, else
``("dense", rows, N, forces)`` for ``N <= nb_threshold``, else ``("sparse", N, B, forces)``):

1. first sighting: the regular path answers (``run`` returns ``None``) and the key is noted;
2. second sighting: an engine is built (static buffers), captured after one warm-up, its retained
   memory (the shared pool's segments + every engine's static buffers) checked against the budget,
   replayed on the call and compared with a fresh regular evaluation (:mod:`.admission`);
   admitted, it joins the LRU cache, else the key stays on the regular path (until the model
   changes, :meth:`clear`, or the key drops out of the :data:`MAX_LAYOUTS` most recently seen);
   the regular result answers;
3. later sightings replay the engine; a dense batch of ``B`` rows also replays the smallest
   recorded graph of the same ``N`` and force request with at most ``max(1, B // 3)`` extra rows,
   after checking that reuse once against the regular path (a failed check keeps that row count
   regular).

A sparse or periodic engine whose in-graph neighbour list overflowed its spare capacity (or, for
a periodic one, whose cell now needs more periodic images) is rebuilt for the current call and
re-validated. Engines live in an LRU of :data:`MAX_ENGINES` per calculator and share one
memory pool (a generation). A capture or rebuild that would exceed :data:`BUDGET_FRACTION` of the
device memory rejects that layout and evicts nothing; the generation (every engine and the pool) is
retired when no admitted engine remains after a rejection or failure, when the remaining retained
bytes exceed the budget, and on out-of-memory. A capture, check or replay that raises never fails the
call: the layout is rejected, the regular path answers and a :class:`~..errors.GraphFallbackWarning`
is issued once per calculator; only errors that leave the CUDA context unusable are re-raised.
A change of the model (``load_state_dict``, in-place parameter updates, replaced tensors) drops
every engine. One lock serialises the cache (load, replay, extract share static buffers), and the
backend orders replays issued from different CUDA streams. Results are copies the caller owns.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

import torch

from ..errors import GraphFallbackWarning
from ..inputs import CallInputs
from ..model_info import model_fingerprint
from ..outputs import convert
from .admission import mismatch
from .backends import Outputs
from .base import StaticEngine
from .cells import Grid
from .dense import DenseEngine
from .failures import is_fatal, is_out_of_memory
from .host import EngineHost
from .periodic import PeriodicEngine, neighbour_capacity
from .periodic import build_engine as build_periodic
from .periodic import plan as plan_periodic
from .sparse import SparseEngine

MAX_ENGINES = 16
MAX_LAYOUTS = 1024
"""Layouts remembered (seen once, or rejected): the most recently seen ones."""
BUDGET_FRACTION = 0.25
COUNTERS = (
    "first_sightings",
    "regular_calls",
    "captures",
    "admitted",
    "rejected",
    "budget_rejected",
    "failures",
    "replays",
    "padded_replays",
    "padded_checks",
    "evictions",
    "overflows",
    "rebuilds",
    "retirements",
    "invalidations",
)


class _Rejected(Exception):
    """Internal: a layout rejected while it was being built (the reason is already recorded)."""


class GraphEngineCache:
    """Per-calculator cache of captured engines (see the module docstring).

    Args:
        backend: :class:`~.backends.CudaGraphBackend` or :class:`~.backends.ReplayBackend`.
        max_engines: LRU size.
        budget_fraction: share of the device memory the engines may retain.
        max_layouts: layouts remembered as seen or rejected (least recently seen forgotten first).
    """

    def __init__(
        self,
        backend: Any,
        *,
        max_engines: int = MAX_ENGINES,
        budget_fraction: float = BUDGET_FRACTION,
        max_layouts: int = MAX_LAYOUTS,
    ):
        self.backend = backend
        self.max_engines = max_engines
        self.budget_fraction = budget_fraction
        self.max_layouts = max_layouts
        self.engines: OrderedDict[tuple, StaticEngine] = OrderedDict()
        self.layouts: OrderedDict[tuple, str | None] = OrderedDict()  # key -> None (seen) or why it was rejected
        self.checked: dict[tuple, tuple] = {}  # dense key -> key of the larger engine its reuse was checked on
        self.counters = dict.fromkeys(COUNTERS, 0)
        self.budget_bytes = 0
        self._fingerprint: tuple | None = None
        self._lock = threading.RLock()
        self._building: StaticEngine | None = None

    @property
    def rejected(self) -> dict[tuple, str]:
        """Rejected layouts still remembered: ``{key: reason}``."""
        return {k: why for k, why in self.layouts.items() if why is not None}

    # ------------------------------------------------------------------ seam API
    def run(self, host: EngineHost, call: CallInputs, *, forces: bool) -> Outputs | None:
        """Raw outputs of ``call`` (the call's flat layout) from a graph, or ``None``: use the regular path.

        ``host`` is the graph runner: its :meth:`~.host.EngineHost.regular` evaluation answers captures and
        checks, its :meth:`~.host.EngineHost.warn` reports rejections and failures. Serialised per
        calculator; a replay waits (on the device) for the previous one.
        """
        with self._lock:
            self._check_model(host.model)
            if call.pos.shape[0] == 0 or call.num_graphs == 0:
                return self._regular()
            key = self._key(host, call, forces)
            new, rejected = self._sight(key)
            if rejected:
                return self._regular()
            engine = None
            self.backend.begin(host.device)
            try:
                engine = self._lookup(key)
                if engine is not None and engine.key != key and self.checked.get(key) != engine.key:
                    return self._check_reuse(host, engine, call, key, forces)
                if engine is not None:
                    return self._replay(host, engine, call, key, forces)
                if new:
                    self.counters["first_sightings"] += 1
                    return self._regular()
                return self._build_and_admit(host, call, key, forces)
            except _Rejected:
                return self._regular()
            except Exception as exc:
                if is_fatal(exc):
                    raise
                self._failed(host, key, engine, exc)
                return None
            finally:
                self.backend.end(host.device)

    def memory_stats(self) -> dict[str, int]:
        with self._lock:
            return {
                "engines": len(self.engines),
                "graphs": sum(e.graph is not None for e in self.engines.values()),
                "graph_pool_bytes": int(self.backend.pool_bytes()),
                "static_buffer_bytes": sum(e.static_bytes for e in self.engines.values()),
                "budget_bytes": self.budget_bytes,
                **self.counters,
            }

    def clear(self) -> None:
        """Wait for enqueued replays, then release every engine, the pool and the per-layout history."""
        with self._lock:
            self.backend.synchronize()
            self._retire(count=False)
            self.layouts.clear()

    # ------------------------------------------------------------------ policy
    def _check_model(self, model: torch.nn.Module) -> None:
        fp = model_fingerprint(model)
        if self._fingerprint is not None and fp != self._fingerprint and (self.engines or self.layouts):
            self.backend.synchronize()
            self._retire(count=False)
            self.layouts.clear()
            self.counters["invalidations"] += 1
        self._fingerprint = fp

    def _regular(self) -> None:
        self.counters["regular_calls"] += 1
        return None

    def _sight(self, key: tuple) -> tuple[bool, bool]:
        """Note a sighting of ``key``: ``(new, rejected)``; only :attr:`max_layouts` keys are remembered."""
        if key in self.layouts:
            self.layouts.move_to_end(key)
            return False, self.layouts[key] is not None
        self.layouts[key] = None
        while len(self.layouts) > self.max_layouts:
            self.layouts.popitem(last=False)
        return True, False

    @staticmethod
    def _key(host: EngineHost, call: CallInputs, forces: bool) -> tuple:
        if call.cell is not None:  # fully periodic (other cells never reach the engine)
            return ("periodic", tuple(int(c) for c in call.counts.tolist()), bool(forces))
        width = call.mask.shape[1] if call.mask is not None else call.pos.shape[0]
        if call.layout in ("single", "dense") and width <= host.nb_threshold:
            rows = call.num_graphs if call.layout == "dense" else 1
            return ("dense", rows, width, bool(forces))
        return ("sparse", call.pos.shape[0], call.num_graphs, bool(forces))

    def _lookup(self, key: tuple) -> StaticEngine | None:
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

    def _replay(
        self, host: EngineHost, engine: StaticEngine, call: CallInputs, key: tuple, forces: bool
    ) -> Outputs | None:
        raw = engine.replay(call)
        count = engine.overflowed()
        if count is not None:
            self.counters["overflows"] += 1
            self._drop(engine.key)
            self.counters["rebuilds"] += 1
            return self._build_and_admit(host, call, engine.key, forces, edges=count)
        self.engines.move_to_end(engine.key)
        self.counters["replays"] += 1
        if engine.key != key:
            self.counters["padded_replays"] += 1
        return raw

    def _check_reuse(
        self, host: EngineHost, engine: StaticEngine, call: CallInputs, key: tuple, forces: bool
    ) -> Outputs:
        """First reuse of a larger dense graph for ``key``'s row count: checked once like a capture."""
        self.counters["padded_checks"] += 1
        got = engine.replay(call)
        want = host.regular(call, forces=forces)
        problem = self._compare(host, got, want, call)
        self.counters["regular_calls"] += 1
        if problem is not None:
            self._reject(host, key, f"reusing the graph of {engine.key[1]} rows: {problem}")
            return want
        self.checked[key] = engine.key
        self.engines.move_to_end(engine.key)
        return want

    @staticmethod
    def _compare(host: EngineHost, got: Outputs, want: Outputs, call: CallInputs) -> str | None:
        info = host.info
        per_atom = {"forces", "forces_uncertainty", info.atomic_energy, *info.node_outputs} - {None}
        return mismatch(convert(got, call, info), convert(want, call, info), call.counts, per_atom)

    def _build(self, host: EngineHost, call: CallInputs, key: tuple, forces: bool, edges: int | None) -> StaticEngine:
        if key[0] == "dense":
            engine: StaticEngine = DenseEngine(host, key[1], key[2], forces)
        elif key[0] == "periodic":
            grid = plan_periodic(host, call)
            self._check_search_budget(host, key, grid, call)
            if grid is None:
                capacity = neighbour_capacity(call, host.info.cutoff)
                if edges is not None:  # the naive search reports its largest neighbour count
                    capacity = max(capacity, -(-int(edges * 1.25 + 1) // 8) * 8)
                engine = PeriodicEngine(host, key[1], forces, call, capacity)
            else:
                engine = build_periodic(host, call, key[1], forces, grid)
        else:
            grid = SparseEngine.plan(host, call)
            self._check_search_budget(host, key, grid, call)
            engine = SparseEngine.for_call(host, call, forces, grid)
        self._building = engine
        engine.load(call)
        engine.capture(self.backend)
        self.counters["captures"] += 1
        return engine

    def _check_search_budget(self, host: EngineHost, key: tuple, grid: Grid | None, call: CallInputs) -> None:
        """Reject a layout whose in-graph search would not fit the budget, before allocating anything."""
        if grid is not None and grid.candidate_bytes(call.pos.shape[0]) > self.budget_bytes:
            self._reject_budget(host, key, grid.candidate_bytes(call.pos.shape[0]))
            raise _Rejected

    def retained_bytes(self, extra: StaticEngine | None = None) -> int:
        """What the cache retains: the pool's segments + the static buffers of every engine (and ``extra``)."""
        static = sum(e.static_bytes for e in self.engines.values())
        return int(self.backend.pool_bytes()) + static + (extra.static_bytes if extra is not None else 0)

    def _build_and_admit(
        self, host: EngineHost, call: CallInputs, key: tuple, forces: bool, edges: int | None = None
    ) -> Outputs | None:
        self.budget_bytes = int(self.budget_fraction * self.backend.total_memory(host.device))
        engine = self._build(host, call, key, forces, edges)
        if self.backend.pool_bytes() <= 0:
            self._building = None
            engine.release()
            self._reject(host, key, "the captured graph's memory pool reports no segments", warn=False)
            self._retire_if_needed()
            raise _Rejected
        size = self.retained_bytes(engine)
        if size > self.budget_bytes:
            self._building = None
            engine.release()
            self._reject_budget(host, key, size)
            raise _Rejected
        got = engine.replay(call)
        want = host.regular(call, forces=forces)
        problem = self._compare(host, got, want, call)
        if problem is None and engine.overflowed() is not None:
            problem = "neighbour buffer overflow during validation"
        self._building = None
        self.counters["regular_calls"] += 1
        if problem is not None:
            engine.release()
            self._reject(host, key, problem)
            return want
        while len(self.engines) >= self.max_engines:
            _, old = self.engines.popitem(last=False)
            old.release()
            self.counters["evictions"] += 1
        self.engines[key] = engine
        self.counters["admitted"] += 1
        return want

    def _reject(self, host: EngineHost, key: tuple, problem: str, *, warn: bool = True) -> None:
        self.layouts[key] = problem
        self.layouts.move_to_end(key)
        self.counters["rejected"] += 1
        if warn:
            host.warn(
                "rejected",
                f"a captured CUDA graph did not match the regular path ({problem}); that layout stays on the "
                "regular path",
            )
        self._retire_if_needed()

    def _reject_budget(self, host: EngineHost, key: tuple, size: int) -> None:
        self.layouts[key] = "budget"
        self.counters["budget_rejected"] += 1
        host.warn(
            "budget",
            f"a CUDA graph retaining {size} bytes does not fit the budget of {self.budget_bytes} bytes "
            f"({self.budget_fraction:.0%} of device memory); that layout stays on the regular path",
        )
        self._retire_if_needed()

    def _failed(self, host: EngineHost, key: tuple, engine: StaticEngine | None, exc: Exception) -> None:
        """A capture, check or replay raised: release what it touched, reject ``key``, warn once."""
        self.counters["failures"] += 1
        building, self._building = self._building, None
        if building is not None:
            building.release()
        for broken in {key, *((engine.key,) if engine is not None else ())}:
            self._drop(broken)
        self.layouts[key] = f"failed: {type(exc).__name__}: {exc}"
        host.warn(
            "failure",
            f"a CUDA-graph capture, check or replay failed ({type(exc).__name__}: {exc}); that layout "
            "uses the regular path",
            GraphFallbackWarning,
        )
        if is_out_of_memory(exc):
            self._retire()
        else:
            self._retire_if_needed()

    def _retire_if_needed(self) -> None:
        """Retire the generation when no admitted engine remains or what remains exceeds the budget."""
        if not self.engines or self.retained_bytes() > self.budget_bytes:
            if self.engines or self.backend.pool_bytes() > 0:
                self._retire()

    def _retire(self, *, count: bool = True) -> None:
        """Release every engine and the shared pool (the layout history is kept)."""
        for engine in self.engines.values():
            engine.release()
        self.engines.clear()
        self.checked.clear()
        self.backend.release_pool()
        if count:
            self.counters["retirements"] += 1

    def _drop(self, key: tuple) -> None:
        engine = self.engines.pop(key, None)
        if engine is not None:
            engine.release()
        self.checked = {k: v for k, v in self.checked.items() if v != key}

"""Intra-op threads of a training run (``Training.intra_op_threads``), measured where not given.

torch splits an op over its threads once the op is large enough, and every split wakes the
waiting threads: tens of microseconds under passive waiting, more on a shared machine. On small
graphs most ops are small, and a training step of upstream HydraGNN's unit workload (2-8 atoms,
batch 32) took 1.4-3x as long on 2 threads as on 1; on large graphs the threads pay. So by
default (``"auto"``) the run times its own steps: after a warm-up it alternates blocks of steps
at torch's thread count and at each halving of it down to 1, compares the median seconds per
graph of each count, and keeps the fastest; a count within 3 % of the fastest with fewer threads
wins the tie (threads that buy less than that only hold cores, and wait on a shared machine).
The steps measured are ordinary training steps; only their speed differs. A number fixes the
count for the run. The process's count is restored when training ends. Measured only for a
single process on CPU, eager (a GPU step barely depends on it; ranks would time each other's
waits; a compiled model's first steps are the compiler's).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from hydragnn.models.execution.process import set_intra_op_threads

from .callbacks import Callback

if TYPE_CHECKING:
    from .callbacks import LoopView

__all__ = ["ThreadTuner"]

WARMUP = 3
"""Steps at the starting count before any is timed (lazy initialisation, allocator growth)."""
BLOCK = 3
"""Consecutive steps per count and round; the first after a switch is not timed."""
ROUNDS = 2
TIE = 1.03
"""Counts whose median is within this factor of the fastest's tie; the fewest threads wins."""


class ThreadTuner(Callback):
    """Chooses and holds the intra-op thread count of one training run.

    ``setting``: ``"auto"`` or a positive count (set by :meth:`start`, which the loop calls at fit start). ``measure``: whether
    ``"auto"`` may time steps here (see the module docstring); when not, the count stays. As a
    callback: :meth:`new_epoch` before an epoch's first batch, :meth:`step_done` after each
    optimizer step, :meth:`restore` when training ends. ``clock``: seconds, monotonic.
    """

    key = "threads"

    def __init__(
        self,
        setting: int | str,
        measure: bool,
        log: Callable[[str], None],
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.original = torch.get_num_threads()
        self.log, self.clock = log, clock
        self.chosen: int | None = None
        self.schedule: list[tuple[int, bool]] = []
        if isinstance(setting, int):
            self.chosen = setting
        elif measure and self.original > 1:
            counts = [self.original]
            while counts[-1] > 1:
                counts.append(counts[-1] // 2)
            self.counts = counts
            self.samples: dict[int, list[float]] = {c: [] for c in counts}
            blocks = [(c, i > 0) for _ in range(ROUNDS) for c in counts for i in range(BLOCK)]
            self.schedule = [(self.original, False)] * WARMUP + blocks  # (count, timed) per coming step
        self._last: float | None = None
        self._running = self.original if self.chosen is None else self.chosen

    def new_epoch(self) -> None:
        """The time until the next step includes the epoch's start: it is not a step's."""
        self._last = None

    def step_done(self, graphs: int) -> None:
        """Record the step that just ended (seconds per graph at the count it ran with) and set the
        count of the next one; after the last timed step, choose."""
        if not self.schedule:
            return
        now = self.clock()
        ran, timed = self.schedule.pop(0)
        if timed and self._last is not None and graphs > 0:
            self.samples[ran].append((now - self._last) / graphs)
        if not self.schedule:
            self._choose()
            return
        nxt = self.schedule[0][0]
        if nxt != self._running:
            set_intra_op_threads(nxt)
            self._running = nxt
        self._last = self.clock()

    def _choose(self) -> None:
        median = {c: statistics.median(s) for c, s in self.samples.items() if s}
        if self.original not in median:
            best = self.original  # nothing timed at the starting count (epochs of one batch)
        else:
            fastest = min(median.values())
            best = min(c for c, t in median.items() if t <= fastest * TIE)
        self.chosen = best
        set_intra_op_threads(best)
        self._running = best
        timings = ", ".join(f"{c}: {median[c] * 1e3:.3g} ms" for c in self.counts if c in median)
        self.log(
            f"intra-op threads: {best} of {self.original} (median step time per graph by thread count: {timings}; "
            "NeuralNetwork.Training.intra_op_threads sets it)"
        )

    def restore(self) -> None:
        """Give the process its thread count back."""
        if torch.get_num_threads() != self.original:
            set_intra_op_threads(self.original)

    def start(self) -> None:
        """Set the run's first count (the fixed one, or the starting count of the measurement)."""
        if self.chosen is not None or self.schedule:
            set_intra_op_threads(self._running)

    def on_fit_start(self, loop: LoopView) -> None:
        self.start()

    def on_epoch_start(self, loop: LoopView, epoch: int) -> None:
        self.new_epoch()

    def after_step(self, loop: LoopView, graphs: int, loss: float) -> None:
        self.step_done(graphs)

    def on_fit_end(self, loop: LoopView) -> None:
        self.restore()

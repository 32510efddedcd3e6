"""Progress output on rank 0, by verbosity level.

0: silent. 1: start / end of training and the best epoch. 2: one line per epoch (losses, errors
per head in physical units, learning rate, graphs/s), and on a terminal a live bar per epoch
(tqdm: batches, ETA, running loss, graphs/s). 3: also batch progress about ten times per epoch.
4: every batch. ``HYDRAGNN_PROGRESS=bar`` or ``plain`` forces the bar on or off.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Mapping
from typing import Any


def fmt_losses(losses: Mapping[str, float]) -> str:
    return " ".join(f"{k}={v:.4g}" for k, v in losses.items())


def fmt_errors(errors: Mapping[str, Mapping[str, Any]]) -> str:
    """``energy 0.0041 eV/atom, forces 0.045 eV/Å`` (the MAE of each head, with its unit)."""
    return ", ".join(f"{name} {e['mae']:.4g}{(' ' + e['unit']) if e.get('unit') else ''}" for name, e in errors.items())


class Progress:
    """Prints to ``stream`` (stdout) on the main rank when ``verbosity >= level``."""

    def __init__(self, verbosity: int, is_main: bool = True, stream=None) -> None:
        self.verbosity = int(verbosity)
        self.is_main = is_main
        self.stream = stream or sys.stdout

    @property
    def interactive(self) -> bool:
        """Whether a live bar is drawn (a terminal, or ``HYDRAGNN_PROGRESS=bar``)."""
        forced = os.environ.get("HYDRAGNN_PROGRESS", "").lower()
        if forced in ("bar", "plain"):
            return forced == "bar"
        isatty = getattr(self.stream, "isatty", None)
        return bool(isatty and isatty())

    def log(self, level: int, message: str) -> None:
        if self.is_main and self.verbosity >= level:
            print(message, file=self.stream, flush=True)

    def bar(self, iterable: Iterable, total: int, desc: str):
        """A tqdm bar over ``iterable`` (verbosity 2-3 on a terminal), else ``None``."""
        if not (self.is_main and 2 <= self.verbosity <= 3 and self.interactive):
            return None
        from tqdm import tqdm

        return tqdm(iterable, total=total, desc=desc, unit="batch", leave=False, file=self.stream, dynamic_ncols=True)

    def batch_due(self, i: int, n: int) -> bool:
        """Whether batch ``i`` of ``n`` prints a line (level 3: about ten per epoch; level 4: all)."""
        if not self.is_main or self.verbosity < 3:
            return False
        every = 1 if self.verbosity >= 4 else max(1, n // 10)
        return (i + 1) % every == 0 or i + 1 == n

    def batch(self, epoch: int, i: int, n: int, loss: float, heads: Mapping[str, float], graphs_per_s: float) -> None:
        """Batch progress, when :meth:`batch_due` (the caller reads the values only then)."""
        if self.batch_due(i, n):
            self.log(
                3,
                f"  epoch {epoch} batch {i + 1}/{n} loss={loss:.4g} {fmt_losses(heads)} {graphs_per_s:.1f} graphs/s",
            )

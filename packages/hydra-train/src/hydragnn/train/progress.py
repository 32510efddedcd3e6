"""Progress output on rank 0, by verbosity level.

0: silent. 1: start / end of training and the best epoch. 2: one line per epoch (losses per
head, learning rate, graphs/s). 3: also batch progress about ten times per epoch. 4: every batch.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping


def fmt_losses(losses: Mapping[str, float]) -> str:
    return " ".join(f"{k}={v:.4g}" for k, v in losses.items())


class Progress:
    """Prints to stdout on the main rank when ``verbosity >= level``."""

    def __init__(self, verbosity: int, is_main: bool = True, stream=None) -> None:
        self.verbosity = int(verbosity)
        self.is_main = is_main
        self.stream = stream or sys.stdout

    def log(self, level: int, message: str) -> None:
        if self.is_main and self.verbosity >= level:
            print(message, file=self.stream, flush=True)

    def batch(self, epoch: int, i: int, n: int, loss: float, heads: Mapping[str, float], graphs_per_s: float) -> None:
        """Batch progress (level 3: about ten lines per epoch; level 4: every batch)."""
        if not self.is_main or self.verbosity < 3:
            return
        every = 1 if self.verbosity >= 4 else max(1, n // 10)
        if (i + 1) % every == 0 or i + 1 == n:
            self.log(
                3,
                f"  epoch {epoch} batch {i + 1}/{n} loss={loss:.4g} {fmt_losses(heads)} {graphs_per_s:.1f} graphs/s",
            )

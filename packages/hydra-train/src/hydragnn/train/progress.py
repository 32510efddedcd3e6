"""Progress output on rank 0, by verbosity level.

0: silent. 1: start / end of training and the best epoch. 2: one line per epoch (losses, errors
per head in physical units, learning rate, graphs/s), and on a terminal a live bar per epoch
(tqdm: batches, ETA, running loss, graphs/s). 3: also batch progress about ten times per epoch.
4: every batch. ``HYDRAGNN_PROGRESS=bar`` or ``plain`` forces the bar on or off.

Every line printed is also a record of the ``hydragnn.train`` logger (level 1 at INFO, 2-4 at
DEBUG). :func:`run_log` writes them to ``train.log`` in the run folder for the length of a run,
with the Python warnings shown meanwhile; live bars stay on the console. Importing this module
adds no handler and configures nothing.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import warnings
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tqdm import tqdm

LOGGER = logging.getLogger("hydragnn.train")
LOG_NAME = "train.log"


def fmt_losses(losses: Mapping[str, float]) -> str:
    return " ".join(f"{k}={v:.4g}" for k, v in losses.items())


def record_level(level: int) -> int:
    """The logging level of a line of verbosity ``level``: 1 is INFO, 2-4 DEBUG (0 and below WARNING)."""
    return logging.WARNING if level <= 0 else logging.INFO if level == 1 else logging.DEBUG


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
            LOGGER.log(record_level(level), message)

    def bar(self, iterable: Iterable, total: int, desc: str) -> tqdm[Any] | None:
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


@contextlib.contextmanager
def run_log(
    run_dir: str | os.PathLike, verbosity: int, *, is_main: bool = True, append: bool = False
) -> Iterator[None]:
    """Write the run's records to ``<run_dir>/train.log`` while the block runs (rank 0 only).

    Attaches a file handler to the ``hydragnn`` logger at the level of ``verbosity`` (see
    :func:`record_level`), lowers that logger's level to it if needed, logs the warnings
    Python shows meanwhile (they still reach the console as before) and an exception that ends
    the block; everything is restored on exit. ``append`` continues the file (a resumed run).
    """
    if not is_main:
        yield
        return
    level = record_level(verbosity)
    handler = logging.FileHandler(Path(run_dir) / LOG_NAME, mode="a" if append else "w", encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    handler.setLevel(level)
    top = logging.getLogger("hydragnn")
    saved_level = top.level
    top.addHandler(handler)
    top.setLevel(min(level, top.getEffectiveLevel()))
    shown = warnings.showwarning

    def showwarning(message, category, filename, lineno, file=None, line=None):
        shown(message, category, filename, lineno, file, line)
        LOGGER.warning("%s", warnings.formatwarning(message, category, filename, lineno, line).rstrip())

    warnings.showwarning = showwarning
    try:
        yield
    except BaseException as exc:
        LOGGER.error("stopped by %s: %s", type(exc).__name__, exc)
        raise
    finally:
        if warnings.showwarning is showwarning:
            warnings.showwarning = shown
        top.setLevel(saved_level)
        top.removeHandler(handler)
        handler.close()

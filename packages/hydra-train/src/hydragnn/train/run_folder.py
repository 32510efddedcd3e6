"""The run folder: never overwritten silently, checked writable before any work, and the
fingerprint of what a checkpoint means so that ``--resume`` refuses a config that changed it.

A folder that holds a run (``model.hydra``, ``metrics.json`` or ``checkpoint.pt``: something a
run produced that would be lost) is reused only with ``resume`` (continue it) or ``overwrite``
(its run files are removed first: only the files a run writes, never anything else in the
folder). A run that failed before its first checkpoint leaves at most ``config.json`` and
``train.log``, which the next run replaces.

The fingerprint is the completed config flattened to JSON paths, without the keys that do not
change what the trained weights mean (:data:`FREE_KEYS`: verbosity, the epoch count, the time
budget, early stopping, checkpointing, the collective timeout, the device, the execution profile and
thread count (speed, not answers), the dataset's name and cache location, a published data set's URL and pinned checksum), plus the digests of the converted data
files (a published data set's: its archive's). A resumed run compares it with the one
stored in the checkpoint and names every path that differs.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .errors import CheckpointError, ConfigError

__all__ = ["FREE_KEYS", "RUN_FILES", "check_fingerprint", "fingerprint", "prepare_run_folder"]

RUN_FILES = ("model.hydra", "metrics.json", "checkpoint.pt", "config.json", "test_set.pkl", "train.log")
"""Files a run writes (besides ``parity_*.png`` and ``tensorboard/``)."""
FREE_KEYS = (
    "Verbosity",
    "Dataset.name",
    "Dataset.cache_dir",
    "Dataset.url",
    "Dataset.sha256",
    "NeuralNetwork.Training.num_epoch",
    "NeuralNetwork.Training.max_time_s",
    "NeuralNetwork.Training.max_skipped_fraction",
    "NeuralNetwork.Training.EarlyStopping",
    "NeuralNetwork.Training.Checkpoint",
    "NeuralNetwork.Training.Parallelism.timeout_s",
    "NeuralNetwork.Training.device",
    "NeuralNetwork.Training.execution",
    "NeuralNetwork.Training.intra_op_threads",
)
"""JSON paths (and their sub-keys) that may change between a run and its ``--resume``."""


def _describe(folder: Path) -> str | None:
    present = [name for name in RUN_FILES if (folder / name).exists()]
    if not set(present) & {"model.hydra", "metrics.json", "checkpoint.pt"}:
        return None
    kind = "a finished run" if (folder / "model.hydra").exists() else "an interrupted run"
    return f"{kind} ({', '.join(present)})"


def prepare_run_folder(folder: Path, *, resume: bool, overwrite: bool, modify: bool = True) -> None:
    """Check that ``folder`` may hold this run and is writable (before any training work).

    Every rank calls it (so all raise alike); only the one with ``modify`` removes old run files.

    Raises:
        ConfigError: ``resume`` and ``overwrite`` together, a folder holding a run without
            either, ``resume`` without a checkpoint, or a folder that cannot be written.
    """
    if resume and overwrite:
        raise ConfigError("--resume continues the run in the folder, --overwrite replaces it: give one")
    held = _describe(folder) if folder.is_dir() else None
    if resume:
        if not (folder / "checkpoint.pt").is_file():
            raise ConfigError(f"{folder}: nothing to resume (no checkpoint.pt)")
    elif held is not None:
        if not overwrite:
            raise ConfigError(
                f"{folder}: holds {held}; pass --overwrite to replace it, --resume to continue it, "
                "or choose another --run-dir"
            )
        if modify:
            for name in RUN_FILES:
                (folder / name).unlink(missing_ok=True)
            for plot in folder.glob("parity_*.png"):
                plot.unlink(missing_ok=True)
            shutil.rmtree(folder / "tensorboard", ignore_errors=True)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / f".write-probe-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise ConfigError(f"{folder}: the run folder cannot be written ({exc.strerror or exc})") from None


def _flatten(value: Any, prefix: str, out: dict[str, Any]) -> None:
    if isinstance(value, Mapping) and value:
        for key, item in value.items():
            _flatten(item, f"{prefix}.{key}" if prefix else str(key), out)
    else:
        out[prefix] = value


def fingerprint(config: Mapping[str, Any], data_files: Sequence[Mapping[str, Any]] = ()) -> dict[str, Any]:
    """``{JSON path: value}`` of what a checkpoint means (see the module docstring)."""
    flat: dict[str, Any] = {}
    _flatten(config, "", flat)
    kept = {
        path: value
        for path, value in flat.items()
        if not any(path == free or path.startswith(free + ".") for free in FREE_KEYS)
    }
    for i, f in enumerate(data_files):  # the file's content (the cache entry's name also encodes
        # whether the schema was given or inferred, which the config's Variables already say)
        kept[f"data[{i}] {Path(str(f.get('path'))).name}"] = f.get("sha256") or Path(str(f.get("entry"))).name
    return kept


def check_fingerprint(stored: Mapping[str, Any] | None, current: Mapping[str, Any], where: str) -> None:
    """Refuse to resume when what the checkpoint means changed.

    Raises:
        CheckpointError: naming every JSON path whose value differs (stored -> now).
    """
    if stored is None:
        return
    keys = sorted(set(stored) | set(current))
    diffs = [
        f"{k}: {stored.get(k, '<absent>')!r} -> {current.get(k, '<absent>')!r}"
        for k in keys
        if stored.get(k) != current.get(k)
    ]
    if diffs:
        shown = "; ".join(diffs[:12]) + (f"; ... ({len(diffs) - 12} more)" if len(diffs) > 12 else "")
        raise CheckpointError(
            f"{where}: the config changed what the checkpoint means, so it cannot be resumed: {shown}. "
            "Undo these changes, or start afresh with --overwrite or another --run-dir"
        )

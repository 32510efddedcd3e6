"""The run folder: never overwritten silently, checked writable before any work, and the
fingerprint of what a checkpoint means so that ``--resume`` refuses a config that changed it.

A folder that holds a run (``model.hydra``, ``metrics.json`` or ``checkpoint.pt``: something a
run produced that would be lost) is reused only with ``resume`` (continue it) or ``overwrite``
(its run files are removed first: only the files a run writes, never anything else in the
folder). A run that failed before its first checkpoint leaves at most ``config.json`` and
``train.log``, which the next run replaces.

While a run works in the folder it holds ``run.lock`` (:class:`RunLock`: created with
``O_EXCL``, atomic on local and NFS file systems, holding the host, process id, process start
time and command). A second run into the folder, a second ``--resume`` of it, or an
``--overwrite`` of it is refused while the lock is held, naming the holder. A lock left by a
killed run is detected (same host, and that process is gone or is another process under a
reused id), named in the log and taken over; a lock from another host cannot be checked from
here, so it is refused with the command that removes it.

The fingerprint is the completed config flattened to JSON paths, without the keys that do not
change what the trained weights mean (:data:`FREE_KEYS`: verbosity, the epoch count, the time
budget, early stopping, checkpointing, the collective timeout, the device, the execution profile and
thread count (speed, not answers), the dataset's name and cache location, a published data set's URL and pinned checksum), plus the digests of the converted data
files (a published data set's: its archive's). A resumed run compares it with the one
stored in the checkpoint and names every path that differs.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .errors import CheckpointError, ConfigError

__all__ = ["FREE_KEYS", "LOCK_NAME", "RUN_FILES", "RunLock", "check_fingerprint", "fingerprint", "prepare_run_folder"]

LOCK_NAME = "run.lock"
"""The lock file a run holds in its folder while it works."""

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


def prepare_run_folder(folder: Path, *, resume: bool, overwrite: bool, modify: bool = True) -> RunLock | None:
    """Check that ``folder`` may hold this run and is writable, and take its lock (before any training work).

    Every rank calls it (so all raise alike on the folder's files); only the one with ``modify``
    takes the lock and removes old run files.

    Returns:
        The :class:`RunLock` (``modify``), to release when the run ends; ``None`` on other ranks.

    Raises:
        ConfigError: ``resume`` and ``overwrite`` together, a folder holding a run without
            either, ``resume`` without a checkpoint, a folder that cannot be written, or one
            that another live run is using.
    """
    if resume and overwrite:
        raise ConfigError("--resume continues the run in the folder, --overwrite replaces it: give one")
    if resume and not (folder / "checkpoint.pt").is_file():
        raise ConfigError(f"{folder}: nothing to resume (no checkpoint.pt)")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / f".write-probe-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise ConfigError(f"{folder}: the run folder cannot be written ({exc.strerror or exc})") from None
    lock = RunLock(folder) if modify else None
    try:
        held = _describe(folder)
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
    except BaseException:
        if lock is not None:
            lock.release()
        raise
    return lock


def _start_time(pid: int) -> str | None:
    """The start time of process ``pid`` (``/proc/<pid>/stat`` field 22, clock ticks since boot), or
    ``None`` where it cannot be read (no such process, no ``/proc``)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat[stat.rfind(")") + 2 :].split()[19]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


class RunLock:
    """The lock a run holds on its folder (see the module docstring); release it with :meth:`release`
    (or use it as a context manager). ``taken_over``: the stale holder it replaced, described, or ``None``."""

    def __init__(self, folder: Path) -> None:
        self.path = Path(folder) / LOCK_NAME
        self.taken_over: str | None = None
        self.holder = {
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "start": _start_time(os.getpid()),
            "started_at": time.strftime("%Y-%m-%d %H:%M:%S"),
            "command": " ".join(sys.argv)[:500],
        }
        for _ in range(3):  # a stale lock is removed, then created again (another run may win the race)
            try:
                fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            except FileExistsError:
                self._check_stale()
                continue
            except OSError as exc:
                raise ConfigError(f"{folder}: the run folder cannot be written ({exc.strerror or exc})") from None
            with os.fdopen(fd, "w") as f:
                json.dump(self.holder, f)
            return
        raise ConfigError(f"{folder}: could not take {LOCK_NAME}: another run keeps taking it")

    def _check_stale(self) -> None:
        """Remove a lock whose holder is gone (same host); else raise naming the holder."""
        try:
            holder = json.loads(self.path.read_text())
            if not isinstance(holder, dict):
                raise ValueError("not an object")
        except FileNotFoundError:
            return  # released meanwhile
        except (OSError, ValueError):
            holder = {}
        described = (
            f"pid {holder.get('pid')} on host {holder.get('host')}, started {holder.get('started_at')}: "
            f"{holder.get('command')!r}"
            if holder
            else "an unreadable lock file"
        )
        pid = holder.get("pid")
        same_host = holder.get("host") == self.holder["host"]
        if same_host and isinstance(pid, int) and (not _alive(pid) or _start_time(pid) != holder.get("start")):
            self.path.unlink(missing_ok=True)
            self.taken_over = f"a stale {LOCK_NAME} of a run that was killed ({described}) was removed"
            return
        where = self.path.parent
        remote = "" if same_host else f" (a run on another host: if it is gone, remove the lock: rm {self.path})"
        raise ConfigError(
            f"{where}: another run is using this folder ({described}){remote}; wait for it to finish, or choose "
            "another --run-dir"
        )

    def release(self) -> None:
        """Remove the lock if it is still this process's."""
        try:
            if json.loads(self.path.read_text()).get("pid") == self.holder["pid"]:
                self.path.unlink()
        except (OSError, ValueError, AttributeError):
            pass

    def __enter__(self) -> RunLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


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

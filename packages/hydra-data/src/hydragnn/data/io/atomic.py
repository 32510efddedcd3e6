"""Atomic file writes shared by every layer: the target is either the old file or the complete new one.

:func:`atomic_write` writes to a temporary file beside the target (``.<name>.<pid>.<random>.tmp``),
``fsync``\\ s it, gives it the permissions a plain ``open()`` would (``0o666`` minus the umask:
``mkstemp`` alone makes ``0o600`` files that collaborators cannot read), and renames it onto the
target. A write that raises removes its temporary file; a writer killed outright (``kill -9``,
power loss) leaves one behind, which the next write to the same target removes once the process
that made it is gone.
"""

from __future__ import annotations

import os
import re
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

_UMASK_LOCK = threading.Lock()


def current_umask() -> int:
    """The process umask, read without changing it where ``/proc`` allows (else set and restored under a lock)."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except OSError:
        pass
    with _UMASK_LOCK:
        mask = os.umask(0o022)
        os.umask(mask)
    return mask


def _pid_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's live process
        return True
    return True


def remove_stale_temporaries(path: Path) -> list[Path]:
    """Remove ``.<name>.<pid>.*.tmp`` files beside ``path`` left by writers that no longer run."""
    pattern = re.compile(rf"^\.{re.escape(path.name)}\.(\d+)\..*\.tmp$")
    removed = []
    try:
        entries = list(path.parent.iterdir())
    except OSError:
        return removed
    for entry in entries:
        match = pattern.match(entry.name)
        if match and not _pid_alive(int(match.group(1))):
            try:
                entry.unlink()
                removed.append(entry)
            except OSError:
                pass
    return removed


def atomic_write(
    path: str | os.PathLike, content: bytes | Callable[[BinaryIO], None], *, mode: int | None = None
) -> Path:
    """Write ``content`` (bytes, or a function writing to a binary file object) to ``path`` atomically.

    Args:
        path: the target; its folder is created if missing.
        content: the bytes, or ``write(fh)``.
        mode: permission bits (default ``0o666`` minus the umask, as ``open()`` would create).

    Returns:
        ``path`` as a :class:`~pathlib.Path`.

    Raises:
        OSError: the folder is not writable, the disk is full, ...; ``path`` is left as it was.
        Whatever ``content`` raises, likewise.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.{os.getpid()}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            if callable(content):
                content(fh)
            else:
                fh.write(content)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, (0o666 & ~current_umask()) if mode is None else mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def destination_problem(path: str | os.PathLike) -> str | None:
    """Why a file cannot be written at ``path`` (checked before the work that produces it), or
    ``None``: a folder there, or a folder that cannot be created or written. A missing folder is
    created, as :func:`atomic_write` would. A full disk or a file-size limit shows only when
    writing: :func:`atomic_write` then raises ``OSError`` and leaves nothing behind."""
    path = Path(path)
    if path.is_dir():
        return "is a folder: name the file to write in it"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        return f"its folder {path.parent} cannot be created ({exc.strerror or exc})"
    if not os.access(path.parent, os.W_OK | os.X_OK):
        return f"its folder {path.parent} is not writable"
    if path.exists() and not os.access(path, os.W_OK) and not os.access(path.parent, os.W_OK):
        return "exists and cannot be replaced"
    return None

"""One transfer of :mod:`.download`: a size cap and a wall-clock deadline, streaming into a
partial file that is never written through a planted link, and HTTP ``Content-Range`` parsing.

A socket's reads return what has arrived (``read1``) and never wait past the deadline, so a
server that drips a byte at a time, or stops, is cut at ``deadline_s``.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

from ..errors import DownloadError

__all__ = ["Limits", "ProgressCallback", "RangeMismatch", "content_range", "copy_stream", "open_part"]

ProgressCallback = Callable[[int, "int | None"], None]
"""``progress(bytes_done, total)``; ``total`` is ``None`` when the size is unknown."""

_CHUNK = 1 << 20


class Limits:
    """Size cap and wall-clock deadline of one fetch."""

    def __init__(self, where: str, max_bytes: int, deadline_s: float) -> None:
        self.where, self.max_bytes = where, max_bytes
        self.deadline_s, self.end = deadline_s, time.monotonic() + deadline_s

    def check_size(self, size: int, part: Path) -> None:
        if size > self.max_bytes:
            part.unlink(missing_ok=True)
            raise DownloadError(
                f"{self.where}: the content is {size} bytes, more than max_bytes={self.max_bytes}; the partial file "
                "was deleted"
            )

    def remaining(self) -> float:
        """Seconds left before the deadline (a socket read never waits longer; at least 1 ms)."""
        return max(self.end - time.monotonic(), 0.001)

    def check_time(self, part: Path) -> None:
        if time.monotonic() > self.end:
            raise DownloadError(
                f"{self.where}: the transfer took longer than deadline_s={self.deadline_s:g} s; the partial file "
                f"{part} is kept, run again to resume"
            )


def copy_stream(
    src: BinaryIO,
    dst: BinaryIO,
    done: int,
    total: int | None,
    progress: ProgressCallback | None,
    limits: Limits,
    part: Path,
) -> int:
    """Stream ``src`` into ``dst``; returns the byte count including the ``done`` already there.

    A socket's reads return what has arrived (``read1``) and never wait past the deadline, so a
    server that drips a byte at a time, or stops, is cut at ``deadline_s``, not later."""
    read = getattr(src, "read1", src.read)
    while True:
        _socket_timeout(src, limits.remaining())
        try:
            chunk = read(_CHUNK)
        except TimeoutError:
            limits.check_time(part)
            raise
        if not chunk:
            break
        dst.write(chunk)
        done += len(chunk)
        if progress is not None:
            progress(done, total)
        if done > limits.max_bytes:
            dst.close()
            limits.check_size(done, part)
        limits.check_time(part)
    return done


def _socket_timeout(src: Any, seconds: float) -> None:
    """Bound the next read of an HTTP response's socket (no-op for anything else)."""
    sock = getattr(getattr(getattr(src, "fp", None), "raw", None), "_sock", None)
    if sock is not None:
        sock.settimeout(seconds)


def open_part(part: Path, append: bool) -> BinaryIO:
    """Open the partial file for writing without following a symbolic link planted in its place."""
    if part.is_symlink():
        part.unlink()
    flags = os.O_WRONLY | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | (os.O_APPEND if append else os.O_TRUNC)
    return os.fdopen(os.open(part, flags, 0o666), "ab" if append else "wb")


def content_range(header: str | None) -> tuple[int, int | None] | None:
    """``(start, total)`` from ``Content-Range: bytes start-end/total``."""
    m = re.match(r"^\s*bytes\s+(\d+)-(\d+)/(\d+|\*)\s*$", header or "")
    if not m:
        return None
    return int(m.group(1)), None if m.group(3) == "*" else int(m.group(3))


class RangeMismatch(Exception):
    """Internal: a resumed request got another byte range than the one asked for."""

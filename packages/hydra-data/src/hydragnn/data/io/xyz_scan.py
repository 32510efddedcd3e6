"""A check of the frame sizes an (ext)xyz file declares, run before ASE reads the file.

ASE reads one line per atom that a frame's count line announces, so a 50-byte file declaring
2,000,000,000 atoms keeps it busy for hours. :func:`scan_xyz` walks the frames the way ASE's
extxyz reader indexes them (a count line, a comment line, the atom lines, up to three ``VEC``
lines; a blank count line ends the file) without parsing atoms: line ends are found by numpy
in chunks, so the walk costs a few percent of a conversion. It refuses a count that is
negative, one whose atom lines need more bytes than the file has left (every atom line has at
least :data:`MIN_ATOM_LINE_BYTES`), and one that runs past the file's last line, and names the
frame of a line that is no count at all (ASE's message would say frame 0).
Keys repeated in a comment line (ASE keeps the last value without a word) are reported once per
file and key.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import IO

import numpy as np

from ..errors import ContainerError, DuplicateKeyWarning, clip

__all__ = ["MIN_ATOM_LINE_BYTES", "scan_xyz"]

MIN_ATOM_LINE_BYTES = 2
"""Fewest bytes of one atom line: one character and a line end (a bound true of every reader)."""
MAX_HEADER_LINE = 64 << 20
"""Longest count or comment line accepted (64 MiB): a longer one is a damaged file."""
CHUNK = 8 << 20
_QUOTED = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"?|\'[^\'\\]*(?:\\.[^\'\\]*)*\'?|\{[^}]*\}?|\[[^\]]*\]?|\\.')
_KEY = re.compile(r"(?<![^\s])([^\s=]+)\s*=")  # a token that starts after a space (linear time)


class _TooLong(Exception):
    """A count or comment line longer than :data:`MAX_HEADER_LINE`."""


class _Lines:
    """The lines of a binary stream, read in chunks; line ends located by numpy.

    Invariant: ``ends[i:]`` are the unread line ends of ``buf``, the unread text starts at
    ``buf[start]``, and ``buf[0]`` is byte ``base`` of the stream.
    """

    def __init__(self, stream: IO[bytes], newline: int) -> None:
        self.stream, self.newline = stream, newline
        self.buf, self.base, self.start, self.i = b"", 0, 0, 0
        self.ends = np.empty(0, dtype=np.int64)

    @property
    def offset(self) -> int:
        """Byte offset of the next unread line."""
        return self.base + self.start

    def _more(self, keep: bool) -> bool:
        """Read the next chunk (keeping the unfinished line's text when ``keep``); False at the end."""
        data = self.stream.read(CHUNK)
        if not data:
            return False
        tail = self.buf[self.start :] if keep else b""
        self.base += self.start if keep else len(self.buf)
        self.buf, self.start, self.i = tail + data, 0, 0
        self.ends = np.flatnonzero(np.frombuffer(data, dtype=np.uint8) == self.newline) + len(tail)
        return True

    def line(self) -> bytes | None:
        """The next line without its end, or ``None`` at the end of the stream."""
        while self.i >= len(self.ends):
            if len(self.buf) - self.start > MAX_HEADER_LINE:
                raise _TooLong
            if not self._more(keep=True):
                rest, self.start = self.buf[self.start :], len(self.buf)
                return rest or None
        end = int(self.ends[self.i])
        out, self.i, self.start = self.buf[self.start : end], self.i + 1, end + 1
        return out

    def skip(self, n: int) -> int:
        """Move past ``n`` lines; the number passed (fewer at the end of the stream)."""
        done = 0
        while True:
            available = len(self.ends) - self.i
            if available >= n - done:
                if n > done:
                    self.i += n - done
                    self.start = int(self.ends[self.i - 1]) + 1
                return n
            done += available
            if available:
                self.i, self.start = len(self.ends), int(self.ends[-1]) + 1
            if not self._more(keep=False):
                if self.start < len(self.buf):  # a last line without a line end
                    done, self.start = done + 1, len(self.buf)
                return done


def comment_keys(comment: str) -> list[str]:
    """The keys of an extxyz comment line's ``key=value`` pairs, in order, repeats kept
    (quoted and bracketed values removed first, as ASE's parser reads them)."""
    return _KEY.findall(_QUOTED.sub(" ", comment))


def scan_xyz(
    path: Path,
    *,
    last_frame: int | None = None,
    opener: Callable[[Path], IO[bytes]] | None = None,
    size: int | None = None,
) -> int:
    """Check every frame's declared atom count against what ``path`` holds.

    Args:
        path: an extxyz or xyz file.
        last_frame: stop after this frame (ASE indexes no further for such a selection).
        opener: opens the file as bytes (default ``open(path, "rb")``; a decompressing one for
            compressed files).
        size: the bytes the opened stream holds; ``None`` (compressed files) skips the byte bound
            and leaves the line count to find a count beyond the file.

    Returns:
        The number of frames scanned.

    Raises:
        ContainerError: a count line that is no integer, a negative count, or one that needs more
            bytes than remain or more lines than the file has, naming the file, the frame and both
            numbers.
    """
    stream = opener(path) if opener is not None else open(path, "rb")
    repeated: dict[str, list[int]] = {}  # key -> [first frame, frames repeating it, most occurrences]
    with stream:
        head = stream.read(1 << 16)
        newline = 13 if b"\r" in head and b"\n" not in head else 10  # old Mac line ends
        stream.seek(0)
        try:
            frames = _walk(path, _Lines(stream, newline), last_frame, size, repeated)
        except _TooLong:
            raise ContainerError(f"{path}: a count or comment line longer than {MAX_HEADER_LINE >> 20} MiB") from None
    for key, (first, count, most) in sorted(repeated.items()):
        warnings.warn(
            f"{path}: frame {first}: key {clip(key)!r} appears {most} times in the comment line; ASE keeps the "
            f"last value ({count} frame{'s' if count != 1 else ''} of this file repeat it)",
            DuplicateKeyWarning,
            stacklevel=3,
        )
    return frames


def _walk(path: Path, lines: _Lines, last_frame: int | None, size: int | None, repeated: dict[str, list[int]]) -> int:
    """Walk the frames of ``lines`` as :func:`scan_xyz` describes; the number of frames walked."""
    frame = 0
    header = lines.line()
    while header is not None and (last_frame is None or frame <= last_frame):
        where = f"{path}: frame {frame}"
        text = header.decode("utf-8", "replace")
        if text.strip() == "":
            break  # where ASE's extxyz reader stops too
        try:
            count = int(text)
        except ValueError:
            raise ContainerError(
                f"{where}: ASE cannot read it (expected the count line of a frame, found {clip(text.strip())!r})"
            ) from None
        if count < 0:
            raise ContainerError(f"{where}: declares {count} atoms; a count must be >= 0")
        comment = lines.line()
        if comment is None:
            raise ContainerError(f"{where}: declares {count} atoms but the file ends before its comment line")
        left = None if size is None else size - lines.offset
        if left is not None and count * MIN_ATOM_LINE_BYTES > left:
            raise ContainerError(
                f"{where}: declares {count} atoms, which need at least {count * MIN_ATOM_LINE_BYTES} bytes "
                f"({MIN_ATOM_LINE_BYTES} per atom line); the file has {left} bytes left"
            )
        keys = comment_keys(comment.decode("utf-8", "replace"))
        if len(keys) != len(set(keys)):
            for key in {k for k in keys if keys.count(k) > 1}:
                seen = repeated.setdefault(key, [frame, 0, 0])
                seen[1], seen[2] = seen[1] + 1, max(seen[2], keys.count(key))
        got = lines.skip(count)
        if got < count:
            raise ContainerError(
                f"{where}: declares {count} atoms; the file holds {got} more line{'s' if got != 1 else ''}"
            )
        header = lines.line()
        vec = 0
        while header is not None and header.lstrip().startswith(b"VEC") and vec < 3:
            vec, header = vec + 1, lines.line()
        frame += 1
    return frame

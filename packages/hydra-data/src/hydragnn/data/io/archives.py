"""Read the files of a tar or zip archive, or of a folder, without extracting anything.

:func:`iter_files` yields ``(name, bytes)`` for every regular file, in the archive's order (a
folder's files sorted by path). Nothing from an archive is written to disk and nothing in it is
executed: callers parse the bytes as text. The standard library reads the archives (``tarfile``:
plain, gzip, bzip2 and xz tars, streamed; ``zipfile``), recognised by their content, not their
file name. A compressed tar is decompressed by ``gzip`` / ``bz2`` / ``lzma`` and read to the end
of the stream, so its checksums are checked (``tarfile``'s own stream reader skips gzip's CRC:
a flipped bit would read as other numbers); zip members are checked against their CRC-32. A
plain tar has no checksum over the content.

Members are checked as an extracting tool would have to: a name that is absolute, climbs out of
the archive (``..``), carries a drive or a NUL, a link (symbolic or hard), a device or a FIFO, an
encrypted zip member, a member larger than :attr:`Limits.max_member_bytes`, more than
:attr:`Limits.max_members` members or more than :attr:`Limits.max_total_bytes` in all raise
:class:`~hydragnn.data.errors.ArchiveError` naming the archive and the member. Folders are
skipped, and so are names that are hidden (a component starting with ``.``) or macOS resource
forks (``__MACOSX/``).

Every decompressed byte of a tar counts, not only the members returned: a skipped (hidden)
member's data and whatever follows the tar's end are read through the same counter, and the
whole is bounded by :attr:`Limits.max_total_bytes` and by :attr:`Limits.max_ratio` times the
archive's size (a compression bomb stops within a second, naming the member or "after the
archive's end"). A zip's members are read on demand, each counted the same way.
"""

from __future__ import annotations

import bz2
import gzip
import lzma
import os
import stat
import tarfile
import zipfile
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import IO, cast

from ..errors import ArchiveError

__all__ = ["DEFAULT_LIMITS", "Limits", "archive_kind", "iter_files"]


@dataclass(frozen=True)
class Limits:
    """Bounds of one read.

    Attributes:
        max_members: most members (files, folders, anything) an archive may list.
        max_member_bytes: largest file, uncompressed.
        max_total_bytes: most bytes, uncompressed, over all files (for a tar, every byte it
            decompresses to: headers, skipped members and what follows its end included).
        max_ratio: most bytes an archive may decompress to per byte of its file (beyond
            :data:`RATIO_FLOOR`): text compresses 5-20 times, a compression bomb a million.
    """

    max_members: int = 10_000_000
    max_member_bytes: int = 64 << 20
    max_total_bytes: int = 256 << 30
    max_ratio: float = 1000.0


RATIO_FLOOR = 64 << 20
"""Bytes any archive may decompress to whatever its ratio."""


DEFAULT_LIMITS = Limits()
"""The bounds used unless a caller gives others."""

_COMPRESSED = ((b"\x1f\x8b", gzip.open), (b"BZh", bz2.open), (b"\xfd7zXZ\x00", lzma.open))
"""Magic bytes and openers of the compressions a tar may have: each checks its own CRCs."""


def archive_kind(path: str | os.PathLike[str]) -> str | None:
    """``"dir"``, ``"tar"`` or ``"zip"`` by content (``None`` for anything else or a missing path)."""
    path = Path(path)
    if path.is_dir():
        return "dir"
    if not path.is_file():
        return None
    if zipfile.is_zipfile(path):
        return "zip"
    with open(path, "rb") as fh:
        magic = fh.read(6)
    if any(magic.startswith(m) for m, _ in _COMPRESSED):
        return "tar"  # a compressed stream: read as a tar, and a damaged one says so
    try:
        return "tar" if tarfile.is_tarfile(path) else None
    except (OSError, EOFError, zlib.error, tarfile.TarError):
        return None


def _skipped(name: str) -> bool:
    parts = PurePosixPath(name).parts
    return any(p.startswith(".") for p in parts) or (bool(parts) and parts[0] == "__MACOSX")


def _checked_name(archive: Path, name: str) -> str:
    """The member name, refused when extracting it could land outside the archive's folder."""
    bad = (
        not name
        or "\0" in name
        or name.startswith(("/", "\\"))
        or (len(name) > 1 and name[1] == ":")
        or ".." in PurePosixPath(name.replace("\\", "/")).parts
    )
    if bad:
        raise ArchiveError(
            f"{archive}: member {name!r}: a path outside the archive's folder (absolute, '..' or a drive)"
        )
    return name


class _Budget:
    """Counts members and bytes against the limits."""

    def __init__(self, archive: Path, limits: Limits) -> None:
        self.archive, self.limits, self.members, self.total = archive, limits, 0, 0
        self.max_total = limits.max_total_bytes
        if archive.is_file():  # an archive: also bounded by its size
            self.max_total = min(self.max_total, max(int(limits.max_ratio * archive.stat().st_size), RATIO_FLOOR))
        self.at = "the start"

    def add(self, nbytes: int) -> None:
        """Count ``nbytes`` decompressed bytes (refused beyond the bounds)."""
        self.total += nbytes
        if self.total > self.max_total:
            if self.max_total < self.limits.max_total_bytes:
                raise ArchiveError(
                    f"{self.archive}: decompresses to more than {self.max_total} bytes (max_ratio="
                    f"{self.limits.max_ratio:g} times its {self.archive.stat().st_size} bytes), at {self.at}: "
                    "a compression bomb? refused"
                )
            raise ArchiveError(
                f"{self.archive}: more than max_total_bytes={self.limits.max_total_bytes} uncompressed, at {self.at}"
            )

    def member(self, name: str) -> None:
        self.members += 1
        if self.members > self.limits.max_members:
            raise ArchiveError(f"{self.archive}: more than max_members={self.limits.max_members} members (at {name!r})")

    def read(self, name: str, declared: int, read: Callable[[int], bytes], *, counted: bool = False) -> bytes:
        """A member's bytes, bounded by ``max_member_bytes``; ``counted``: its bytes were already
        counted by the stream they came from (a tar's :class:`_Counted`)."""
        if declared > self.limits.max_member_bytes:
            raise ArchiveError(
                f"{self.archive}: member {name!r}: {declared} bytes, more than max_member_bytes={self.limits.max_member_bytes}"
            )
        data = read(self.limits.max_member_bytes + 1)
        if len(data) > self.limits.max_member_bytes:
            raise ArchiveError(
                f"{self.archive}: member {name!r}: more than max_member_bytes={self.limits.max_member_bytes}"
            )
        if not counted:
            self.at = f"member {name!r}"
            self.add(len(data))
        return data


class _Counted:
    """A decompressed stream whose every byte read is counted by a :class:`_Budget`."""

    def __init__(self, raw: IO[bytes], budget: _Budget) -> None:
        self.raw, self.budget = raw, budget

    def read(self, size: int = -1) -> bytes:
        if size is None or size < 0:  # to the end, block by block: each block counted before the next
            return b"".join(iter(lambda: self.read(1 << 20), b""))
        data = self.raw.read(size)
        self.budget.add(len(data))
        return data


def _tar_files(path: Path, budget: _Budget) -> Iterator[tuple[str, bytes]]:
    with open(path, "rb") as fh:
        magic = fh.read(6)
    opener = next((op for m, op in _COMPRESSED if magic.startswith(m)), None)
    with (opener or open)(path, "rb") as raw:
        counted = _Counted(cast(IO[bytes], raw), budget)
        with tarfile.open(fileobj=cast(IO[bytes], counted), mode="r|") as tar:  # streamed
            yield from _tar_members(path, tar, budget)
            budget.at = "after the archive's end"
            while counted.read(1 << 20):  # to the end: the decompressor checks the stream's CRC and length there
                pass


def _tar_members(path: Path, tar: tarfile.TarFile, budget: _Budget) -> Iterator[tuple[str, bytes]]:
    for member in tar:  # (reading the next header skips the previous member's data, counted)
        budget.member(member.name)
        budget.at = f"member {member.name!r}"
        name = _checked_name(path, member.name)
        if member.issym() or member.islnk():
            raise ArchiveError(
                f"{path}: member {name!r}: a link ({'symbolic' if member.issym() else 'hard'}); links are refused"
            )
        if member.isdir() or _skipped(name):
            continue
        if not member.isfile():
            raise ArchiveError(f"{path}: member {name!r}: not a regular file (a device, FIFO or other special member)")
        fh = cast(IO[bytes], tar.extractfile(member))  # a regular file: never None
        yield name, budget.read(name, member.size, fh.read, counted=True)


def _zip_files(path: Path, budget: _Budget) -> Iterator[tuple[str, bytes]]:
    with zipfile.ZipFile(path) as archive:
        for info in archive.infolist():
            budget.member(info.filename)
            name = _checked_name(path, info.filename)
            mode = info.external_attr >> 16
            if stat.S_ISLNK(mode):
                raise ArchiveError(f"{path}: member {name!r}: a symbolic link; links are refused")
            if info.is_dir() or _skipped(name):
                continue
            if info.flag_bits & 0x1:
                raise ArchiveError(f"{path}: member {name!r}: encrypted; only plain zip members are read")
            with archive.open(info) as fh:
                yield name, budget.read(name, info.file_size, fh.read)


def _dir_files(path: Path, budget: _Budget) -> Iterator[tuple[str, bytes]]:
    for file in sorted(p for p in path.rglob("*") if p.is_file()):
        name = file.relative_to(path).as_posix()
        budget.member(name)
        if _skipped(name):
            continue
        with open(file, "rb") as fh:
            yield name, budget.read(name, os.fstat(fh.fileno()).st_size, fh.read)


def iter_files(path: str | os.PathLike[str], limits: Limits = DEFAULT_LIMITS) -> Iterator[tuple[str, bytes]]:
    """``(name, content)`` of every regular file of a tar or zip archive or a folder.

    Args:
        path: the archive (recognised by content) or a folder (read recursively; what a user
            placed there is read as is, links included).
        limits: the bounds (:class:`Limits`).

    Yields:
        ``(name, bytes)``: the member's path inside the archive (``/`` separated) and its content.

    Raises:
        ArchiveError: not an archive, damaged or truncated, or a refused member (see the module
            docstring), naming the archive and the member.
    """
    path = Path(path)
    kind = archive_kind(path)
    if kind is None:
        what = "no such file or folder" if not path.exists() else "neither a folder nor a tar or zip archive"
        raise ArchiveError(f"{path}: {what}")
    budget = _Budget(path, limits)
    reader = {"dir": _dir_files, "tar": _tar_files, "zip": _zip_files}[kind]
    try:
        yield from reader(path, budget)
    except ArchiveError:
        raise
    except (OSError, EOFError, zlib.error, lzma.LZMAError, tarfile.TarError, zipfile.BadZipFile, ValueError) as exc:
        raise ArchiveError(f"{path}: damaged or truncated {kind} ({type(exc).__name__}: {exc})") from exc

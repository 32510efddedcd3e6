"""Every byte an archive decompresses to counts: a hidden member's data and what follows a tar's
end are bounded like the members read (max_total_bytes, max_ratio times the file), refused in
seconds, naming where."""

from __future__ import annotations

import io
import tarfile
import time

import pytest

from hydragnn.data.errors import ArchiveError
from hydragnn.data.io.archives import Limits, iter_files


class _Zeros(io.RawIOBase):
    """``n`` zero bytes as a readable stream (nothing held in memory)."""

    def __init__(self, n: int) -> None:
        self.left = n

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        k = min(len(buffer), self.left)
        buffer[:k] = bytes(k)
        self.left -= k
        return k


def _tar_bz2(path, members, trailing: int = 0):
    """A tar.bz2 of ``members`` (name -> size of zeros, or bytes), then ``trailing`` zero bytes after the tar's end."""
    import bz2

    with bz2.open(path, "wb", compresslevel=9) as out:
        with tarfile.open(fileobj=out, mode="w|") as tar:
            for name, content in members.items():
                info = tarfile.TarInfo(name)
                if isinstance(content, bytes):
                    info.size = len(content)
                    tar.addfile(info, io.BytesIO(content))
                else:
                    info.size = content
                    tar.addfile(info, io.BufferedReader(_Zeros(content), 1 << 20))
        stream = _Zeros(trailing)
        while block := stream.read(1 << 20):
            out.write(block)
    return path


def _refused(path, match, limits=None):
    start = time.perf_counter()
    with pytest.raises(ArchiveError, match=match):
        for _ in iter_files(path, *(() if limits is None else (limits,))):
            pass
    return time.perf_counter() - start


def test_a_hidden_member_counts(tmp_path):
    path = _tar_bz2(tmp_path / "hidden.tar.bz2", {"a.txt": b"1 2 3\n", ".secret": 96 << 20, "b.txt": b"4\n"})
    assert path.stat().st_size < 4096
    seconds = _refused(
        path,
        r"hidden\.tar\.bz2: decompresses to more than 67108864 bytes \(max_ratio=1000 times its \d+ bytes\), at member '\.secret'",
    )
    assert seconds < 10
    # a visible member of that size: the same bound
    _refused(_tar_bz2(tmp_path / "big.tar.bz2", {"big.txt": 96 << 20}), r"member 'big\.txt'")


def test_bytes_after_the_archive_end_count(tmp_path):
    path = _tar_bz2(tmp_path / "tail.tar.bz2", {"a.txt": b"1 2 3\n"}, trailing=96 << 20)
    _refused(path, r"decompresses to more than .* at after the archive's end")
    small = _tar_bz2(tmp_path / "small.tar.bz2", {"a.txt": b"1 2 3\n"}, trailing=1 << 20)
    _refused(
        small,
        r"more than max_total_bytes=524288 uncompressed, at after the archive's end",
        Limits(max_total_bytes=512 << 10),
    )


def test_ordinary_archives_read(tmp_path):
    path = _tar_bz2(tmp_path / "ok.tar.bz2", {"a.txt": b"1 2 3\n", "sub/b.txt": b"4 5\n" * 1000, ".hidden": b"x"})
    assert [(name, len(data)) for name, data in iter_files(path)] == [("a.txt", 6), ("sub/b.txt", 4000)]

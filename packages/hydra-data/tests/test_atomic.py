"""Atomic writes: permissions follow the umask, failures leave the target and no temporary,
temporaries of killed writers are cleaned by the next write."""

from __future__ import annotations

import os
import stat
import subprocess
import sys

import pytest

from hydragnn.data.io.atomic import atomic_write, current_umask, remove_stale_temporaries


@pytest.fixture()
def umask():
    old = os.umask(0o022)
    yield
    os.umask(old)


@pytest.mark.parametrize("mask, expected", [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_permissions_follow_the_umask(tmp_path, umask, mask, expected):
    os.umask(mask)
    assert current_umask() == mask
    path = atomic_write(tmp_path / "a.bin", b"abc")
    assert stat.S_IMODE(path.stat().st_mode) == expected and path.read_bytes() == b"abc"
    assert stat.S_IMODE(atomic_write(tmp_path / "b.bin", b"x", mode=0o640).stat().st_mode) == 0o640


def test_a_failing_writer_leaves_the_old_file_and_no_temporary(tmp_path):
    path = atomic_write(tmp_path / "c.bin", b"old")

    def broken(fh):
        fh.write(b"partial")
        raise RuntimeError("disk full (simulated)")

    with pytest.raises(RuntimeError, match="disk full"):
        atomic_write(path, broken)
    assert path.read_bytes() == b"old" and sorted(p.name for p in tmp_path.iterdir()) == ["c.bin"]


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_temporaries_of_killed_writers_are_removed_by_the_next_write(tmp_path):
    target = tmp_path / "checkpoint.pt"
    stale = tmp_path / f".checkpoint.pt.{_dead_pid()}.abc123.tmp"
    stale.write_bytes(b"")  # what a kill -9 during a write leaves
    ours = tmp_path / f".checkpoint.pt.{os.getpid()}.def456.tmp"  # a live writer's (this process)
    ours.write_bytes(b"")
    other = tmp_path / f".other.pt.{_dead_pid()}.ghi789.tmp"  # another target's: not ours to touch
    other.write_bytes(b"")
    atomic_write(target, b"new")
    assert not stale.exists() and ours.exists() and other.exists() and target.read_bytes() == b"new"
    assert remove_stale_temporaries(tmp_path / "other.pt") == [other]

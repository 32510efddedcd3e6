"""Files that misstate themselves: frame sizes beyond the file, an edit that keeps the size and the
modification time, keys repeated in a comment line, coincident atoms (issue 30, items 3 and 7)."""

from __future__ import annotations

import contextlib
import gzip
import os
import re
import signal
import warnings

import numpy as np
import pytest

from hydragnn.data import ContainerError, DataError, errors
from hydragnn.data.emt import generate_cuau_atoms, write_extxyz
from hydragnn.data.io import conversion_cache
from hydragnn.data.io.ase_source import AseSource, iter_frames
from hydragnn.data.io.conversion import convert_source

COMMENT = "Properties=species:S:1:pos:R:3"


class Hang(BaseException):
    """Raised by :func:`deadline`; a ``BaseException`` so no reader's ``except Exception`` hides it."""


@contextlib.contextmanager
def deadline(seconds: float):
    def expired(signum, frame):
        raise Hang(f"still running after {seconds} s")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _source(path, **kw):
    return AseSource(path, energy_key="REF_energy", forces_key="REF_forces", stress_key="REF_stress", **kw)


def _frames(path):
    with deadline(10):
        return list(iter_frames(AseSource(path)))


# ----------------------------------------------------------------------------- declared sizes
def test_a_count_far_beyond_the_file_is_refused_at_once(tmp_path):
    path = tmp_path / "lies.xyz"
    path.write_text(f"2000000000\n{COMMENT}\nH 0 0 0\n")
    assert path.stat().st_size < 70
    with pytest.raises(ContainerError) as info:
        _frames(path)
    message = str(info.value)
    assert message.startswith(f"{path}: frame 0: ") and "2000000000 atoms" in message, message
    assert f"{path.stat().st_size - 11 - len(COMMENT) - 1} bytes" in message, message

    packed = tmp_path / "lies.xyz.gz"  # compressed: no byte bound, the line count refuses it
    packed.write_bytes(gzip.compress(path.read_bytes()))
    with pytest.raises(
        ContainerError, match=r"lies\.xyz\.gz: frame 0: declares 2000000000 atoms; the file holds 1 more line$"
    ):
        _frames(packed)


def test_a_count_beyond_the_lines_left_names_the_frame(tmp_path):
    path = tmp_path / "short.xyz"
    path.write_text(f"1\n{COMMENT}\nH 0 0 0\n5\n{COMMENT}\nH 0 0 0\nH 1 0 0\n")
    with pytest.raises(ContainerError, match=r"short\.xyz: frame 1: declares 5 atoms; the file holds 2 more line"):
        _frames(path)


@pytest.mark.parametrize("count", ["-3", "2.5", "two"])
def test_a_count_that_is_no_natural_number_is_refused(tmp_path, count):
    path = tmp_path / "bad.xyz"
    path.write_text(f"1\n{COMMENT}\nH 0 0 0\n{count}\n{COMMENT}\nH 0 0 0\nH 1 0 0\nH 2 0 0\n")
    with pytest.raises(ContainerError, match=rf"bad\.xyz: frame 1: .*{re.escape(count)}"):
        _frames(path)


def test_file_content_in_a_message_is_clipped(tmp_path):
    for name, text in (
        ("count.xyz", "x" * 100_000 + f"\n{COMMENT}\nH 0 0 0\n"),
        ("token.xyz", f"1\n{COMMENT}\nH {'9' * 100_000}x 0 0\n"),
    ):
        path = tmp_path / name
        path.write_text(text)
        with pytest.raises(ContainerError) as info:
            _frames(path)
        assert f"{name}: frame 0" in str(info.value) and len(str(info.value)) < 1000, str(info.value)[:2000]


def test_a_truncated_compressed_file_is_a_container_error(tmp_path):
    whole = gzip.compress(write_extxyz(tmp_path / "ok.xyz", generate_cuau_atoms(2, seed=2)).read_bytes())
    path = tmp_path / "cut.xyz.gz"
    path.write_bytes(whole[: len(whole) // 2])
    for fmt in (None, "extxyz"):
        with pytest.raises(ContainerError, match=r"cut\.xyz\.gz: .*Compressed file ended"):
            with deadline(10):
                list(iter_frames(AseSource(path, format=fmt)))


def test_valid_files_pass_the_size_check(tmp_path):
    atoms = generate_cuau_atoms(4, seed=2)
    path = write_extxyz(tmp_path / "ok.xyz", atoms)
    crlf = tmp_path / "crlf.xyz"
    crlf.write_bytes(path.read_bytes().replace(b"\n", b"\r\n").rstrip(b"\r\n"))  # no line end at the end
    packed = tmp_path / "ok.xyz.gz"
    packed.write_bytes(gzip.compress(path.read_bytes()))
    for p in (path, crlf, packed):
        frames = _frames(p)
        assert [len(f.atoms) for f in frames] == [len(a) for a in atoms]
        assert np.allclose(frames[-1].atoms.positions, atoms[-1].positions)


# ----------------------------------------------------------------------------- cache identity
def _same_size_edit(path):
    """Change one digit of the first energy, keeping the size and the modification time."""
    st = path.stat()
    text = path.read_text()
    at = text.index("REF_energy=") + len("REF_energy=") + 3
    digit = text[at]
    assert digit.isdigit()
    path.write_text(text[:at] + str((int(digit) + 1) % 10) + text[at + 1 :])
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert path.stat().st_size == st.st_size and path.stat().st_mtime_ns == st.st_mtime_ns


def test_a_small_file_edited_in_place_is_converted_again(tmp_path):
    path = write_extxyz(tmp_path / "train.xyz", generate_cuau_atoms(3, seed=1))
    first = convert_source(_source(path), cutoff=4.0)
    energy = float(first.dataset[0].energy)
    _same_size_edit(path)
    log: list[str] = []
    again = convert_source(_source(path), cutoff=4.0, log=log.append)
    assert not again.cached and float(again.dataset[0].energy) != energy
    assert any("the file changed" in line for line in log), log


def test_verify_hash_sees_an_edit_of_a_large_file(tmp_path, monkeypatch):
    monkeypatch.setattr(conversion_cache, "HASH_ALWAYS_BELOW", 0)  # every file counts as large
    path = write_extxyz(tmp_path / "train.xyz", generate_cuau_atoms(3, seed=1))
    convert_source(_source(path), cutoff=4.0)
    _same_size_edit(path)
    assert convert_source(_source(path), cutoff=4.0).cached  # size and time alone: the old entry
    fresh = convert_source(_source(path), cutoff=4.0, verify="hash")
    assert not fresh.cached
    assert convert_source(_source(path), cutoff=4.0, verify="hash").cached
    with pytest.raises(DataError, match=r"verify: expected one of \['auto', 'hash'\], found 'sha'"):
        convert_source(_source(path), cutoff=4.0, verify="sha")


# ----------------------------------------------------------------------------- repeated keys
def test_a_key_repeated_in_comment_lines_warns_once_per_file(tmp_path):
    atoms = generate_cuau_atoms(3, seed=1)
    path = write_extxyz(tmp_path / "dup.xyz", atoms)
    lines = path.read_text().splitlines(keepends=True)
    for k, line in enumerate(lines):
        if "REF_energy=" in line:
            lines[k] = line.replace("REF_energy=", "REF_energy=7.0 REF_energy=", 1)
    path.write_text("".join(lines))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = convert_source(_source(path), cutoff=4.0)
    dup = [w for w in caught if issubclass(w.category, errors.DuplicateKeyWarning)]
    assert len(dup) == 1, [str(w.message) for w in caught]
    message = str(dup[0].message)
    assert f"{path}: frame 0: key 'REF_energy' appears 2 times" in message and "3 frames" in message, message
    assert float(out.dataset[0].energy) != 7.0  # ASE keeps the last value; the warning says so


# ----------------------------------------------------------------------------- coincident atoms
def test_coincident_atoms_warn_once_per_file_with_a_count(tmp_path):
    atoms = generate_cuau_atoms(4, seed=1)
    atoms[1].positions[5] = atoms[1].positions[3]  # the same position
    atoms[3].positions[7] = atoms[3].positions[2] + atoms[3].cell[0] + 1e-4  # a periodic image, 1e-4 Å off
    path = write_extxyz(tmp_path / "overlap.xyz", atoms)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = convert_source(_source(path), cutoff=4.0)
    hits = [w for w in caught if issubclass(w.category, errors.CoincidentAtomsWarning)]
    assert len(hits) == 1, [str(w.message) for w in caught]
    message = str(hits[0].message)
    assert f"{path}: 2 frames" in message and "frame 1: atoms 3 and 5" in message, message
    assert "frame 3: atoms 2 and 7" in message, message
    assert len(out.dataset) == 4  # trained as given

    clean = write_extxyz(tmp_path / "clean.xyz", generate_cuau_atoms(4, seed=1))
    with warnings.catch_warnings():
        warnings.simplefilter("error", errors.CoincidentAtomsWarning)
        convert_source(_source(clean), cutoff=4.0)

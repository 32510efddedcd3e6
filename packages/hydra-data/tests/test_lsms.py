"""The LSMS raw format and the archive reader: columns, errors that name the line, refused members."""

from __future__ import annotations

import io
import tarfile
import zipfile

import pytest
import torch

from hydragnn.data import Schema, prepare
from hydragnn.data.errors import ArchiveError, DataError
from hydragnn.data.io.archives import Limits, archive_kind, iter_files
from hydragnn.data.named.lsms import LSMS_VARIABLES, format_lsms, iter_lsms, parse_lsms
from hydragnn.data.named.lsms_synthetic import synthetic_alloy

# upstream's layout: energy line, then Z, index, x, y, z, electronic charge, magnetic moment (+ extra columns)
TEXT = """-5091.25  0.5
26 0 0.0 0.0 0.0 25.9 2.8 99
78 1 2.7 2.7 3.5 78.2 0.3

"""


def test_columns_follow_upstream():
    d = parse_lsms(TEXT, "two.txt")
    assert d.atomic_number.dtype == torch.long and d.atomic_number.tolist() == [[26], [78]]
    assert d.num_of_protons.tolist() == [[26.0], [78.0]]
    assert d.pos.shape == (2, 3) and d.pos[1].tolist() == [2.7, 2.7, 3.5]
    assert torch.allclose(d.charge_density, torch.tensor([[-0.1], [0.2]], dtype=torch.float64))  # column 5 minus Z
    assert d.magnetic_moment.tolist() == [[2.8], [0.3]]
    assert d.free_energy.tolist() == [[-5091.25]]
    assert d.free_energy_scaled_num_nodes.tolist() == [[-5091.25 / 2]] == d.free_energy_per_atom.tolist()
    prepared = prepare(d, Schema.from_dict(LSMS_VARIABLES), index=0)
    assert prepared.x.tolist() == [[26.0], [78.0]] and prepared.y.shape == (1 + 2 + 2, 1)


def test_format_round_trips():
    text = format_lsms(-12.5, [29, 79], [[0, 0, 0], [1.5, 1.5, 0]], [29.1, 78.9], [0.0, 0.01])
    d = parse_lsms(text.encode(), "rt")
    assert d.atomic_number.reshape(-1).tolist() == [29, 79] and d.free_energy.item() == -12.5
    assert d.electronic_charge.reshape(-1).tolist() == [29.1, 78.9]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "empty"),
        ("-1.0\n", "no atom line"),
        ("-1.0\n26 0 0 0 0 26\n", "line 2: 6 values, expected at least 7"),
        ("-1.0\n26 0 0 nan 0 26 2\n", "line 2: column 3: expected a finite number"),
        ("-1.0\n26.5 0 0 0 0 26 2\n", "line 2: column 0: expected an atomic number"),
        ("-1.0\n0 0 0 0 0 26 2\n", "expected an atomic number 1..118"),
        ("energy\n26 0 0 0 0 26 2\n", "line 1: column 0: expected a number"),
        ("-1.0\n26 0 0 0 0 26 x2\n", "column 6: expected a number, found 'x2'"),
    ],
)
def test_bad_files_name_the_line(text, message):
    with pytest.raises(DataError, match="bad.txt") as info:
        parse_lsms(text, "bad.txt")
    assert message in str(info.value)


def test_entry_checks_count_and_elements():
    with pytest.raises(DataError, match="2 atoms, expected 32"):
        parse_lsms(TEXT, "f", n_atoms=32)
    with pytest.raises(DataError, match="line 3: atomic number 78, expected one of \\[26, 29\\]"):
        parse_lsms(TEXT, "f", elements=(26, 29))
    with pytest.raises(DataError, match="not UTF-8"):
        parse_lsms(b"\xff\xfe-1\n", "f")


def _tar(members: dict[str, bytes], mode: str = "w:gz") -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode=mode) as tar:
        for name, content in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(content)
            tar.addfile(info, io.BytesIO(content))
    return buf.getvalue()


def _zip(members: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, content in members.items():
            zf.writestr(name, content)
    return buf.getvalue()


@pytest.mark.parametrize("kind", ["tar.gz", "tar", "tar.xz", "zip", "dir"])
def test_archives_and_folders_read_alike(tmp_path, kind):
    files = dict(synthetic_alloy(4, seed=2))
    members = {f"FePt/output_files/{k}": v.encode() for k, v in files.items()}
    members |= {"FePt/README.md": b"# not a structure", "FePt/.hidden": b"junk", "__MACOSX/FePt/._out_0": b"junk"}
    path = tmp_path / "raw"
    if kind == "dir":
        for name, content in members.items():
            (path / name).parent.mkdir(parents=True, exist_ok=True)
            (path / name).write_bytes(content)
    elif kind == "zip":
        path.write_bytes(_zip(members))  # the name says nothing: the content decides
    else:
        path.write_bytes(_tar(members, {"tar.gz": "w:gz", "tar": "w", "tar.xz": "w:xz"}[kind]))
    assert archive_kind(path) == ("tar" if kind.startswith("tar") else kind)
    read = list(iter_lsms(path, n_atoms=32, elements=(26, 78)))
    assert [w.rsplit(": ", 1)[1] for w, _ in read] == [f"FePt/output_files/out_{k}" for k in range(4)]
    assert torch.equal(read[3][1].pos, parse_lsms(files["out_3"], "x").pos)


def _tar_with(tmp_path, make) -> object:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        make(tar)
    path = tmp_path / "bad.tar"
    path.write_bytes(buf.getvalue())
    return path


@pytest.mark.parametrize(
    ("name", "kind", "message"),
    [
        ("../escape", tarfile.REGTYPE, "outside the archive"),
        ("/etc/passwd", tarfile.REGTYPE, "outside the archive"),
        ("a/../../b", tarfile.REGTYPE, "outside the archive"),
        ("link", tarfile.SYMTYPE, "a link \\(symbolic\\)"),
        ("hard", tarfile.LNKTYPE, "a link \\(hard\\)"),
        ("fifo", tarfile.FIFOTYPE, "not a regular file"),
    ],
)
def test_refused_tar_members(tmp_path, name, kind, message):
    def make(tar):
        info = tarfile.TarInfo(name)
        info.type = kind
        info.linkname = "/etc/passwd" if kind in (tarfile.SYMTYPE, tarfile.LNKTYPE) else ""
        tar.addfile(info, io.BytesIO(b"") if kind == tarfile.REGTYPE else None)

    with pytest.raises(ArchiveError, match=message):
        list(iter_files(_tar_with(tmp_path, make)))


def test_refused_zip_members_and_bounds(tmp_path):
    evil = tmp_path / "evil.zip"
    evil.write_bytes(_zip({"../../x": b"1"}))
    with pytest.raises(ArchiveError, match="outside the archive"):
        list(iter_files(evil))
    link = tmp_path / "link.zip"
    with zipfile.ZipFile(link, "w") as zf:
        info = zipfile.ZipInfo("l")
        info.external_attr = 0o120777 << 16
        zf.writestr(info, "/etc/passwd")
    with pytest.raises(ArchiveError, match="symbolic link"):
        list(iter_files(link))
    bomb = tmp_path / "bomb.zip"
    bomb.write_bytes(_zip({"a": b"0" * 5000, "b": b"0" * 5000}))  # compresses to almost nothing
    with pytest.raises(ArchiveError, match="max_member_bytes=4096"):
        list(iter_files(bomb, Limits(max_member_bytes=4096)))
    with pytest.raises(ArchiveError, match="max_total_bytes=8000"):
        list(iter_files(bomb, Limits(max_total_bytes=8000)))
    with pytest.raises(ArchiveError, match="max_members=1"):
        list(iter_files(bomb, Limits(max_members=1)))


def test_not_an_archive_or_truncated(tmp_path):
    html = tmp_path / "landing.html"
    html.write_text("<html>a landing page, not the data</html>")
    with pytest.raises(ArchiveError, match="neither a folder nor a tar or zip archive"):
        list(iter_files(html))
    data = _tar({f"out_{k}": t.encode() for k, t in synthetic_alloy(30, seed=0)}, "w:gz")
    cut = tmp_path / "cut.tar.gz"
    cut.write_bytes(data[: len(data) // 2])
    with pytest.raises(ArchiveError, match="damaged or truncated"):
        list(iter_files(cut))
    empty = tmp_path / "docs.zip"
    empty.write_bytes(_zip({"README": b"nothing here"}))
    with pytest.raises(DataError, match="no LSMS structure file"):
        list(iter_lsms(empty))


@pytest.mark.parametrize("mode", ["w:gz", "w:bz2", "w:xz"])
def test_compressed_tars_are_checked_to_the_end(tmp_path, mode):
    """tarfile's own stream reader does not check gzip's CRC: a flipped bit in the data would read
    as other numbers. Read through the decompressor to its end, it is refused: a damaged trailer
    (the checksums) as a damaged archive, damaged data no later than there."""
    data = bytearray(_tar({f"out_{k}": t.encode() for k, t in synthetic_alloy(3, seed=1)}, mode))
    trailer, middle = bytearray(data), bytearray(data)
    trailer[-6] ^= 0x10
    middle[len(data) // 2] ^= 0x10
    (tmp_path / "trailer").write_bytes(bytes(trailer))
    (tmp_path / "middle").write_bytes(bytes(middle))
    with pytest.raises(ArchiveError, match="trailer: damaged or truncated tar"):
        list(iter_lsms(tmp_path / "trailer"))
    with pytest.raises(DataError, match="middle"):
        list(iter_lsms(tmp_path / "middle"))

"""Converting a file ASE reads into a cached prepared container: hits, rebuilds and why, failures."""

from __future__ import annotations

import json
import os

import ase.io
import pytest
import torch

from hydragnn.data import ContainerError, SchemaError
from hydragnn.data.emt import generate_cuau_atoms, isolated_atom_frames, write_extxyz
from hydragnn.data.io.ase_source import AseSource
from hydragnn.data.io.conversion import convert_source
from hydragnn.data.neighbors import add_edges


@pytest.fixture(scope="module")
def emt_atoms():
    return generate_cuau_atoms(8, seed=5)


@pytest.fixture
def ref_file(tmp_path, emt_atoms):
    return write_extxyz(tmp_path / "data" / "train.xyz", emt_atoms, extra_frames=isolated_atom_frames(["Cu", "Au"]))


def _source(path, **kw):
    return AseSource(path, energy_key="REF_energy", forces_key="REF_forces", stress_key="REF_stress", **kw)


def _equal(a, b) -> bool:
    return set(a.keys()) == set(b.keys()) and all(
        torch.equal(a[k], b[k]) if isinstance(a[k], torch.Tensor) else a[k] == b[k] for k in a.keys()
    )


def test_first_call_converts_next_call_reuses(ref_file):
    log: list[str] = []
    first = convert_source(_source(ref_file), cutoff=4.0, log=log.append)
    assert not first.cached and len(first.dataset) == 8
    assert first.entry.parent == ref_file.parent / ".hydragnn_cache"
    assert first.isolated_atoms[0][0] == 29 and first.isolated_atoms[1][0] == 79
    assert [v.name for v in first.schema.outputs] == ["energy", "forces", "stress"]
    assert first.dataset.schema == first.schema
    sample = first.dataset[3]
    assert sample.x.shape == (32, 1) and sample.graph_output.shape == (1, 7)
    rebuilt = add_edges(sample.clone(), 4.0)
    assert torch.equal(rebuilt.edge_index, sample.edge_index) and torch.equal(rebuilt.edge_shift, sample.edge_shift)
    assert "converting" in log[0] and "8 samples prepared" in log[-1] and "2 isolated atoms" in log[-1]

    log.clear()
    second = convert_source(_source(ref_file), cutoff=4.0, log=log.append)
    assert second.cached and second.entry == first.entry and "from the cache" in log[0]
    assert all(_equal(first.dataset[i], second.dataset[i]) for i in range(8))
    assert second.isolated_atoms == first.isolated_atoms and second.schema == first.schema

    os.utime(ref_file, ns=(1, 1))  # touched, same bytes: still a hit (hashed again, same digest)
    assert convert_source(_source(ref_file), cutoff=4.0).cached


def test_changed_file_or_cutoff_rebuilds_and_says_why(ref_file, emt_atoms):
    first = convert_source(_source(ref_file), cutoff=4.0)
    log: list[str] = []
    other = convert_source(_source(ref_file), cutoff=5.0, log=log.append)
    assert not other.cached and "rebuilding (cutoff 4.0 -> 5.0)" in log[0]
    assert first.entry.exists()  # another setting of the same file stays cached
    assert other.dataset[0].edge_index.shape[1] > first.dataset[0].edge_index.shape[1]

    write_extxyz(ref_file, emt_atoms[:5])
    log.clear()
    changed = convert_source(_source(ref_file), cutoff=4.0, log=log.append)
    assert not changed.cached and len(changed.dataset) == 5 and "the file changed" in log[0]
    assert not first.entry.exists() and not other.entry.exists()  # entries of the old content are removed
    log.clear()
    keys = convert_source(_source(ref_file, index=":3"), cutoff=4.0, log=log.append)
    assert len(keys.dataset) == 3 and "frame selection or label keys changed" in log[0]


def test_interrupted_conversion_leaves_no_entry(tmp_path, emt_atoms):
    path = write_extxyz(tmp_path / "t.xyz", emt_atoms[:4])
    frames = ase.io.read(path, index=":")
    del frames[3].info["REF_energy"]
    ase.io.write(path, frames, format="extxyz")
    cache = tmp_path / "cache"
    with pytest.raises(SchemaError, match=r"t\.xyz: frame 3: no label 'REF_energy'"):
        convert_source(_source(path, explicit=frozenset({"energy"})), cutoff=4.0, cache_dir=cache)
    assert list(cache.iterdir()) == []


def test_unwritable_cache_beside_the_file_falls_back_to_the_user_cache(tmp_path, emt_atoms, monkeypatch):
    path = write_extxyz(tmp_path / "t.xyz", emt_atoms[:3])
    (tmp_path / ".hydragnn_cache").write_text("a file where the cache folder would go")
    monkeypatch.setenv("HYDRAGNN_CACHE", str(tmp_path / "user"))
    converted = convert_source(_source(path), cutoff=4.0)
    assert converted.entry.parent == tmp_path / "user" / "converted" and len(converted.dataset) == 3


def test_adios_container_and_explicit_cache_dir(tmp_path, emt_atoms):
    pytest.importorskip("adios2")
    path = write_extxyz(tmp_path / "t.xyz", emt_atoms[:3])
    converted = convert_source(_source(path), cutoff=4.0, container_format="adios", cache_dir=tmp_path / "c")
    assert converted.entry.parent == tmp_path / "c" and (converted.entry / "data.bp").is_dir()
    pt = convert_source(_source(path), cutoff=4.0, cache_dir=tmp_path / "c")
    assert pt.entry != converted.entry
    assert all(_equal(converted.dataset[i], pt.dataset[i]) for i in range(3))
    record = json.loads((converted.entry / "record.json").read_text())
    assert record["samples"] == 3 and record["fingerprint"]["container"] == "adios"


def test_bad_arguments(tmp_path, ref_file):
    with pytest.raises(ContainerError, match="no such file"):
        convert_source(_source(tmp_path / "missing.xyz"), cutoff=4.0)
    with pytest.raises(ContainerError, match="container_format"):
        convert_source(_source(ref_file), cutoff=4.0, container_format="zip")
    with pytest.raises(Exception, match="no frame selected"):
        convert_source(_source(ref_file, config_types=("surface",)), cutoff=4.0)


def test_a_frame_without_atoms_is_refused_naming_the_file_and_frame(ref_file):
    """A 0-atom frame (a truncated or hand-edited file) used to pass conversion and crash training
    with a ZeroDivisionError; it now stops the conversion, naming where it is."""
    text = ref_file.read_text()
    empty = '0\nProperties=species:S:1:pos:R:3 REF_energy=0.0 pbc="F F F"\n'
    lines = text.splitlines(keepends=True)
    n = int(lines[0])
    ref_file.write_text("".join(lines[: n + 2]) + empty + "".join(lines[n + 2 :]))
    with pytest.raises(SchemaError, match=r"train\.xyz.*frame 1.*no atoms"):
        convert_source(_source(ref_file), cutoff=4.0)
    assert not any(p.name.startswith("train.xyz.") for p in (ref_file.parent / ".hydragnn_cache").iterdir())


def test_a_cell_too_small_for_the_cutoff_is_refused_naming_the_frame(tmp_path, emt_atoms):
    """Neighbour lists are built for many structures at once; a structure the search refuses is
    still named by its file and frame."""
    frames = [a.copy() for a in emt_atoms[:4]]
    for a, b in zip(frames, emt_atoms[:4]):
        a.calc = b.calc  # write_extxyz reads the stored results
    frames[2].set_cell(frames[2].cell.array * 0.02, scale_atoms=False)
    path = write_extxyz(tmp_path / "small.xyz", frames)
    with pytest.raises(ValueError, match=r"small\.xyz.*frame 2.*cell"):
        convert_source(_source(path), cutoff=4.0)

"""Frames converted a chunk at a time, column by column (``PackedChunk``), give the very samples
the frame-by-frame path gives: same attributes in the same order, dtypes and values, every format."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from ase.build import molecule
from ase.calculators.emt import EMT
from ase.calculators.singlepoint import SinglePointCalculator

import hydragnn.data.io.conversion_samples as conversion_samples
from hydragnn.data import ContainerError
from hydragnn.data.containers import PackedChunk, open_dataset, write_dataset
from hydragnn.data.containers.packed_chunk import Rows
from hydragnn.data.emt import generate_cuau_atoms, isolated_atom_frames, write_extxyz
from hydragnn.data.io.ase_source import AseSource
from hydragnn.data.io.conversion import convert_source


def _labelled(atoms):
    atoms.calc = EMT()
    energy, forces = atoms.get_potential_energy(), atoms.get_forces()
    atoms.calc = SinglePointCalculator(atoms, energy=energy, forces=forces)
    return atoms


@pytest.fixture(scope="module")
def mixed_frames():
    """Molecules and periodic cells interleaved in runs: several runs of attributes per chunk."""
    rng = np.random.default_rng(3)
    molecules = []
    for name in ("H2O", "CH4", "NH3", "C2H2", "HCN", "CO2"):
        atoms = molecule(name)
        atoms.rattle(0.05, seed=int(rng.integers(1 << 30)))
        molecules.append(_labelled(atoms))
    cells = generate_cuau_atoms(6, seed=2)
    return molecules[:2] + cells[:3] + molecules[2:] + cells[3:]


def _sample_items(data):
    return [(key, value) for key, value in data]


def _assert_same(a, b):
    assert len(a) == len(b)
    for i in range(len(a)):
        x, y = _sample_items(a[i]), _sample_items(b[i])
        assert [k for k, _ in x] == [k for k, _ in y], i
        for (key, u), (_, v) in zip(x, y):
            assert isinstance(u, torch.Tensor) and u.dtype == v.dtype and torch.equal(u, v), (i, key)


def _convert(path, cache, fmt, **kw):
    source = AseSource(path, energy_key="REF_energy", forces_key="REF_forces", **kw)
    return convert_source(source, cutoff=4.0, container_format=fmt, cache_dir=cache)


def test_packed_chunks_equal_frame_by_frame(tmp_path, mixed_frames, monkeypatch):
    path = write_extxyz(tmp_path / "mixed.xyz", mixed_frames, extra_frames=isolated_atom_frames(["Cu"]))
    monkeypatch.setattr(conversion_samples, "EDGE_CHUNK", 5)  # chunks cut across runs of molecules and cells
    packed_calls = []
    pack = conversion_samples.pack_frames
    monkeypatch.setattr(conversion_samples, "pack_frames", lambda *a: packed_calls.append(pack(*a)) or packed_calls[-1])
    packed = _convert(path, tmp_path / "packed", "pt")
    assert sum(p is not None for p in packed_calls) >= 4  # every run was packed
    monkeypatch.setattr(conversion_samples, "pack_frames", lambda *a: None)
    each = _convert(path, tmp_path / "each", "pt")
    assert len(packed.dataset) == 12 and packed.isolated_atoms == each.isolated_atoms
    _assert_same(packed.dataset, each.dataset)
    periodic = packed.dataset[2]
    assert periodic.cell.shape == (1, 3, 3) and periodic.edge_shift.shape == (periodic.edge_index.shape[1], 3)
    assert "cell" not in packed.dataset[0] and packed.dataset[0].edge_index.max() < packed.dataset[0].natoms


@pytest.mark.parametrize("fmt", ["pt", "adios"])
def test_cells_with_stress_packed_in_chunks(tmp_path, monkeypatch, fmt):
    path = write_extxyz(tmp_path / "cells.xyz", generate_cuau_atoms(7, seed=4))
    monkeypatch.setattr(conversion_samples, "EDGE_CHUNK", 3)
    packed = _convert(path, tmp_path / "packed", fmt, stress_key="REF_stress")
    if fmt == "pt":
        assert len(list(packed.dataset.path.glob("chunk_*.pt"))) == 3  # 3 + 3 + 1 frames, one file each
        stored = torch.load(packed.dataset.path / "chunk_000000.pt", weights_only=True)["fields"]
        assert stored["edge_index"]["data"].dtype == torch.int8  # local indices of 32 atoms
        assert stored["edge_shift"]["table"].shape == (3 * 27, 3)  # each cell's 27 image offsets
    monkeypatch.setattr(conversion_samples, "pack_frames", lambda *a: None)
    _assert_same(packed.dataset, _convert(path, tmp_path / "each", fmt, stress_key="REF_stress").dataset)
    assert packed.dataset[6].graph_output.shape == (1, 7) and packed.dataset[6].y.shape == (1 + 32 * 3 + 6, 1)


@pytest.mark.parametrize("fmt", ["pickle", "adios"])
def test_other_formats_store_a_packed_chunk_s_samples(tmp_path, fmt):
    shapes = torch.tensor([[2, 3], [1, 3], [4, 3]])
    table = torch.randn(2, 3, dtype=torch.float64)
    rows = Rows(table, torch.tensor([1, 0, 0, 1, 1, 1, 0]))
    chunk = PackedChunk(
        3, {"pos": (torch.arange(21.0), shapes), "z": (torch.arange(7), shapes[:, :1]), "shift": (rows, shapes)}
    )
    out = open_dataset(write_dataset(tmp_path / "ds", [chunk], fmt))
    assert torch.equal(out[2].shift, table[[1, 1, 1, 0]])
    assert len(out) == 3 and [tuple(out[i].pos.shape) for i in range(3)] == [(2, 3), (1, 3), (4, 3)]
    assert torch.equal(out[2].pos.flatten(), torch.arange(9.0, 21.0)) and torch.equal(out[1].z, torch.tensor([2]))


def test_a_packed_chunk_is_checked_and_oversized_ones_are_taken_apart(tmp_path, monkeypatch):
    data = torch.arange(10.0)
    with pytest.raises(ContainerError, match="field 'a' is not 2 samples"):
        PackedChunk(2, {"a": (data, torch.tensor([[3], [4]]))})
    chunk = PackedChunk(
        2, {"a": (data, torch.tensor([[4], [6]])), "b": (torch.arange(4), torch.tensor([[1, 2], [1, 2]]))}
    )
    import hydragnn.data.containers.pt_directory as pt_directory

    monkeypatch.setattr(pt_directory, "CHUNK_SAMPLES", 1)  # too many samples for one chunk file: written one by one
    out = open_dataset(write_dataset(tmp_path / "ds", [chunk, chunk], "pt"))
    assert len(out) == 4 and len(list(out.path.glob("chunk_*.pt"))) == 4
    assert torch.equal(out[1].a, data[4:]) and torch.equal(out[3].b, torch.tensor([[2, 3]]))

"""Samples from files ASE reads: label keys, frame selection, schema inference, errors naming the frame."""

from __future__ import annotations

import ase.db
import ase.io
import numpy as np
import pytest
import torch
from ase import Atoms
from ase.build import molecule
from ase.calculators.singlepoint import SinglePointCalculator
from ase.stress import voigt_6_to_full_3x3_stress

from hydragnn.data import ContainerError, Schema, SchemaError
from hydragnn.data.emt import CUAU_VARIABLES, generate_cuau_atoms, isolated_atom_frames, write_extxyz
from hydragnn.data.io.ase_labels import labelled_sample, resolve_outputs
from hydragnn.data.io.ase_source import AseSource, iter_frames


@pytest.fixture(scope="module")
def emt_atoms():
    return generate_cuau_atoms(6, seed=4)


@pytest.fixture
def ref_file(tmp_path, emt_atoms):
    """An extxyz with REF_* labels, config type 'bulk' and two isolated atoms first."""
    return write_extxyz(
        tmp_path / "train.xyz", emt_atoms, config_type="bulk", extra_frames=isolated_atom_frames(["Cu", "Au"])
    )


def _source(path, **kw):
    keys = {"energy_key": "REF_energy", "forces_key": "REF_forces", "stress_key": "REF_stress"}
    keys.update(kw)
    return AseSource(path, explicit=frozenset({"energy", "forces"}), **keys)


def test_labels_read_under_their_keys_and_schema_inferred(ref_file, emt_atoms):
    source = _source(ref_file)
    frames = list(iter_frames(source))
    assert [f.config_type for f in frames] == ["IsolatedAtom"] * 2 + ["bulk"] * 6
    assert [f.number for f in frames] == list(range(8))
    schema, outputs = resolve_outputs(source, frames[2].atoms, None, frames[2].where)
    assert schema.to_dict() == {
        "inputs": CUAU_VARIABLES["inputs"],  # atomic numbers and positions
        "outputs": [
            {"name": "energy", "level": "graph", "dim": 1},
            {"name": "forces", "level": "node", "dim": 3},
            {"name": "stress", "level": "graph", "dim": 6},
        ],
    }
    for frame, atoms in zip(frames[2:], emt_atoms):
        data = labelled_sample(frame.atoms, outputs, frame.where)
        reference = atoms.calc.results
        assert float(data.energy) == reference["energy"]  # info values round-trip exactly through extxyz
        np.testing.assert_allclose(data.forces.numpy(), reference["forces"], rtol=0, atol=1e-8)  # 8 decimals
        np.testing.assert_array_equal(data.stress.numpy().reshape(6), reference["stress"])
        assert data.atomic_number.reshape(-1).tolist() == atoms.numbers.tolist()
        assert data.cell.shape == (1, 3, 3) and bool(data.pbc.all())


def test_default_keys_are_optional_and_explicit_keys_required(tmp_path):
    """Plain 'energy'/'forces' results of a molecule file: no stress label, so no stress output."""
    atoms = molecule("CH3CH2OH")
    rng = np.random.default_rng(0)
    atoms.calc = SinglePointCalculator(atoms, energy=-1.5, forces=rng.normal(size=(len(atoms), 3)))
    path = tmp_path / "mol.xyz"
    ase.io.write(path, [atoms, atoms], format="extxyz")
    source = AseSource(path)
    frame = next(iter_frames(source))
    schema, _ = resolve_outputs(source, frame.atoms, None, frame.where)
    assert [v.name for v in schema.outputs] == ["energy", "forces"]
    with pytest.raises(SchemaError, match=r"mol\.xyz: frame 0: no label 'stress' for output 'stress'"):
        resolve_outputs(AseSource(path, explicit=frozenset({"stress"})), frame.atoms, None, frame.where)


def test_missing_label_names_file_frame_and_the_labels_it_has(tmp_path, emt_atoms):
    path = write_extxyz(tmp_path / "bad.xyz", emt_atoms[:4])
    frames = ase.io.read(path, index=":")
    del frames[2].arrays["REF_forces"]
    ase.io.write(path, frames, format="extxyz")
    source = _source(path)
    first = next(iter_frames(source))
    _, outputs = resolve_outputs(source, first.atoms, None, first.where)
    bad = list(iter_frames(source))[2]
    with pytest.raises(SchemaError) as err:
        labelled_sample(bad.atoms, outputs, bad.where)
    msg = str(err.value)
    assert "bad.xyz: frame 2: no label 'REF_forces' for output 'forces'" in msg
    assert "info keys ['REF_energy', 'REF_stress']" in msg


def test_no_label_at_all_suggests_the_key_options(tmp_path, emt_atoms):
    path = write_extxyz(tmp_path / "ref.xyz", emt_atoms[:1])
    frame = next(iter_frames(AseSource(path)))
    with pytest.raises(SchemaError, match=r"no label to train on .*REF_energy.*energy_key"):
        resolve_outputs(AseSource(path), frame.atoms, None, frame.where)


def test_index_slicing_and_config_type_filter(tmp_path, emt_atoms):
    path = write_extxyz(tmp_path / "mixed.xyz", emt_atoms[:3], config_type="bulk")
    more = ase.io.read(write_extxyz(tmp_path / "m2.xyz", emt_atoms[3:], config_type="surface"), index=":")
    ase.io.write(path, ase.io.read(path, index=":") + more, format="extxyz")
    skipped: dict[str, int] = {}
    kept = list(iter_frames(_source(path, config_types=("surface",)), skipped))
    assert [f.number for f in kept] == [3, 4, 5] and skipped == {"bulk": 3}
    stepped = list(iter_frames(_source(path, index="1::2")))
    assert [f.number for f in stepped] == [1, 3, 5]
    assert stepped[1].where.endswith("mixed.xyz: frame 3")
    tail = list(iter_frames(_source(path, index="-2:")))
    assert len(tail) == 2 and tail[0].number is None and "frame 0 of index '-2:'" in tail[0].where


def test_extra_keys_stress_matrix_and_trajectory(tmp_path, emt_atoms):
    """Any other head by its key: per-atom arrays are node outputs, info values graph outputs; a
    3x3 stress becomes Voigt; a .traj file works the same way."""
    frames = []
    for atoms in emt_atoms[:2]:
        a = atoms.copy()
        r = atoms.calc.results
        a.info["E_dft"] = r["energy"]
        a.info["sigma"] = voigt_6_to_full_3x3_stress(r["stress"])
        a.info["dipole_ref"] = np.array([0.1, 0.2, 0.3])
        a.arrays["q_ref"] = np.linspace(-1, 1, len(a))
        frames.append(a)
    path = tmp_path / "x.traj"
    from ase.io.trajectory import Trajectory

    with Trajectory(path, "w") as traj:
        for a in emt_atoms[:2]:  # with their calculator results
            traj.write(a)
    xyz = tmp_path / "x.xyz"
    ase.io.write(xyz, frames, format="extxyz")
    source = AseSource(
        xyz,
        energy_key="E_dft",
        forces_key=None,
        stress_key="sigma",
        extra_keys=(("dipole", "dipole_ref"), ("charge", "q_ref")),
    )
    frame = next(iter_frames(source))
    schema, outputs = resolve_outputs(source, frame.atoms, None, frame.where)
    assert [(v.name, v.level, v.dim) for v in schema.outputs] == [
        ("energy", "graph", 1),
        ("stress", "graph", 6),
        ("dipole", "graph", 3),
        ("charge", "node", 1),
    ]
    data = labelled_sample(frame.atoms, outputs, frame.where)
    np.testing.assert_allclose(data.stress.numpy().reshape(6), emt_atoms[0].calc.results["stress"], rtol=0, atol=1e-15)
    assert data.charge.shape == (32, 1) and data.dipole.tolist() == [[0.1, 0.2, 0.3]]
    traj_frames = list(iter_frames(AseSource(path)))
    assert len(traj_frames) == 2
    tschema, _ = resolve_outputs(AseSource(path), traj_frames[0].atoms, None, traj_frames[0].where)
    assert [v.name for v in tschema.outputs] == ["energy", "forces", "stress"]  # a trajectory's calculator results


def test_ase_database_key_value_pairs_and_data(tmp_path, emt_atoms):
    path = tmp_path / "set.db"
    with ase.db.connect(path) as db:
        for atoms in emt_atoms[:3]:
            r = atoms.calc.results
            plain = atoms.copy()
            db.write(plain, REF_energy=float(r["energy"]), config_type="bulk", data={"REF_forces": r["forces"]})
    source = _source(path, stress_key=None, index="1:")
    frames = list(iter_frames(source))
    assert [f.number for f in frames] == [1, 2] and frames[0].config_type == "bulk"
    schema, outputs = resolve_outputs(source, frames[0].atoms, None, frames[0].where)
    data = labelled_sample(frames[1].atoms, outputs, frames[1].where)
    assert float(data.energy) == emt_atoms[2].calc.results["energy"]
    np.testing.assert_array_equal(data.forces.numpy(), emt_atoms[2].calc.results["forces"])  # db keeps float64


def test_explicit_schema_wins(ref_file):
    outputs = [{"name": "energy", "level": "graph", "dim": 1}, {"name": "stress", "level": "graph", "dim": 9}]
    schema = Schema.from_dict({"inputs": CUAU_VARIABLES["inputs"], "outputs": outputs})
    source = _source(ref_file)
    frame = list(iter_frames(source))[2]
    got, outputs = resolve_outputs(source, frame.atoms, schema, frame.where)
    assert got is schema and [k for _, k in outputs] == ["REF_energy", "REF_stress"]
    data = labelled_sample(frame.atoms, outputs, frame.where)
    full = data.stress.reshape(3, 3)
    assert torch.equal(full, full.T) and data.stress.shape == (1, 9)
    with pytest.raises(SchemaError, match="the schema has output 'stress' but its file key is null"):
        resolve_outputs(_source(ref_file, stress_key=None), frame.atoms, schema, frame.where)


def test_bad_frames_and_files(tmp_path, emt_atoms):
    atoms = emt_atoms[0].copy()
    atoms.info["REF_energy"] = float("nan")
    path = tmp_path / "nan.xyz"
    ase.io.write(path, [atoms], format="extxyz")
    source = AseSource(path, energy_key="REF_energy", forces_key=None, stress_key=None)
    frame = next(iter_frames(source))
    _, outputs = resolve_outputs(source, frame.atoms, None, frame.where)
    with pytest.raises(SchemaError, match=r"nan\.xyz: frame 0: label 'REF_energy' .* non-finite"):
        labelled_sample(frame.atoms, outputs, frame.where)
    weird = Atoms("Cu", positions=[[0, 0, 0]])
    weird.numbers[0] = 0
    with pytest.raises(SchemaError, match="atomic numbers must be in 1..118"):
        labelled_sample(weird, [], "w")
    with pytest.raises(ContainerError, match="no such file"):
        list(iter_frames(AseSource(tmp_path / "none.xyz")))
    junk = tmp_path / "junk.bin"
    junk.write_bytes(b"\x00\x01garbage" * 10)
    with pytest.raises(ContainerError, match="not a structure file ASE reads"):
        list(iter_frames(AseSource(junk)))
    broken = tmp_path / "broken.xyz"
    text = (tmp_path / "nan.xyz").read_text().splitlines()
    broken.write_text("\n".join(text + text[:5]) + "\n")
    with pytest.raises(ContainerError, match=r"broken\.xyz: frame 1: declares 32 atoms; the file holds 3 more lines"):
        list(iter_frames(AseSource(broken)))
    garbled = text + text
    garbled[len(text) + 2] = "Cu x y z"
    broken.write_text("\n".join(garbled) + "\n")
    with pytest.raises(ContainerError, match=r"broken\.xyz: frame 1: ASE cannot read it"):
        list(iter_frames(AseSource(broken)))
    with pytest.raises(SchemaError, match="clash"):
        AseSource(path, extra_keys=(("energy", "E"),))


def test_format_named_when_the_extension_does_not_tell(tmp_path, emt_atoms):
    path = tmp_path / "frames.out1"
    ase.io.write(path, emt_atoms[:2], format="extxyz")
    with pytest.raises(ContainerError, match="not a structure file ASE reads"):
        list(iter_frames(AseSource(path)))
    frames = list(iter_frames(AseSource(path, format="extxyz")))
    assert len(frames) == 2 and frames[1].atoms.get_chemical_formula() == emt_atoms[1].get_chemical_formula()


def test_config_type_key_names_the_info_key(tmp_path, emt_atoms):
    frames = []
    for i, atoms in enumerate(emt_atoms[:4]):
        a = atoms.copy()
        a.info["REF_energy"] = atoms.calc.results["energy"]
        a.info["kind"] = "bulk" if i % 2 else "slab"
        frames.append(a)
    path = tmp_path / "kinds.xyz"
    ase.io.write(path, frames, format="extxyz")
    kept = list(iter_frames(AseSource(path, config_types=("slab",), config_type_key="kind")))
    assert [f.number for f in kept] == [0, 2] and {f.config_type for f in kept} == {"slab"}
    assert len(list(iter_frames(AseSource(path, config_types=("slab",))))) == 0  # no 'config_type' key: "Default"

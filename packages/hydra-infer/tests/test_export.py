"""hydragnn-export: the written files against HydraCalculator, run as their users run them.

The AOTInductor package is compiled once per test session (about a minute), shared by the
pytest-xdist workers through a file lock; TorchScript and metatomic exports take a second.
"""

from __future__ import annotations

import copy
import json
import os
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
from ase import Atoms
from ase.build import bulk, molecule
from infer_helpers import STRESS_VARIABLES, tiny_model

from hydragnn.data import Normalizer
from hydragnn.infer import HydraCalculator
from hydragnn.infer.export import ExportedModel, ExportError, describe, export_model
from hydragnn.infer.export.cli import main as export_main
from hydragnn.models import save_artifact
from hydragnn.models.testing import missing_extra


def structures() -> dict[str, Atoms]:
    """Molecules and periodic cells of several sizes (orthorhombic and triclinic), Cu-Au."""
    cu_au = molecule("CH4")
    cu_au.numbers[:] = [29, 79, 79, 29, 79]
    cu_au.positions *= 2.2
    cubic = bulk("Cu", "fcc", a=3.62, cubic=True) * (3, 3, 3)  # 108 atoms
    cubic.numbers[::4] = 79
    cubic.rattle(0.05, seed=1)
    tri = bulk("Au", "fcc", a=4.0) * (2, 3, 2)  # primitive cell: triclinic, 12 atoms
    tri.numbers[::3] = 29
    tri.rattle(0.1, seed=2)
    slab = bulk("Cu", "fcc", a=3.62, cubic=True) * (2, 2, 1)  # periodic in x, y only
    slab.pbc = [True, True, False]
    slab.center(vacuum=4.0, axis=2)
    slab.rattle(0.05, seed=3)
    return {"molecule": cu_au, "cubic-108": cubic, "triclinic-12": tri, "slab": slab}


def reference(calc: HydraCalculator, atoms: Atoms) -> dict[str, np.ndarray]:
    periodic = bool(atoms.pbc.any())
    out = calc(
        atoms.positions,
        atoms.numbers,
        cell=atoms.cell.array if periodic else None,
        pbc=atoms.pbc if periodic else None,
        forces=True,
        stress=bool(atoms.pbc.all()),
    )
    return {k: v.double().numpy() for k, v in out.items()}


def assert_matches(exported: dict, ref: dict, atoms: Atoms, rtol: float) -> None:
    """Energy, forces, per-atom energies (and stress for 3-D cells) equal the calculator's."""
    scale = max(1.0, float(np.abs(ref["forces"]).max()))
    np.testing.assert_allclose(float(exported["energy"]), ref["energy"][0], rtol=rtol, atol=rtol)
    np.testing.assert_allclose(np.asarray(exported["forces"]), ref["forces"], rtol=0, atol=rtol * scale)
    if "atomic_energy" in ref:
        np.testing.assert_allclose(np.asarray(exported["atomic_energy"]), ref["atomic_energy"], rtol=rtol, atol=rtol)
    if atoms.pbc.all():
        stress = np.asarray(exported["stress"])
        np.testing.assert_allclose(stress, ref["stress"][0], rtol=0, atol=rtol * max(1.0, np.abs(ref["stress"]).max()))
        if "virial" in exported:  # the LAMMPS convention, -V * stress
            np.testing.assert_allclose(
                np.asarray(exported["virial"]), -atoms.get_volume() * stress, rtol=1e-6, atol=1e-12
            )


@pytest.fixture(scope="module")
def artifact(tmp_path_factory):
    return save_artifact(tiny_model(), tmp_path_factory.mktemp("export") / "model.hydra", species=[29, 79])


@pytest.fixture(scope="module")
def torchscript_file(artifact):
    return export_model(artifact, artifact.with_name("model.pt")).path


@pytest.fixture(scope="session")
def aoti_file(tmp_path_factory):
    """The AOTInductor package of the tiny model, compiled once for all workers of the session."""
    from filelock import FileLock

    shared = tmp_path_factory.getbasetemp().parent  # the same folder for every xdist worker
    path = shared / "hydragnn-export-tiny.pt2"
    with FileLock(str(path) + ".lock"):
        if not path.exists():
            model_path = save_artifact(tiny_model(), shared / "hydragnn-export-tiny.hydra", species=[29, 79])
            export_model(model_path, path)
    return path


def test_torchscript_matches_the_calculator(torchscript_file, artifact):
    """Molecule, slab, orthorhombic and triclinic cells, other sizes than the trace's: fp64 agreement to rounding."""
    calc = HydraCalculator(artifact)
    exported = ExportedModel(torchscript_file)
    assert exported.format == "torchscript"
    for name, atoms in structures().items():
        out = {k: v.numpy() for k, v in exported(atoms.positions, atoms.numbers, atoms.cell.array, atoms.pbc).items()}
        assert out["forces"].shape == (len(atoms), 3), name
        assert_matches(out, reference(calc, atoms), atoms, rtol=1e-9)


def test_aoti_matches_the_calculator(aoti_file, artifact):
    calc = HydraCalculator(artifact)
    exported = ExportedModel(aoti_file)
    assert exported.format == "aoti"
    assert exported.metadata["cutoff"] == calc.cutoff
    assert exported.metadata["species"] == [29, 79]
    for atoms in structures().values():
        out = {k: v.numpy() for k, v in exported(atoms.positions, atoms.numbers, atoms.cell.array, atoms.pbc).items()}
        assert_matches(out, reference(calc, atoms), atoms, rtol=1e-9)


def test_float32_export(tmp_path, artifact):
    report = export_model(artifact, tmp_path / "m32.pt", dtype="float32")
    assert report.dtype == "float32"
    exported = ExportedModel(report.path)
    atoms = structures()["cubic-108"]
    out = exported(atoms.positions, atoms.numbers, atoms.cell.array, atoms.pbc)
    assert out["forces"].dtype == torch.float32
    model32 = tiny_model().to(torch.float32)
    assert_matches(
        {k: v.double().numpy() for k, v in out.items()}, reference(HydraCalculator(model32), atoms), atoms, 1e-4
    )


def test_files_run_without_hydragnn(tmp_path, artifact, torchscript_file, aoti_file):
    """The .pt2, TorchScript and metatomic files load and run where hydragnn and torch_geometric
    cannot be imported: torch, ASE (and metatomic for its file) only."""
    meta_path = export_model(artifact, tmp_path / "model-mta.pt", format="metatomic").path
    atoms = structures()["triclinic-12"]
    atoms.write(tmp_path / "cell.extxyz")
    script = textwrap.dedent(
        f"""
        import json, sys
        for blocked in ("hydragnn", "torch_geometric"):
            sys.modules[blocked] = None  # any import of them fails
        import numpy as np, torch, ase.io
        from ase.neighborlist import neighbor_list
        atoms = ase.io.read({str(tmp_path / "cell.extxyz")!r})
        i, j, S = neighbor_list("ijS", atoms, 4.0)
        inputs = (torch.tensor(atoms.positions), torch.tensor(atoms.numbers), torch.tensor(atoms.cell.array),
                  torch.tensor(atoms.pbc), torch.tensor(np.stack([i, j])), torch.tensor(S, dtype=torch.float64))
        result = {{}}
        aoti = torch._inductor.aoti_load_package({str(aoti_file)!r})
        ts = torch.jit.load({str(torchscript_file)!r})
        for name, fn in (("aoti", aoti), ("torchscript", ts)):
            out = fn(*inputs)
            result[name] = {{"energy": float(out["energy"]), "forces": out["forces"].tolist()}}
        from metatomic_ase import MetatomicCalculator
        atoms.calc = MetatomicCalculator({str(meta_path)!r}, device="cpu")
        result["metatomic"] = {{"energy": atoms.get_potential_energy(), "forces": atoms.get_forces().tolist()}}
        assert not any(m == "hydragnn" or m.startswith(("hydragnn.", "torch_geometric")) for m, v in sys.modules.items() if v)
        print(json.dumps(result))
        """
    )
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    ref = reference(HydraCalculator(artifact), atoms)
    for name, out in result.items():
        assert out["energy"] == pytest.approx(ref["energy"][0], rel=1e-10), name
        np.testing.assert_allclose(np.array(out["forces"]), ref["forces"], rtol=0, atol=1e-9, err_msg=name)


def test_metatomic_in_ase_matches_the_calculator(tmp_path, artifact):
    """metatomic-ase (the engine computes forces and stress by autograd): energy, forces, stress
    and per-atom energies; describe() reads the metadata back."""
    path = export_model(artifact, tmp_path / "model-mta.pt", format="metatomic").path
    from hydragnn.infer.export.metatomic import pyg_index_select_restored

    with pyg_index_select_restored():
        from metatomic_ase import MetatomicCalculator
    calc = HydraCalculator(artifact)
    for name in ("molecule", "cubic-108", "triclinic-12"):
        atoms = structures()[name]
        atoms.calc = MetatomicCalculator(str(path), device="cpu")
        out = {"energy": atoms.get_potential_energy(), "forces": atoms.get_forces()}
        out["atomic_energy"] = atoms.get_potential_energies()
        if atoms.pbc.all():
            from ase.stress import voigt_6_to_full_3x3_stress

            out["stress"] = voigt_6_to_full_3x3_stress(atoms.get_stress())
        assert_matches(out, reference(calc, atoms), atoms, rtol=1e-9)
    assert describe(path)["format"] == "metatomic"


def test_normalized_energy_is_exported_in_ev(tmp_path):
    """An artifact trained on normalized per-atom energies: the file gives eV, forces scaled alike."""
    stats = {"energy": {"method": "standard", "shift": [-3.0], "scale": [2.5], "per_atom": True, "count": 10}}
    norm = Normalizer.from_dict({"format_version": 1, "variables": stats})
    path = save_artifact(tiny_model(), tmp_path / "n.hydra", normalization=norm.to_dict())
    exported = ExportedModel(export_model(path, tmp_path / "n.pt").path)
    atoms = structures()["triclinic-12"]
    out = {k: v.numpy() for k, v in exported(atoms.positions, atoms.numbers, atoms.cell.array, atoms.pbc).items()}
    ref = reference(HydraCalculator(path), atoms)
    raw = reference(HydraCalculator(tiny_model()), atoms)
    assert ref["energy"][0] == pytest.approx(12 * (2.5 * raw["energy"][0] - 3.0))  # the units really changed
    assert_matches(out, ref, atoms, rtol=1e-9)


def test_other_heads_and_fixed_charge(tmp_path):
    """Per-atom and per-structure heads come out in the calculator's units and shapes; a charge
    input is refused without a value and exported with the value given."""
    variables = copy.deepcopy(STRESS_VARIABLES)
    variables["inputs"].append({"name": "charge", "level": "graph", "dim": 1})
    variables["outputs"] += [
        {"name": "gap", "level": "graph", "dim": 2},
        {"name": "charges", "level": "node", "dim": 1},
    ]
    model = tiny_model(variables=variables, use_graph_attr_conditioning=True)
    with pytest.raises(ExportError, match="total charge"):
        export_model(model, tmp_path / "c.pt")
    assert not list(tmp_path.iterdir())  # nothing written
    exported = ExportedModel(export_model(model, tmp_path / "c.pt", charge=1.0).path)
    atoms = structures()["molecule"]
    out = exported(atoms.positions, atoms.numbers)
    ref = HydraCalculator(model)(atoms.positions, atoms.numbers, forces=True, charge=1.0)
    assert out["gap"].shape == (2,) and out["charges"].shape == (len(atoms),)
    torch.testing.assert_close(out["gap"], ref["gap"][0])
    torch.testing.assert_close(out["charges"], ref["charges"])
    torch.testing.assert_close(out["energy"], ref["energy"][0])
    assert exported.metadata["fixed_inputs"] == {"charge": 1.0}


@pytest.mark.parametrize("species", [[13, 28], [6]])
def test_a_model_of_other_species_exports(tmp_path, species):
    """A model trained without copper or gold (Ni-Al; carbon alone) exports and passes the check:
    the check structures hold only the model's species, which the calculator accepts."""
    from hydragnn.infer.export.check import check_structures
    from hydragnn.infer.model_info import model_info

    path = save_artifact(tiny_model(), tmp_path / "m.hydra", species=species)
    model = HydraCalculator(path).model
    for atoms in check_structures(model_info(model)):
        assert set(atoms.numbers.tolist()) <= set(species)
    report = export_model(path, tmp_path / "m.pt")
    assert max(report.errors.values()) <= report.tolerance
    assert ExportedModel(report.path).metadata["species"] == species


@pytest.mark.parametrize("radius", [1.5, 2.0])
def test_a_short_cutoff_model_exports(tmp_path, radius):
    """A model whose cutoff is shorter than the nearest-neighbour distance of the 3.6 Å fcc cell the
    trace used (2.55 Å): its example had no edges, the trace fixed the edge count, and the export
    was refused as 'depends on the example's sizes'. The cells shrink to the cutoff."""
    from hydragnn.infer.export.graph import fcc_lattice

    assert fcc_lattice(radius) / np.sqrt(2) < radius
    report = export_model(tiny_model(radius=radius), tmp_path / "m.pt")
    assert max(report.errors.values()) <= report.tolerance
    assert ExportedModel(report.path).cutoff == radius


@pytest.mark.parametrize(
    ("overrides", "reason"),
    [
        ({"max_neighbours": 4}, "max_neighbours=4"),
        ({"global_attn_engine": "GPS", "pe_dim": 3}, "positional encodings"),
        ({"enable_interatomic_potential": False}, "not an interatomic potential"),
    ],
)
def test_what_cannot_be_exported_is_refused(tmp_path, overrides, reason):
    variables = STRESS_VARIABLES
    if overrides.get("enable_interatomic_potential") is False:
        variables = copy.deepcopy(STRESS_VARIABLES)
        variables["outputs"] = [v for v in variables["outputs"] if v["name"] in ("energy",)]
    model = tiny_model(variables=variables, **overrides)
    with pytest.raises(ExportError, match=reason):
        export_model(model, tmp_path / "x.pt")
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize(
    ("mpnn_type", "overrides"),
    [
        ("PAINN", {}),
        ("PAINN", {"energy_layer_readout": True}),
        ("SchNet", {"zbl": True}),
        ("MACE", {"max_ell": 1, "node_max_ell": 1, "correlation": 2}),
        ("AllScAIP", {}),
    ],
)
def test_other_architectures_export(tmp_path, mpnn_type, overrides):
    """Equivariant (PAINN, also with per-layer energy readouts), the ZBL repulsion (float64 inside
    a float32 model; the check's random clusters have close contacts), e3nn tensor products (MACE: its
    dense path branches on the row count and must not be traced) and fairchem's all-pairs encoder
    (AllScAIP): the export's own check against the calculator passes, on sizes other than the
    trace's."""
    if reason := missing_extra(mpnn_type):
        pytest.skip(reason)
    report = export_model(tiny_model(mpnn_type=mpnn_type, **overrides), tmp_path / "m.pt")
    assert set(report.errors) >= {"energy", "forces", "stress"}
    assert max(report.errors.values()) <= report.tolerance


def test_a_branch_on_the_atom_count_is_refused(tmp_path):
    """A forward that takes another path above some size would be traced for the example's side
    only: the export names the branch instead of writing a file that is wrong for other sizes."""
    model = tiny_model()
    encode = model.encode

    def branching(inputs):
        emb = encode(inputs)
        return emb if inputs.x.shape[0] > 20 else emb  # a Python branch on the atom count

    model.encode = branching
    with pytest.raises(ExportError, match="branch on a size.*atoms"):
        export_model(model, tmp_path / "b.pt")
    assert not list(tmp_path.iterdir())


def test_cli(tmp_path, artifact, capsys):
    out = tmp_path / "cli.pt"
    assert export_main([str(artifact), str(out)]) == 0
    printed = capsys.readouterr().out
    assert "torchscript" in printed and "MB" in printed and "forces" in printed
    assert ExportedModel(out).metadata["weights_sha256"]
    assert export_main([str(tmp_path / "missing.hydra"), str(out)]) == 2
    assert "no such file" in capsys.readouterr().err
    assert export_main([str(artifact), str(tmp_path / "x.bin")]) == 2
    assert "--format" in capsys.readouterr().err
    capped = save_artifact(tiny_model(max_neighbours=4), tmp_path / "capped.hydra")
    assert export_main([str(capped), str(tmp_path / "capped.pt")]) == 2
    assert "max_neighbours" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["capped.hydra", "cli.pt"]


def test_bad_destinations_are_refused_before_the_trace_and_leave_nothing(tmp_path, artifact):
    """A folder as destination is refused at once; a missing folder is created; a file-size limit
    (as a full disk) is an ExportError from the CLI (rc 2, no abort) with no temporary file left."""
    import resource
    import subprocess
    import sys

    folder = tmp_path / "out"
    folder.mkdir()
    with pytest.raises(ExportError, match=r"out: is a folder: name the file to write in it"):
        export_model(artifact, folder, format="torchscript")
    made = export_model(artifact, tmp_path / "new" / "deeper" / "m.pt")
    assert made.path.is_file()
    limit = made.size_bytes // 2
    code = (
        "import resource, sys; "
        f"resource.setrlimit(resource.RLIMIT_FSIZE, ({limit}, {limit})); "
        "from hydragnn.infer.export.cli import main; "
        f"sys.exit(main([{str(artifact)!r}, {str(folder / 'm.pt')!r}]))"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert run.returncode == 2, run.stderr[-2000:]
    assert re.search(
        rf"{re.escape(str(folder / 'm.pt'))}: cannot write the exported file \(\d+ bytes\): File too large", run.stderr
    )
    assert sorted(p.name for p in folder.iterdir()) == []  # no temporary file left
    assert resource.getrlimit(resource.RLIMIT_FSIZE)  # (the limit applied to the child only)


def test_the_trust_rule_of_exported_files(tmp_path, artifact, torchscript_file, monkeypatch):
    """Exported files run code when loaded: a .hydra name or an artifact is never loaded as one,
    describe reads metadata without loading code, and sha256= refuses any other file before loading."""
    import shutil

    from hydragnn.infer.export.runtime import file_sha256
    from hydragnn.infer.lammps import _as_potential
    from hydragnn.models import ArtifactError

    expected = describe(torchscript_file)
    digest = file_sha256(torchscript_file)
    report = export_model(artifact, tmp_path / "again.pt")
    assert report.sha256 == file_sha256(report.path) and "SHA-256" in report.summary()
    disguised = tmp_path / "model.hydra"
    shutil.copy(torchscript_file, disguised)
    renamed_artifact = tmp_path / "artifact.pt"
    shutil.copy(artifact, renamed_artifact)

    def no_code(*args, **kwargs):
        raise AssertionError("torch.jit.load ran")

    monkeypatch.setattr(torch.jit, "load", no_code)
    assert describe(torchscript_file) == expected  # metadata without loading the code
    with pytest.raises(
        ExportError, match=r"model\.hydra: a \.hydra file is a model artifact, never loaded as an exported"
    ):
        ExportedModel(disguised)
    with pytest.raises(ArtifactError, match="not a HydraGNN model artifact"):
        _as_potential(disguised)  # the LAMMPS driver reads a .hydra name as an artifact only
    with pytest.raises(ExportError, match=r"artifact\.pt: a HydraGNN model artifact, not an exported model"):
        ExportedModel(renamed_artifact)
    with pytest.raises(ExportError, match=rf"SHA-256 {digest} is not the {'0' * 64} you expect"):
        ExportedModel(torchscript_file, sha256="0" * 64)
    with pytest.raises(ExportError, match=r"\.hydra names model artifacts"):
        export_model(artifact, tmp_path / "out.hydra", format="torchscript")
    monkeypatch.undo()
    assert ExportedModel(torchscript_file, sha256=digest.upper()).metadata == expected

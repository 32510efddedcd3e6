"""Regular-path correctness: the calculator equals the model, forces = -dE/dR, layouts agree,
stress = dE/d(strain) / V, artifacts load, normalization is undone."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from infer_helpers import CUTOFF, cluster, tiny_model

from hydragnn.data import Normalizer
from hydragnn.data.neighbors import radius_graph
from hydragnn.infer import HydraCalculator, InferenceError
from hydragnn.models import save_artifact


def test_matches_model_on_same_batch(model64, cuau_atoms):
    calc = HydraCalculator(model64)
    a = cuau_atoms[0]
    res = calc(a.positions, a.numbers, cell=a.cell.array, forces=True, stress=True)
    call = calc._check(a.positions, a.numbers, None, a.cell.array, None, None)
    batch = calc.build_batch(call)
    direct = model64(batch, compute_forces=True, compute_stress=True)
    ei, _ = radius_graph(torch.tensor(a.positions), CUTOFF, cell=torch.tensor(a.cell.array))
    assert batch.edge_index.shape == ei.shape
    torch.testing.assert_close(res["energy"], direct["energy"].reshape(-1))
    torch.testing.assert_close(res["forces"], direct["forces"])
    torch.testing.assert_close(res["atomic_energy"], direct["atomic_energy"].squeeze(-1))
    assert res["stress"].shape == (1, 3, 3)
    torch.testing.assert_close(res["stress"][0, 1, 2], direct["stress"][0, 3])
    assert not res["forces"].requires_grad


def test_forces_are_minus_finite_difference_gradient(model64):
    calc = HydraCalculator(model64)
    pos, z = cluster(6, seed=3)
    forces = calc(pos, z, forces=True)["forces"].numpy()
    h = 1e-5
    for i, k in [(0, 0), (2, 1), (5, 2)]:
        plus, minus = pos.copy(), pos.copy()
        plus[i, k] += h
        minus[i, k] -= h
        fd = -(float(calc(plus, z)["energy"][0]) - float(calc(minus, z)["energy"][0])) / (2 * h)
        assert forces[i, k] == pytest.approx(fd, rel=1e-6, abs=1e-9)


def test_energy_only_call_has_no_forces(model64):
    pos, z = cluster(5)
    res = HydraCalculator(model64)(pos, z)
    assert set(res) == {"energy", "atomic_energy"}


def test_dense_batch_equals_single_calls_and_flat(model64):
    calc = HydraCalculator(model64)
    structures = [cluster(n, seed=n) for n in (4, 7, 5)]
    nmax = 7
    coord = np.full((3, nmax, 3), np.nan)  # padded coordinates are ignored, even NaN
    numbers = np.zeros((3, nmax), dtype=int)
    for b, (p, z) in enumerate(structures):
        coord[b, : len(z)], numbers[b, : len(z)] = p, z
    dense = calc(coord, numbers, forces=True)
    assert dense["energy"].shape == (3,) and dense["forces"].shape == (3, nmax, 3)
    for b, (p, z) in enumerate(structures):
        single = calc(p, z, forces=True)
        torch.testing.assert_close(dense["energy"][b], single["energy"][0])
        torch.testing.assert_close(dense["forces"][b, : len(z)], single["forces"])
        assert torch.all(dense["forces"][b, len(z) :] == 0)
        torch.testing.assert_close(dense["atomic_energy"][b, : len(z)], single["atomic_energy"])
    flat_pos = np.concatenate([p for p, _ in structures])
    flat_z = np.concatenate([z for _, z in structures])
    mol_idx = np.repeat(np.arange(3), [len(z) for _, z in structures])
    flat = calc(flat_pos, flat_z, forces=True, mol_idx=mol_idx)
    torch.testing.assert_close(flat["energy"], dense["energy"])
    torch.testing.assert_close(flat["forces"], dense["forces"][torch.as_tensor(numbers) != 0])


def test_stress_matches_strain_finite_difference(model64, cuau_atoms):
    calc = HydraCalculator(model64)
    a = cuau_atoms[1]
    pos, cell = a.positions, a.cell.array
    stress = calc(pos, a.numbers, cell=cell, forces=True, stress=True)["stress"][0].numpy()
    volume = abs(np.linalg.det(cell))
    h = 1e-5
    for i, j in [(0, 0), (1, 2), (0, 1)]:
        eps = np.zeros((3, 3))
        eps[i, j] = eps[j, i] = h
        energies = []
        for sign in (1, -1):
            d = np.eye(3) + sign * eps
            energies.append(float(calc(pos @ d, a.numbers, cell=cell @ d)["energy"][0]))
        # d E / d eps_ij with a symmetric perturbation counts both (i, j) and (j, i) off the diagonal
        fd = (energies[0] - energies[1]) / (2 * h) / volume / (1 if i == j else 2)
        assert stress[i, j] == pytest.approx(fd, rel=1e-5, abs=1e-10)


def test_from_artifact_path(tmp_path, model64, cuau_atoms):
    path = save_artifact(model64, tmp_path / "m.hydra", species=[29, 79])
    a = cuau_atoms[2]
    from_path = HydraCalculator(path)(a.positions, a.numbers, cell=a.cell.array, forces=True)
    direct = HydraCalculator(model64)(a.positions, a.numbers, cell=a.cell.array, forces=True)
    torch.testing.assert_close(from_path["energy"], direct["energy"])
    torch.testing.assert_close(from_path["forces"], direct["forces"])
    assert HydraCalculator(path).info.species == frozenset({29, 79})


@pytest.mark.parametrize("per_atom", [False, True])
def test_normalization_is_undone(tmp_path, model64, per_atom):
    stats = {"energy": {"method": "standard", "shift": [-3.0], "scale": [2.5], "per_atom": per_atom, "count": 10}}
    norm = Normalizer.from_dict({"format_version": 1, "variables": stats})
    path = save_artifact(model64, tmp_path / "n.hydra", normalization=norm.to_dict())
    pos, z = cluster(6, seed=2)
    raw = HydraCalculator(model64)(pos, z, forces=True)
    res = HydraCalculator(path)(pos, z, forces=True)
    n = 6 if per_atom else 1
    expected = n * (2.5 * raw["energy"] - 3.0) if per_atom else 2.5 * raw["energy"] - 3.0
    torch.testing.assert_close(res["energy"], expected)
    torch.testing.assert_close(res["forces"], 2.5 * n * raw["forces"])
    torch.testing.assert_close(res["atomic_energy"].sum(), res["energy"][0])


def test_other_heads_are_returned_per_atom_and_per_structure():
    variables = {
        "inputs": [
            {"name": "atomic_number", "level": "node", "dim": 1},
            {"name": "pos", "level": "node", "dim": 3, "role": "position"},
        ],
        "outputs": [
            {"name": "energy", "level": "graph", "dim": 1},
            {"name": "gap", "level": "graph", "dim": 2},
            {"name": "forces", "level": "node", "dim": 3},
            {"name": "charges", "level": "node", "dim": 1},
        ],
    }
    calc = HydraCalculator(tiny_model(variables=variables))
    pos, z = cluster(5)
    res = calc(np.stack([pos, pos]), np.stack([z, z]), forces=True)
    assert res["gap"].shape == (2, 2) and res["charges"].shape == (2, 5)
    torch.testing.assert_close(res["charges"][0], res["charges"][1])


def test_charge_input_feeds_graph_attr():
    variables = {
        "inputs": [
            {"name": "atomic_number", "level": "node", "dim": 1},
            {"name": "pos", "level": "node", "dim": 3, "role": "position"},
            {"name": "charge", "level": "graph", "dim": 1},
        ],
        "outputs": [
            {"name": "energy", "level": "graph", "dim": 1},
            {"name": "gap", "level": "graph", "dim": 1},
            {"name": "forces", "level": "node", "dim": 3},
        ],
    }
    calc = HydraCalculator(tiny_model(variables=variables))
    assert calc.info.charge_input
    pos, z = cluster(5)
    neutral, charged = calc(pos, z, charge=0.0), calc(pos, z, charge=1.0)
    torch.testing.assert_close(calc(pos, z)["gap"], neutral["gap"])  # no charge: neutral
    assert not torch.allclose(neutral["gap"], charged["gap"])


CHARGE_SPIN_VARIABLES = {
    "inputs": [
        {"name": "atomic_number", "level": "node", "dim": 1},
        {"name": "pos", "level": "node", "dim": 3, "role": "position"},
        {"name": "spin", "level": "graph", "dim": 1},
        {"name": "charge", "level": "graph", "dim": 1},
    ],
    "outputs": [
        {"name": "energy", "level": "graph", "dim": 1},
        {"name": "forces", "level": "node", "dim": 3},
    ],
}


@pytest.mark.parametrize("mode", ["concat_node", "film"])
def test_charge_and_spin_inputs_condition_the_energy(mode):
    """Spin then charge in the schema: the calculator fills graph_attr in that order, 0 by default,
    and the ASE calculator reads atoms.info["charge"] / ["spin"]."""
    from ase import Atoms

    from hydragnn.infer import HydraASECalculator

    model = tiny_model(
        variables=CHARGE_SPIN_VARIABLES, use_graph_attr_conditioning=True, graph_attr_conditioning_mode=mode
    )
    with torch.no_grad():  # FiLM starts as the identity: give it something to do
        for p in model.conditioning.parameters():
            p.add_(0.1 * torch.randn_like(p))
    calc = HydraCalculator(model)
    assert calc.info.graph_inputs == ("spin", "charge")
    pos, z = cluster(5)
    plain = calc(pos, z, forces=True)
    torch.testing.assert_close(calc(pos, z, charge=0.0, spin=0.0)["energy"], plain["energy"])
    charged, spun = calc(pos, z, charge=1.0), calc(pos, z, spin=2.0)
    assert not torch.allclose(charged["energy"], plain["energy"])
    assert not torch.allclose(spun["energy"], plain["energy"])
    assert not torch.allclose(charged["energy"], spun["energy"])  # the two inputs are not swapped
    both = calc(pos, z, charge=1.0, spin=2.0, forces=True)
    # direct model call with graph_attr = [spin, charge]
    batch = calc.build_batch(calc._check(pos, z, 1.0, None, None, None, 2.0))
    torch.testing.assert_close(batch.graph_attr, torch.tensor([[2.0, 1.0]], dtype=torch.float64))
    atoms = Atoms(numbers=z, positions=pos)
    atoms.info.update(charge=1.0, spin=2.0)
    atoms.calc = HydraASECalculator(calc)
    assert atoms.get_potential_energy() == pytest.approx(float(both["energy"][0]), rel=1e-10)
    np.testing.assert_allclose(atoms.get_forces(), both["forces"].numpy(), rtol=1e-10, atol=1e-12)


def test_unsupported_graph_inputs_are_refused():
    variables = copy.deepcopy(CHARGE_SPIN_VARIABLES)
    variables["inputs"].append({"name": "temperature", "level": "graph", "dim": 1})
    with pytest.raises(InferenceError, match=r"at most one total charge and one spin.*temperature"):
        HydraCalculator(tiny_model(variables=variables))
    variables = copy.deepcopy(CHARGE_SPIN_VARIABLES)
    variables["inputs"][2] = {"name": "total_charge", "level": "graph", "dim": 1}  # two charges
    with pytest.raises(InferenceError, match="at most one total charge"):
        HydraCalculator(tiny_model(variables=variables))


def test_serves_the_chosen_energy_head(tmp_path):
    """A model with one energy head per training source serves the head asked for (from a model
    or an artifact, through the ASE calculator too); an unknown head is refused."""
    from ase import Atoms

    from hydragnn.infer import HydraASECalculator

    heads = [{"name": "mine", "reference_energies": {"Cu": -1.0, "Au": 2.0}}, {"name": "replay"}]
    model = tiny_model(seed=3, energy_heads=heads)
    pos, numbers = cluster(6, seed=2)
    per_head = {}
    for name in ("mine", "replay"):
        res = HydraCalculator(save_artifact(model, tmp_path / f"{name}.hydra"), head=name)(pos, numbers, forces=True)
        batch_model = tiny_model(seed=3, energy_heads=heads)
        batch_model.select_head(name)
        ref = HydraCalculator(batch_model)(pos, numbers, forces=True)
        torch.testing.assert_close(torch.as_tensor(res["energy"]), torch.as_tensor(ref["energy"]))
        per_head[name] = float(res["energy"][0])
        atoms = Atoms(numbers=numbers, positions=pos)
        atoms.calc = HydraASECalculator(tmp_path / f"{name}.hydra", head=name)
        assert abs(atoms.get_potential_energy() - per_head[name]) < 1e-8
    assert abs(per_head["mine"] - per_head["replay"]) > 1e-3  # different readouts and references
    with pytest.raises(InferenceError, match=r"head: energy head 'other': this model has \['mine', 'replay'\]"):
        HydraCalculator(model, head="other")

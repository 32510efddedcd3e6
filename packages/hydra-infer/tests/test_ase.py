"""ASE adapter: properties, Voigt stress, and NVE molecular dynamics on an EMT-trained model.

NVE measurement (tiny SchNet fp32, trained ~5 s on 32 EMT Cu-Au cells; 32-atom cell, 300 K,
VelocityVerlet 1 fs, 150 steps, seed 0; torch 2.13 CPU): max |E_tot(t) - E_tot(0)| / N =
3.1e-6 eV/atom. The threshold, 3e-5 eV/atom, sits 10x above it (fp32 round-off varies with
the machine); a non-conservative force (e.g. forces not equal to -dE/dR) drifts far more.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from ase import Atoms, units
from ase.calculators.fd import calculate_numerical_stress
from ase.md.velocitydistribution import thermalize_momenta
from ase.md.verlet import VelocityVerlet
from ase.stress import full_3x3_to_voigt_6_stress
from infer_helpers import STRESS_VARIABLES, cluster, tiny_arch

from hydragnn.data import Schema, prepare
from hydragnn.data.emt import generate_cuau, generate_cuau_atoms
from hydragnn.data.neighbors import add_edges
from hydragnn.infer import HydraASECalculator, HydraCalculator
from hydragnn.models import build_model

DRIFT_THRESHOLD = 3e-5  # eV/atom


def test_properties(model64, cuau_atoms):
    atoms = cuau_atoms[0].copy()
    calc = HydraCalculator(model64)
    atoms.calc = HydraASECalculator(calc)
    res = calc(atoms.positions, atoms.numbers, cell=atoms.cell.array, forces=True, stress=True)
    assert atoms.get_potential_energy() == pytest.approx(float(res["energy"][0]))
    assert atoms.get_potential_energy(force_consistent=True) == pytest.approx(float(res["energy"][0]))
    np.testing.assert_allclose(atoms.get_forces(), res["forces"].numpy())
    stress = atoms.get_stress()
    np.testing.assert_allclose(stress, full_3x3_to_voigt_6_stress(res["stress"][0].numpy()))
    np.testing.assert_allclose(atoms.get_potential_energies(), res["atomic_energy"].numpy())
    assert atoms.get_potential_energies().sum() == pytest.approx(atoms.get_potential_energy())
    # ASE's own finite-difference check of the stress (sign convention and Voigt order)
    np.testing.assert_allclose(calculate_numerical_stress(atoms, eps=1e-5), stress, atol=1e-7)


def test_molecule_without_cell(model64):
    pos, z = cluster(5)
    atoms = Atoms(numbers=z, positions=pos)
    atoms.calc = HydraASECalculator(model64)
    assert np.isfinite(atoms.get_potential_energy())
    assert atoms.get_forces().shape == (5, 3)


def _train_emt_model() -> torch.nn.Module:
    variables = {"inputs": STRESS_VARIABLES["inputs"], "outputs": STRESS_VARIABLES["outputs"][:3]}
    schema = Schema.from_dict(variables)
    data = [add_edges(prepare(s, schema), 4.0) for s in generate_cuau(32, seed=0)]
    comp = torch.tensor([[float((d.atomic_number == z).sum()) for z in (29, 79)] for d in data], dtype=torch.float64)
    energy = torch.tensor([float(d.energy) for d in data], dtype=torch.float64).unsqueeze(-1)
    ref = torch.linalg.lstsq(comp, energy).solution.squeeze(-1)
    arch = tiny_arch(
        hidden_dim=16,
        num_radial=16,
        precision="fp32",
        reference_energies={"29": float(ref[0]), "79": float(ref[1])},
        task_weights=[3.0, 0.0, 1.0],  # per-atom energy MSE x 3 (energy_loss "per_atom"), forces x 1
        loss_function_type="mse",
    )
    torch.manual_seed(0)
    model = build_model(arch, schema)
    from torch_geometric.data import Batch

    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    gen = torch.Generator().manual_seed(0)
    for _ in range(10):
        model.train()
        order = torch.randperm(len(data), generator=gen).tolist()
        for start in range(0, len(data), 4):
            batch = Batch.from_data_list([data[i] for i in order[start : start + 4]])
            loss, _ = model.loss(model(batch), batch)
            opt.zero_grad()
            loss.backward()
            opt.step()
    return model.eval()


def test_nve_energy_drift_is_bounded():
    model = _train_emt_model()
    atoms = generate_cuau_atoms(1, seed=5)[0]
    atoms.calc = HydraASECalculator(model, species=[29, 79])
    start = atoms.positions.copy()
    thermalize_momenta(atoms, temperature_K=300, rng=np.random.default_rng(0))
    totals = []
    dyn = VelocityVerlet(atoms, timestep=1.0 * units.fs)
    dyn.attach(lambda: totals.append(atoms.get_total_energy()), interval=1)
    dyn.run(150)
    drift = np.max(np.abs(np.array(totals) - totals[0])) / len(atoms)
    print(f"NVE drift: {drift:.3e} eV/atom over {len(totals)} steps")
    assert np.max(np.linalg.norm(atoms.positions - start, axis=1)) > 0.02  # the atoms moved
    assert drift < DRIFT_THRESHOLD

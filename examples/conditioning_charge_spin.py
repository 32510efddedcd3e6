#!/usr/bin/env python3
"""Graph-level conditioning: an interatomic potential that knows a cluster's charge and spin.

Run it (under a minute on a laptop CPU)::

    python examples/conditioning_charge_spin.py [--out DIR] [--structures 240] [--epochs 40]

What it does:

1. Builds small Cu–Au clusters (13–19 atoms: an fcc atom and its first one or two neighbour
   shells, random Au sites, a 0.1 Å rattle; deterministic for ``--seed``) and gives each a total
   charge ``Q`` in {-2, ..., +2} and a spin ``M`` (number of unpaired electrons, 2S) of the
   parity the electron count allows.
2. Labels them with real, deterministic physics plus two documented textbook terms. ASE's EMT
   potential gives the neutral, spin-unpolarised energy and forces; EMT knows nothing about
   charge or spin, so the target adds

   * a charging energy: a conducting sphere of radius ``R`` holding ``Q`` electrons' charge,
     ``E_Q = k_e Q^2 / (2 R)`` with ``k_e = 14.3996 eV Å``, ``R = sqrt(5/3) R_g + r_a`` (the
     sphere with the cluster's radius of gyration ``R_g`` of the atom centres, plus a metallic
     atomic radius ``r_a = 1.4 Å``). It depends on the geometry, so it also adds forces
     ``-dE_Q/dpos`` (outwards: a charged cluster wants to expand);
   * a spin-polarisation cost of a Pauli paramagnet (free-electron metal, no exchange):
     ``E_M = M^2 / (4 N g_F)`` with ``g_F = 0.3`` states / eV / atom, N atoms (no forces).

   This is a model, not DFT: it is chosen because it is simple, smooth, physically sensible in
   sign and size (E_Q is ~1–6 eV here, E_M up to ~0.6 eV) and exactly reproducible.
3. Trains a SchNet MLIP with ``use_graph_attr_conditioning`` (``concat_node``: charge and spin
   are appended to every atom's embedding) from ``examples/conditioning_charge_spin.json``
   through the same pipeline as ``hydragnn-train`` (``hydragnn.train.pipeline.run_training``).
4. Shows that the model uses the graph inputs: the test energy error with the true charge and
   spin against the error when every cluster is presented as neutral and unpolarised, and, for
   one test cluster, the predicted energy change with the charge next to the reference.
"""

from __future__ import annotations

import argparse
import json
import math
import pathlib
import sys
import time

import numpy as np
import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]
K_E = 14.3996  # Coulomb constant, eV Å / e^2
ATOM_RADIUS = 1.4  # Å, metallic radius added to the sphere radius
G_F = 0.3  # states / eV / atom, density of states at the Fermi level (free-electron Cu is ~0.3)
CHARGES = (-2, -1, 0, 1, 2)


def make_cluster(rng: np.random.Generator):
    """One neutral Cu–Au cluster (13–19 atoms) labelled with EMT (energy and forces)."""
    from ase.build import bulk
    from ase.calculators.emt import EMT
    from ase.calculators.singlepoint import SinglePointCalculator

    au_fraction = float(rng.choice([0.0, 0.25, 0.5, 0.75, 1.0]))
    a = 3.59 * (1.0 - au_fraction) + 4.056 * au_fraction  # EMT's Cu and Au lattice constants (Vegard)
    crystal = bulk("Cu", "fcc", a=a, cubic=True).repeat((3, 3, 3))
    centre = crystal.positions[np.argmin(np.linalg.norm(crystal.positions - crystal.cell.sum(0) / 2, axis=1))]
    dist = np.linalg.norm(crystal.positions - centre, axis=1)
    shells = int(rng.integers(1, 3))  # first shell (12 neighbours) or first two shells (+6)
    atoms = crystal[dist < a * (0.8 if shells == 1 else 1.1)]
    atoms.pbc, atoms.cell = False, np.zeros((3, 3))
    atoms.positions = atoms.positions - centre + rng.normal(0.0, 0.1, (len(atoms), 3))
    numbers = np.full(len(atoms), 29)
    numbers[rng.permutation(len(atoms))[: int(round(au_fraction * len(atoms)))]] = 79
    atoms.numbers = numbers
    atoms.calc = EMT()
    energy, forces = atoms.get_potential_energy(), atoms.get_forces()
    atoms.calc = SinglePointCalculator(atoms, energy=energy, forces=forces)
    return atoms


def charging_energy(pos: np.ndarray, charge: float) -> tuple[float, np.ndarray]:
    """Conducting-sphere charging energy ``k_e Q^2 / (2 R)`` and its forces ``[N, 3]`` (eV, eV/Å)."""
    n = len(pos)
    rel = pos - pos.mean(axis=0)
    rg = math.sqrt(float((rel**2).sum()) / n)
    radius = math.sqrt(5.0 / 3.0) * rg + ATOM_RADIUS
    energy = K_E * charge**2 / (2.0 * radius)
    # dR/dpos_i = sqrt(5/3) (pos_i - centre) / (N R_g); F = -dE/dR dR/dpos
    forces = K_E * charge**2 / (2.0 * radius**2) * math.sqrt(5.0 / 3.0) * rel / (n * rg)
    return energy, forces


def spin_energy(spin: int, n_atoms: int) -> float:
    """Pauli-paramagnet spin-polarisation cost ``M^2 / (4 N g_F)`` (eV)."""
    return spin**2 / (4.0 * n_atoms * G_F)


def lowest_spin(numbers: np.ndarray, charge: int) -> int:
    """0 or 1: the parity of the electron count ``sum(Z) - Q``."""
    return int((int(numbers.sum()) - charge) % 2)


def labelled_samples(n_structures: int, seed: int) -> list:
    """Raw samples with ``total_charge [1, 1]``, ``spin [1, 1]``, ``energy [1, 1]``, ``forces [N, 3]``."""
    from hydragnn.data import atoms_to_sample

    rng = np.random.default_rng(seed)
    samples = []
    for _ in range(n_structures):
        atoms = make_cluster(rng)
        charge = int(rng.choice(CHARGES))
        spin = lowest_spin(atoms.numbers, charge) + 2 * int(rng.integers(0, 2))
        e_q, f_q = charging_energy(atoms.positions, charge)
        sample = atoms_to_sample(atoms, dtype=torch.float32)
        sample.energy = torch.tensor([[atoms.get_potential_energy() + e_q + spin_energy(spin, len(atoms))]])
        sample.forces = torch.as_tensor(atoms.get_forces() + f_q, dtype=torch.float32)
        sample.total_charge = torch.tensor([[float(charge)]])
        sample.spin = torch.tensor([[float(spin)]])
        for key in ("energy_per_atom", "atomic_energy"):
            if key in sample:
                del sample[key]
        samples.append(sample)
    return samples


@torch.no_grad()
def energy_mae_per_atom(model, samples, graph_attr=None) -> float:
    """MAE of the energy per atom (eV/atom); ``graph_attr [B, 2]`` replaces the batch's if given."""
    from torch_geometric.data import Batch

    batch = Batch.from_data_list(samples)
    if graph_attr is not None:
        batch.graph_attr = graph_attr
    pred = model(batch, compute_forces=False)["energy"].reshape(-1)
    true = batch.graph_output[:, 0]  # energy is the first (only) graph output
    natoms = torch.bincount(batch.batch, minlength=batch.num_graphs)
    return float(((pred - true).abs() / natoms).mean())


def _with(batch, graph_attr: torch.Tensor):
    """A copy of ``batch`` with ``graph_attr [B, 2]`` (charge, spin) replaced."""
    out = batch.clone()
    out.graph_attr = graph_attr
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path("conditioning_charge_spin_output"))
    parser.add_argument("--config", type=pathlib.Path, default=ROOT / "examples" / "conditioning_charge_spin.json")
    parser.add_argument("--structures", type=int, default=240)
    parser.add_argument("--epochs", type=int, default=None, help="override NeuralNetwork.Training.num_epoch")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--verbosity", type=int, default=1)
    args = parser.parse_args(argv)

    from torch_geometric.data import Batch

    from hydragnn.data import open_dataset, write_dataset
    from hydragnn.models import load_artifact
    from hydragnn.train.data import prepare_samples
    from hydragnn.train.pipeline import run_training

    torch.set_num_threads(1)  # tiny graphs: more intra-op threads only add overhead
    args.out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    samples = labelled_samples(args.structures, args.seed)
    charging = [charging_energy(s.pos.double().numpy(), float(s.total_charge))[0] for s in samples]
    print(
        f"[1/3] {len(samples)} Cu-Au clusters ({min(s.num_nodes for s in samples)}-{max(s.num_nodes for s in samples)} "
        f"atoms), EMT + charging + spin terms, in {time.perf_counter() - t0:.1f} s; charging energy "
        f"{min(charging):.2f}-{max(charging):.2f} eV",
        flush=True,
    )
    data_path = write_dataset(args.out / "charged_cuau_clusters.pkl", samples, "pickle")

    config = json.loads(args.config.read_text())
    config["Dataset"]["path"] = str(data_path)
    if args.epochs is not None:
        config["NeuralNetwork"]["Training"]["num_epoch"] = args.epochs
    arch = config["NeuralNetwork"]["Architecture"]
    print(
        f"[2/3] training {arch['mpnn_type']} conditioned on total_charge and spin "
        f"({arch['graph_attr_conditioning_mode']}), {config['NeuralNetwork']['Training']['num_epoch']} epochs",
        flush=True,
    )
    t0 = time.perf_counter()
    metrics = run_training(config, args.out / "run", verbosity=args.verbosity, overwrite=True)
    print(f"      trained in {time.perf_counter() - t0:.0f} s; artifact {metrics['paths']['artifact']}", flush=True)
    for name, r in metrics["test"]["mae"].items():
        print(f"      test {name:8s} MAE {r['mae']:.4f} {r['unit']}")

    model = load_artifact(metrics["paths"]["artifact"]).eval()
    container = open_dataset(metrics["paths"]["test_set"])
    test = prepare_samples([container[i] for i in range(len(container))], model.schema, model.cutoff)
    true_attr = torch.cat([s.graph_attr for s in test])
    neutral = torch.zeros_like(true_attr)
    neutral[:, 1] = torch.tensor([float(lowest_spin(s.x[:, 0].long().numpy(), 0)) for s in test])
    mae_true = energy_mae_per_atom(model, test)
    mae_neutral = energy_mae_per_atom(model, test, neutral)
    print("[3/3] does the model use charge and spin? (held-out clusters)")
    print(f"      energy MAE with the true charge and spin:             {mae_true:.4f} eV/atom")
    print(f"      energy MAE when told every cluster is neutral, M=0/1: {mae_neutral:.4f} eV/atom")

    probe = test[0]
    numbers = probe.x[:, 0].long().numpy()
    pos = probe.pos.double().numpy()
    n = probe.num_nodes
    print(f"      one test cluster ({n} atoms): E(Q, lowest M) - E(0, lowest M), eV")
    print("        Q    reference   model")
    base_attr = torch.tensor([[0.0, float(lowest_spin(numbers, 0))]])
    rows = []
    for q in CHARGES:
        m = lowest_spin(numbers, q)
        ref = charging_energy(pos, q)[0] + spin_energy(m, n) - spin_energy(lowest_spin(numbers, 0), n)
        with torch.no_grad():
            batch = Batch.from_data_list([probe])
            e_q = model(_with(batch, torch.tensor([[float(q), float(m)]])), compute_forces=False)["energy"]
            e_0 = model(_with(batch, base_attr), compute_forces=False)["energy"]
        rows.append((q, ref, float(e_q - e_0)))
        print(f"       {q:+d}   {ref:8.3f}   {float(e_q - e_0):8.3f}")
    summary = {
        "structures": len(samples),
        "test_mae": metrics["test"]["mae"],
        "energy_mae_true_inputs_eV_per_atom": mae_true,
        "energy_mae_neutral_inputs_eV_per_atom": mae_neutral,
        "charge_response": [{"Q": q, "reference_eV": r, "model_eV": p} for q, r, p in rows],
    }
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(f"      summary: {args.out / 'summary.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

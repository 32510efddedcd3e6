#!/usr/bin/env python3
"""Serve a potential trained by ``hydragnn-train examples/own_data/train.json``: compare it with
EMT on a fresh cell, then run NVE molecular dynamics in ASE and report the energy drift.

    python examples/own_data/serve.py runs/own_data/model.hydra
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from ase import units
from ase.calculators.emt import EMT
from ase.md.velocitydistribution import thermalize_momenta
from ase.md.verlet import VelocityVerlet

from hydragnn.data.emt import generate_bulk_atoms
from hydragnn.infer import HydraASECalculator


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("artifact", help="the trained model (model.hydra)")
    parser.add_argument("--steps", type=int, default=200)
    args = parser.parse_args()

    atoms = generate_bulk_atoms(1, 108, seed=99, rattle=0.1)[0]  # larger than any training cell
    reference = atoms.copy()
    reference.calc = EMT()
    atoms.calc = HydraASECalculator(args.artifact)
    e_model, e_emt = atoms.get_potential_energy(), reference.get_potential_energy()
    f_err = np.abs(atoms.get_forces() - reference.get_forces()).mean()
    print(
        f"{len(atoms)}-atom cell: energy {e_model:.4f} eV (EMT {e_emt:.4f}; "
        f"{1000 * abs(e_model - e_emt) / len(atoms):.1f} meV/atom apart), force MAE {1000 * f_err:.1f} meV/Å"
    )

    thermalize_momenta(atoms, temperature_K=300, rng=np.random.default_rng(0))
    dyn = VelocityVerlet(atoms, timestep=1.0 * units.fs)
    start = atoms.get_total_energy()
    t0 = time.perf_counter()
    dyn.run(args.steps)
    wall = time.perf_counter() - t0
    drift = abs(atoms.get_total_energy() - start) / len(atoms)
    print(f"NVE, 1 fs, {args.steps} steps: |ΔE_total| {1000 * drift:.3f} meV/atom, {args.steps / wall:.0f} steps/s")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Serve a potential trained by ``hydragnn-train examples/own_data/train.json`` (or on any other
EMT fcc metals): compare it with EMT on a fresh cell of the model's own species, then run NVE
molecular dynamics in ASE and report the energy drift.

    python examples/own_data/serve.py runs/own_data/model.hydra
"""

from hydragnn.models.execution import configure_threads

configure_threads()  # first, before torch loads: OpenMP then sleeps instead of spinning on a shared machine

import argparse  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402
from ase import units  # noqa: E402
from ase.calculators.emt import EMT  # noqa: E402
from ase.data import chemical_symbols  # noqa: E402
from ase.md.velocitydistribution import thermalize_momenta  # noqa: E402
from ase.md.verlet import VelocityVerlet  # noqa: E402

from hydragnn.data.emt import EMT_METALS, generate_alloy_atoms  # noqa: E402
from hydragnn.infer import HydraASECalculator, HydraCalculator  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("artifact", help="the trained model (model.hydra)")
    parser.add_argument("--steps", type=int, default=200)
    args = parser.parse_args()

    calc = HydraCalculator(args.artifact)
    symbols = [chemical_symbols[z] for z in sorted(calc.info.species or ())]
    if not symbols or len(symbols) > 2 or not set(symbols) <= set(EMT_METALS):
        sys.exit(f"serve.py builds fcc cells of one or two of EMT's metals {list(EMT_METALS)}; the model has {symbols}")
    # larger than any training cell, half and half where the model knows two elements
    atoms = generate_alloy_atoms(symbols, 1, 108, seed=99, compositions=(0.5,), rattle=0.1)[0]
    reference = atoms.copy()
    reference.calc = EMT()
    atoms.calc = HydraASECalculator(calc, skin=0.5)
    e_model, e_emt = atoms.get_potential_energy(), reference.get_potential_energy()
    f_err = np.abs(atoms.get_forces() - reference.get_forces()).mean()
    print(
        f"{len(atoms)}-atom {'-'.join(symbols)} cell: energy {e_model:.4f} eV (EMT {e_emt:.4f}; "
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

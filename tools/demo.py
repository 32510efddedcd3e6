#!/usr/bin/env python3
"""The main job.

1. The data pipeline, briefly, on the EMT CuAu reference set: generate, prepare against the
   schema, build periodic neighbor lists, fit normalization statistics, write every container,
   read each back tensor-exact, batch with a node budget.
2. Train a multi-headed MLIP (total energy as a graph head, per-atom energy as a node head,
   forces from the energy gradient) with ``examples/cuau_mlip.json`` through the same pipeline
   function as ``hydragnn-train``; print the test errors per head in eV/atom and eV/Å, the
   artifact path and the parity plots.
3. Serve the artifact with hydra-infer's ASE calculator and run NVE molecular dynamics,
   reporting the energy drift.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time

from hydragnn.models.execution import get_profile

get_profile().prefer_passive_waiting()  # before torch loads, as hydragnn-train does

# isort: split
import torch  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _equal(a, b) -> bool:
    if set(a.keys()) != set(b.keys()):
        return False
    for key in a.keys():
        x, y = a[key], b[key]
        if isinstance(x, torch.Tensor):
            if not (isinstance(y, torch.Tensor) and x.dtype == y.dtype and torch.equal(x, y)):
                return False
        elif x != y:
            return False
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path("demo_output"))
    parser.add_argument("--structures", type=int, default=100, help="structures of the data-pipeline checks")
    parser.add_argument("--config", type=pathlib.Path, default=ROOT / "examples" / "cuau_mlip.json")
    parser.add_argument("--epochs", type=int, default=None, help="override NeuralNetwork.Training.num_epoch")
    parser.add_argument("--verbosity", type=int, default=2)
    parser.add_argument("--cutoff", type=float, default=5.0)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    from hydragnn.data import Schema, prepare
    from hydragnn.data.containers import FORMATS, open_dataset, write_dataset
    from hydragnn.data.emt import CUAU_VARIABLES, generate_cuau
    from hydragnn.data.loaders import create_dataloaders
    from hydragnn.data.neighbors import add_edges
    from hydragnn.data.normalize import Normalizer

    args.out.mkdir(parents=True, exist_ok=True)
    print(f"[1/6] generating {args.structures} CuAu_32atoms structures with ASE's EMT (seed {args.seed})", flush=True)
    t0 = time.perf_counter()
    raw = generate_cuau(n_structures=args.structures, seed=args.seed)
    t_gen = time.perf_counter() - t0
    print(f"      {len(raw)} structures in {t_gen:.1f} s", flush=True)

    print(
        f"[2/6] preparing against the schema and building periodic neighbor lists (cutoff {args.cutoff} Å)", flush=True
    )
    schema = Schema.from_dict(CUAU_VARIABLES)
    t0 = time.perf_counter()
    samples = [add_edges(prepare(s, schema, index=i), args.cutoff) for i, s in enumerate(raw)]
    t_prep = time.perf_counter() - t0
    edges = [s.edge_index.shape[1] for s in samples]
    print(f"      {len(samples)} samples in {t_prep:.1f} s; edges per structure {min(edges)}–{max(edges)}", flush=True)

    n_train = int(0.8 * len(samples))
    norm = Normalizer.fit(samples[:n_train], names=["energy", "forces"])

    print(f"[3/6] writing and reading back every container format under {args.out}", flush=True)
    rows = []
    for fmt in FORMATS:
        path = args.out / f"cuau_32atoms.{ {'pickle': 'pkl', 'pt': 'pt', 'adios': 'bp'}[fmt] }"
        t0 = time.perf_counter()
        write_dataset(
            path,
            samples,
            fmt,
            schema=schema,
            normalization=norm.to_dict(),
            metadata={"source": "EMT", "cutoff": args.cutoff},
        )
        t_write = time.perf_counter() - t0
        t0 = time.perf_counter()
        ds = open_dataset(path)
        back = [ds[i] for i in range(len(ds))]
        t_read = time.perf_counter() - t0
        exact = len(back) == len(samples) and all(_equal(a, b) for a, b in zip(samples, back, strict=True))
        if not exact:
            print(f"      {fmt}: round trip NOT exact", file=sys.stderr)
            return 1
        if ds.schema != schema or ds.normalization != norm.to_dict():
            print(f"      {fmt}: schema or normalization not stored", file=sys.stderr)
            return 1
        rows.append((fmt, path.name, len(samples) / t_write, len(samples) / t_read))
    for fmt, name, w, r in rows:
        print(
            f"      {fmt:7s} {name:22s} write {w:8.0f} samples/s   read {r:8.0f} samples/s   tensor-exact", flush=True
        )

    print("[4/6] batching with a node budget of 256 atoms", flush=True)
    train, val, test = open_dataset(args.out / "cuau_32atoms.bp"), samples[n_train:], samples[n_train:]
    batching = {
        "mode": "node_budget",
        "max_nodes": 256,
        "max_graphs": 16,
        "oversized_sample": "error",
        "seed": args.seed,
    }
    train_loader, _, _ = create_dataloaders(train, val, test, batch_size=8, batching=batching)
    sizes = [int(b.num_nodes) for b in train_loader]
    print(f"      {len(sizes)} training batches of {min(sizes)}–{max(sizes)} atoms (budget 256)", flush=True)

    energies = torch.cat([s.energy.reshape(-1) for s in samples])
    summary = {
        "structures": len(samples),
        "atoms_per_structure": int(samples[0].num_nodes),
        "energy_eV": [float(energies.min()), float(energies.max())],
        "edges_per_structure": [min(edges), max(edges)],
        "generation_s": round(t_gen, 2),
        "throughput_samples_per_s": {fmt: {"write": round(w), "read": round(r)} for fmt, _, w, r in rows},
        "normalization": norm.to_dict(),
    }
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2))
    print(f"[5/6] data summary written to {args.out / 'summary.json'}", flush=True)

    from hydragnn.train.pipeline import run_training

    config = json.loads(args.config.read_text())
    if args.epochs is not None:
        config["NeuralNetwork"]["Training"]["num_epoch"] = args.epochs
    arch = config["NeuralNetwork"]["Architecture"]
    print(
        f"[6/6] training a multi-headed MLIP ({arch['mpnn_type']}, energy + per-atom energy + forces = -dE/dpos) "
        f"from {args.config.name}: {config['Dataset']['generator']['n_structures']} structures, "
        f"{config['NeuralNetwork']['Training']['num_epoch']} epochs",
        flush=True,
    )
    t0 = time.perf_counter()
    metrics = run_training(config, args.out / "mlip_run", verbosity=args.verbosity, overwrite=True)
    wall = time.perf_counter() - t0
    mae = metrics["test"]["mae"]
    print(f"      trained in {wall:.0f} s")
    if args.verbosity < 1:  # the run itself printed nothing: the best epoch and the test errors here
        print(f"      best epoch {metrics['best_epoch']} (val loss {metrics['best_val_loss']:.4g})")
        print("      test errors per head (held-out structures):")
        for name, r in mae.items():
            print(f"        {name:14s} MAE {r['mae']:.4f} {r['unit']}")
    paths = metrics["paths"]
    print(f"      artifact:    {paths['artifact']}")
    if paths.get("log"):
        print(f"      log:         {paths['log']}")
    print(f"      config:      {paths['config']}")
    print(f"      metrics:     {paths['metrics']}")
    print(f"      tensorboard: {paths['tensorboard']}")
    for plot in paths.get("plots", []):
        print(f"      parity plot: {plot}")
    summary["mlip"] = {"wall_s": round(wall, 1), "best_epoch": metrics["best_epoch"], "test_mae": mae, "paths": paths}
    summary["md"] = _md_from_artifact(paths["artifact"], args.seed)
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2))
    print(NEXT.format(artifact=paths["artifact"]), flush=True)
    return 0


NEXT = """
Next, with your own data (. .nox/demo/bin/activate puts these commands on the PATH):
  python examples/own_data/make_data.py                                # or your extxyz, labels under your keys
  hydragnn-train examples/own_data/train.json --run-dir runs/own_data  # the file names and keys are in the config
  hydragnn-evaluate runs/own_data/model.hydra examples/own_data/test.xyz
  hydragnn-export runs/own_data/model.hydra model.pt2                  # for LAMMPS, i-PI, metatomic engines
  python examples/own_data/serve.py runs/own_data/model.hydra          # ASE molecular dynamics
This demo's model: {artifact}. Every config key: packages/hydra-train/README.md (on the site: nox -s docs)."""


def _md_from_artifact(artifact: str, seed: int, steps: int = 100) -> dict:
    """Serve the trained artifact with hydra-infer and run NVE molecular dynamics in ASE."""
    import numpy as np
    from ase import units
    from ase.md.velocitydistribution import thermalize_momenta
    from ase.md.verlet import VelocityVerlet

    from hydragnn.data.emt import generate_cuau_atoms
    from hydragnn.infer import HydraASECalculator

    atoms = generate_cuau_atoms(1, seed=seed + 1000)[0]
    atoms.calc = HydraASECalculator(artifact)
    thermalize_momenta(atoms, temperature_K=300, rng=np.random.default_rng(seed))
    dyn = VelocityVerlet(atoms, timestep=1.0 * units.fs)
    start = atoms.get_potential_energy() + atoms.get_kinetic_energy()
    drift = 0.0
    t0 = time.perf_counter()
    for _ in range(steps):
        dyn.run(1)
        drift = max(drift, abs(atoms.get_potential_energy() + atoms.get_kinetic_energy() - start) / len(atoms))
    wall = time.perf_counter() - t0
    print(
        f"      NVE molecular dynamics from the artifact (ASE VelocityVerlet, 1 fs, {steps} steps, "
        f"{len(atoms)} atoms): max |ΔE_total| {drift:.2e} eV/atom, {steps / wall:.0f} steps/s",
        flush=True,
    )
    return {"steps": steps, "max_energy_drift_eV_per_atom": float(drift), "steps_per_s": round(steps / wall, 1)}


if __name__ == "__main__":
    sys.exit(main())

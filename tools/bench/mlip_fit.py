"""MLIP accuracy at a fixed CPU budget, trained from extxyz files: HydraGNN, and MACE when installed.

Writes a data set of small rattled, strained Cu-Au cells labelled by ASE's EMT potential (the way
a DFT data set usually comes: ``REF_energy`` / ``REF_forces`` / ``REF_stress`` labels, free-atom
energies as ``IsolatedAtom`` frames), then

1. trains HydraGNN on it with one command, ``hydragnn-train config.json``, under
   ``Training.max_time_s = --budget-s``;
2. when ``--mace-python`` names a Python with mace-torch (an optional extra of this benchmark,
   not of the packages: ``python -m venv mace && mace/bin/pip install torch==2.13.0 mace-torch``),
   trains MACE (``mace_run_train``) on the same files with its epoch count set so that its
   training fits the same budget (MACE has no wall-clock option; ``--mace-epochs`` overrides);
3. evaluates each model through its ASE calculator, with the same code, on an in-distribution
   test file and on larger out-of-distribution cells, and prints energy (meV/atom) and force
   (meV/Å) MAEs next to the training wall time. ``evaluate`` also groups the errors by each frame's
   ``molecule`` info key when the file has one, and on request scores each member of a committee.

Usage::

    python tools/bench/mlip_fit.py [--budget-s 720] [--workdir DIR] [--mace-python PATH]
                                   [--config ours.json] [--skip-ours] [--threads 2]

Data (deterministic): train 320 cells of 8, 16 and 32 atoms (Au fraction 0-1, strain <= 4 %,
rattle 0.05-0.15 Å) + 2 isolated atoms, valid 40, test 100 of the same recipe, OOD test 12 cells
of 108 and 256 atoms.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

OUR_CONFIG = {
    "Verbosity": {"level": 2},
    "Dataset": {
        "name": "cuau_emt",
        "train_file": "train.xyz",
        "valid_file": "valid.xyz",
        "energy_key": "REF_energy",
        "forces_key": "REF_forces",
        "stress_key": None,
    },
    "NeuralNetwork": {
        "Architecture": {
            "mpnn_type": "PAINN",
            "hidden_dim": 32,
            "num_conv_layers": 3,
            "radius": 5.0,
            "num_radial": 16,
            "enable_interatomic_potential": True,
        },
        "Training": {"num_epoch": 1000, "batch_size": 8, "max_time_s": 720},
    },
}
"""HydraGNN as a user runs it: the architecture, the size of the run, and hydra-train's
interatomic-potential defaults for the rest (``hydragnn.train.mlip_defaults``: optimiser, schedule,
EMA, loss weights, second stage; docs/notes/mlip_fit.md and docs/notes/organic_benchmark.md for
the settings measured)."""

EVAL = r"""
import collections, json, sys, time
import numpy as np, ase.io
kind, model, path, per_member = sys.argv[1:5]
members = []
if kind == "hydra":
    from hydragnn.infer import HydraASECalculator, HydraCalculator
    calc = HydraASECalculator(model)
    if per_member == "1":  # the artifact read once more, for its members' own calculators
        from hydragnn.models import load_artifact
        members = [HydraASECalculator(HydraCalculator(m)) for m in getattr(load_artifact(model), "members", ())]
else:
    from mace.calculators import MACECalculator
    calc = MACECalculator(model_paths=model, device="cpu", default_dtype="float64")
frames = list(ase.io.iread(path, index=":"))
def errors(calc):
    t0 = time.perf_counter()
    de, df = [], []  # signed energy error per atom (eV), force component errors (eV/A) per frame
    for atoms in frames:
        atoms = atoms.copy()
        ref_e, ref_f = float(atoms.info["REF_energy"]), np.asarray(atoms.arrays["REF_forces"])
        atoms.calc = calc
        de.append((atoms.get_potential_energy() - ref_e) / len(atoms))
        df.append((atoms.get_forces() - ref_f).reshape(-1))
    return np.array(de), df, time.perf_counter() - t0
de, df, seconds = errors(calc)
flat = np.abs(np.concatenate(df))
out = {"e_mae": 1000 * float(np.mean(np.abs(de))), "f_mae": 1000 * float(np.mean(flat)),
       "f_rmse": 1000 * float(np.sqrt(np.mean(flat ** 2))), "structures": len(de), "seconds": seconds}
groups = collections.defaultdict(list)
for i, atoms in enumerate(frames):
    if "molecule" in atoms.info:
        groups[str(atoms.info["molecule"])].append(i)
if groups:
    out["per_molecule"] = {name: {"e_bias": 1000 * float(np.mean(de[rows])), "e_mae": 1000 * float(np.mean(np.abs(de[rows]))),
                                  "f_mae": 1000 * float(np.mean(np.abs(np.concatenate([df[i] for i in rows]))))}
                           for name, rows in groups.items()}
if members:
    runs = [errors(m)[:2] for m in members]
    out["members"] = [{"e_mae": 1000 * float(np.mean(np.abs(e))), "f_mae": 1000 * float(np.mean(np.abs(np.concatenate(f))))}
                      for e, f in runs]
    (e0, f0), (e1, f1) = runs[0], runs[1]
    out["members_error_correlation"] = {"energy": float(np.corrcoef(e0, e1)[0, 1]),
                                        "forces": float(np.corrcoef(np.concatenate(f0), np.concatenate(f1))[0, 1])}
print(json.dumps(out))
"""


def make_data(folder: Path) -> dict[str, Path]:
    """The extxyz files (written once; reused when present)."""
    from hydragnn.data.emt import generate_bulk_atoms, isolated_atom_frames, write_extxyz

    def cells(n: int, seed: int, sizes=(8, 16, 32), rattles=(0.05, 0.1, 0.15)) -> list:
        out = []
        for i, size in enumerate(sizes):
            for j, rattle in enumerate(rattles):
                k = n // (len(sizes) * len(rattles)) + (
                    1 if i * len(rattles) + j < n % (len(sizes) * len(rattles)) else 0
                )
                if k:
                    out += generate_bulk_atoms(k, size, seed=seed + 100 * i + j, max_strain=0.04, rattle=rattle)
        return out

    files = {name: folder / f"{name}.xyz" for name in ("train", "valid", "test", "test_ood")}
    if all(f.exists() for f in files.values()):
        return files
    folder.mkdir(parents=True, exist_ok=True)
    write_extxyz(files["train"], cells(320, 1000), extra_frames=isolated_atom_frames(["Cu", "Au"]))
    write_extxyz(files["valid"], cells(40, 2000))
    write_extxyz(files["test"], cells(100, 3000))
    write_extxyz(files["test_ood"], cells(12, 4000, sizes=(108, 256), rattles=(0.1,)))
    return files


def _env(threads: int) -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": str(threads), "OMP_WAIT_POLICY": "PASSIVE", "HYDRAGNN_PROGRESS": "plain"}


def evaluate(python: str, kind: str, model: Path, file: Path, threads: int, members: bool = False) -> dict:
    """MAEs of ``model`` on ``file`` (``per_molecule`` when the frames carry ``molecule``); with
    ``members``, a HydraGNN committee's members are scored too (K more passes over the file)."""
    out = subprocess.run(
        [python, "-c", EVAL, kind, str(model), str(file), "1" if members else "0"],
        capture_output=True,
        text=True,
        env=_env(threads),
        check=False,
    )
    if out.returncode != 0:
        raise RuntimeError(f"evaluating {model} on {file} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def train_ours(folder: Path, config: dict, budget_s: float, threads: int) -> dict:
    config = json.loads(json.dumps(config))
    config["NeuralNetwork"]["Training"]["max_time_s"] = budget_s
    path = folder / "hydragnn.json"
    path.write_text(json.dumps(config, indent=1))
    run = folder / "hydragnn_run"
    t0 = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "hydragnn.train.cli", str(path), "--run-dir", str(run), "--overwrite"],
        env=_env(threads),
        check=True,
        stdout=open(folder / "hydragnn.log", "w"),
        stderr=subprocess.STDOUT,
    )
    metrics = json.loads((run / "metrics.json").read_text())
    members = json.loads((run / "config.json").read_text())["NeuralNetwork"]["Architecture"].get("committee", 1)
    return {
        "model": run / "model.hydra",
        "wall_s": sum(h["seconds"] for h in metrics["history"]),  # the training loop, as max_time_s bounds it
        "process_s": time.perf_counter() - t0,
        # a committee's epochs are every member's ("134 x3": three members of 134 epochs each)
        "epochs": metrics["epochs_run"] if members == 1 else f"{metrics['epochs_run']} x{members}",
        "params": metrics["num_parameters"],
    }


MACE_ARGS = [
    "--model=MACE",
    "--num_channels=32",
    "--max_L=1",
    "--correlation=3",
    "--r_max=5.0",
    "--batch_size=8",
    "--valid_batch_size=20",
    "--lr=0.01",
    "--energy_weight=1.0",
    "--forces_weight=100.0",
    "--ema",
    "--ema_decay=0.99",
    "--amsgrad",
    "--swa",
    "--swa_energy_weight=1000",
    "--swa_forces_weight=100",
    "--scheduler_patience=5",
    "--default_dtype=float32",
    "--device=cpu",
    "--seed=1",
    "--E0s=average",
]
"""mace_run_train settings (see docs/notes/mlip_fit.md for the ones tried)."""


def train_mace(python: str, folder: Path, files: dict, epochs: int, threads: int, extra: list[str]) -> dict:
    work = folder / "mace_run"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir()
    args = [
        python,
        "-m",
        "mace.cli.run_train",
        "--name=mace",
        f"--train_file={files['train']}",
        f"--valid_file={files['valid']}",
        "--energy_key=REF_energy",
        "--forces_key=REF_forces",
        f"--max_num_epochs={epochs}",
        f"--start_swa={max(1, int(0.8 * epochs))}",
        *MACE_ARGS,
        *extra,
    ]
    log = folder / "mace.log"
    subprocess.run(args, cwd=work, env=_env(threads), check=True, stdout=open(log, "w"), stderr=subprocess.STDOUT)
    model = next(p for p in (work / "mace_stagetwo.model", work / "mace.model") if p.exists())
    return {"model": model, "wall_s": _mace_training_seconds(log), "epochs": epochs, "params": None}


def _mace_training_seconds(log: Path) -> float:
    """Seconds between MACE's "Started training" and "Training complete" log lines (the training
    loop alone, as ``max_time_s`` bounds ours: data loading and final evaluations excluded)."""
    from datetime import datetime

    stamps = {}
    for line in log.read_text().splitlines():
        for key in ("Started training", "Training complete"):
            if key in line:
                stamps[key] = datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S.%f")
    return (stamps["Training complete"] - stamps["Started training"]).total_seconds()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--budget-s", type=float, default=720.0)
    parser.add_argument("--workdir", type=Path, default=ROOT / "runs" / "mlip_fit")
    parser.add_argument("--config", type=Path, default=None, help="a HydraGNN config to use instead of OUR_CONFIG")
    parser.add_argument("--mace-python", default=None, help="a Python with mace-torch installed")
    parser.add_argument("--mace-epochs", type=int, default=None, help="MACE epochs (default: fit --budget-s)")
    parser.add_argument("--mace-arg", action="append", default=[], help="extra mace_run_train argument")
    parser.add_argument("--skip-ours", action="store_true")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    args.workdir = args.workdir.resolve()  # the config names files, read relative to the config's folder

    t0 = time.perf_counter()
    files = make_data(args.workdir / "data")
    print(f"data in {args.workdir / 'data'} ({time.perf_counter() - t0:.1f} s)", flush=True)
    results = {}
    if not args.skip_ours:
        config = json.loads(args.config.read_text()) if args.config else OUR_CONFIG
        for key in ("train_file", "valid_file"):
            config["Dataset"][key] = str(files[key.removesuffix("_file")])
        results["HydraGNN"] = train_ours(args.workdir, config, args.budget_s, args.threads)
        results["HydraGNN"]["python"], results["HydraGNN"]["kind"] = sys.executable, "hydra"
    if args.mace_python:
        epochs = args.mace_epochs
        if epochs is None:  # one calibration epoch (with MACE's set-up) to fit the budget
            probe = train_mace(args.mace_python, args.workdir, files, 1, args.threads, args.mace_arg)
            epochs = max(1, int(args.budget_s / probe["wall_s"]))
            print(f"MACE: one epoch with set-up took {probe['wall_s']:.0f} s -> {epochs} epochs", flush=True)
        results["MACE"] = train_mace(args.mace_python, args.workdir, files, epochs, args.threads, args.mace_arg)
        results["MACE"]["python"], results["MACE"]["kind"] = args.mace_python, "mace"

    header = "| model | epochs | training loop s | E MAE test (meV/atom) | F MAE test (meV/Å) | E MAE OOD | F MAE OOD |"
    print(header)
    print("|" + "---|" * 7)
    report = {}
    for name, r in results.items():
        ind = evaluate(r["python"], r["kind"], r["model"], files["test"], args.threads)
        ood = evaluate(r["python"], r["kind"], r["model"], files["test_ood"], args.threads)
        report[name] = {"epochs": r["epochs"], "wall_s": r["wall_s"], "test": ind, "test_ood": ood}
        print(
            f"| {name} | {r['epochs']} | {r['wall_s']:.0f} | {ind['e_mae']:.2f} | {ind['f_mae']:.1f} | "
            f"{ood['e_mae']:.2f} | {ood['f_mae']:.1f} |",
            flush=True,
        )
    (args.workdir / "report.json").write_text(json.dumps(report, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())

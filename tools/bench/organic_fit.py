"""Transfer to unseen chemistry at a fixed CPU budget: HydraGNN and MACE on GFN2-xTB organic molecules.

    python tools/bench/organic_fit.py --mace-python PATH [--budget-s 720] [--workdir DIR] [--config ours.json]
        [--seed 0] [--data DIR] [--temperature 300] [--hot-temperature 600] [--unseen standard|wide]

The data (``_organic_data.py``; tblite is a benchmark-only extra: ``pip install tblite==0.8.0``):
Langevin-MD frames of 12 H/C/N/O molecules labelled by GFN2-xTB, with three test splits: the same
molecules at 300 K (``test``), hotter at 600 K (``test_hot``) and 5 molecules never trained on
(``test_unseen``). HydraGNN (``hydragnn-train``, ``Training.max_time_s = --budget-s``) and MACE
(``mace_run_train`` in the Python given by ``--mace-python``, epochs calibrated by one probe epoch
to fit the same budget) train on the same files **side by side, one core each, at the same time**,
so machine noise hits both; both are evaluated by ``mlip_fit.py``'s code through their ASE
calculators. Prints energy (meV/atom) and force (meV/Å) MAEs per split, and the MAE of the
composition-only baseline (per-element energies fitted by least squares on the training set),
which a potential must beat to have learned anything beyond composition. Then, for the unseen
split, each molecule's energy bias and MAEs per model, and for a committee its members' MAEs and
how far their errors agree (:func:`breakdown`); ``WORKDIR/report.json`` keeps all of it.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
SPLITS = ("test", "test_hot", "test_unseen")


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name(f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


mlip_fit = _load("mlip_fit")
organic = _load("_organic_data")


def composition_baseline(files: dict[str, Path]) -> dict[str, float]:
    """Energy MAE (meV/atom) per split of per-element energies fitted by least squares on train."""
    import ase.io

    def rows(path: Path):
        frames = [a for a in ase.io.read(path, ":") if a.info.get("config_type") != "IsolatedAtom"]
        counts = np.array([[np.sum(a.numbers == z) for z in (1, 6, 7, 8)] for a in frames], dtype=float)
        energies = np.array([a.info["REF_energy"] for a in frames])
        return counts, energies

    counts, energies = rows(files["train"])
    e0, *_ = np.linalg.lstsq(counts, energies, rcond=None)
    out = {}
    for split in SPLITS:
        c, e = rows(files[split])
        out[split] = 1000 * float(np.mean(np.abs(c @ e0 - e) / c.sum(1)))
    return out


def breakdown(report: dict, split: str) -> list[str]:
    """Markdown lines: each model's mean signed energy error (bias) and MAEs per molecule of
    ``split``, worst first by the first model's energy MAE; then, for a committee, each member's
    MAEs and the correlation of two members' errors (near 1: more members will not help).

    The unseen split's mean is set by a few molecules whose chemistry the training set lacks; this
    table shows which, and whether the models share those errors."""

    def scores(entry) -> dict:  # a model's scores on split; {} for the baseline's plain numbers
        value = entry.get(split) if isinstance(entry, dict) else None
        return value if isinstance(value, dict) else {}

    models = [name for name, r in report.items() if "per_molecule" in scores(r)]
    lines: list[str] = []
    if models:
        rows = report[models[0]][split]["per_molecule"]
        lines += [
            f"{split} per molecule (E bias / E MAE meV/atom, F MAE meV/Å):",
            "| molecule | " + " | ".join(models) + " |",
            "|---|" + "---|" * len(models),
        ]
        for molecule in sorted(rows, key=lambda m: -rows[m]["e_mae"]):
            cells = []
            for name in models:
                m = report[name][split]["per_molecule"].get(molecule)
                cells.append("-" if m is None else f"{m['e_bias']:+.1f} / {m['e_mae']:.1f} / {m['f_mae']:.1f}")
            lines.append(f"| {molecule} | " + " | ".join(cells) + " |")
    for name, r in report.items():
        own = scores(r)
        if "members" in own:
            each = ", ".join(f"{m['e_mae']:.2f} / {m['f_mae']:.1f}" for m in own["members"])
            corr = own["members_error_correlation"]
            lines.append(
                f"{name} on {split}: members E / F {each}; mean {own['e_mae']:.2f} / {own['f_mae']:.1f}; "
                f"error correlation of members 0 and 1: energy {corr['energy']:.2f}, forces {corr['forces']:.2f}"
            )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--budget-s", type=float, default=720.0)
    parser.add_argument("--workdir", type=Path, default=ROOT / "runs" / "organic_fit")
    parser.add_argument("--config", type=Path, default=None, help="a HydraGNN config instead of mlip_fit's setting")
    parser.add_argument("--mace-python", default=None, help="a Python with mace-torch installed (else HydraGNN alone)")
    parser.add_argument("--mace-epochs", type=int, default=None, help="MACE epochs (default: fit --budget-s)")
    parser.add_argument("--frames", type=int, default=None, help="training frames per molecule (data default)")
    parser.add_argument("--seed", type=int, default=0, help="HydraGNN's Training.seed; MACE gets --seed=SEED+1")
    parser.add_argument("--data", type=Path, default=None, help="the data folder (default WORKDIR/data; reused)")
    parser.add_argument("--temperature", type=float, default=300.0, help="K of train/test/test_unseen MD (data)")
    parser.add_argument("--hot-temperature", type=float, default=600.0, help="K of test_hot MD (data)")
    parser.add_argument("--unseen", choices=sorted(organic.UNSEEN_SETS), default="standard", help="unseen set (data)")
    args = parser.parse_args(argv)
    args.workdir = args.workdir.resolve()  # the config names files, read relative to the config's folder
    data_dir = (args.data or args.workdir / "data").resolve()

    try:
        made = organic.make_organic_data(
            data_dir,
            frames=args.frames,
            temperature_K=args.temperature,
            hot_temperature_K=args.hot_temperature,
            unseen=args.unseen,
        )
    except ImportError as exc:  # tblite is this benchmark's own extra, absent from the dev environment
        print(f"organic_fit: skipped: {exc}")
        return 0
    files = made["files"]
    config = json.loads(args.config.read_text()) if args.config else json.loads(json.dumps(mlip_fit.OUR_CONFIG))
    config["Dataset"].update(name="organic_gfn2", train_file=str(files["train"]), valid_file=str(files["valid"]))
    config["NeuralNetwork"].setdefault("Training", {})["seed"] = args.seed
    mace_extra = [f"--seed={args.seed + 1}"]
    mace_files = {"train": files["train"], "valid": files["valid"]}
    (args.workdir / "ours").mkdir(parents=True, exist_ok=True)
    (args.workdir / "mace").mkdir(parents=True, exist_ok=True)
    epochs = args.mace_epochs
    if epochs is None and args.mace_python:  # one probe epoch, alone on one core, then the count that fits the budget
        probe = mlip_fit.train_mace(args.mace_python, args.workdir / "mace", mace_files, 1, 1, mace_extra)
        epochs = max(1, int(args.budget_s / probe["wall_s"]))
        print(f"MACE: one epoch took {probe['wall_s']:.0f} s -> {epochs} epochs", flush=True)
    start = time.perf_counter()
    with ThreadPoolExecutor(2) as pool:  # side by side, one core each
        ours = pool.submit(mlip_fit.train_ours, args.workdir / "ours", config, args.budget_s, 1)
        mace = None
        if args.mace_python:
            mace = pool.submit(
                mlip_fit.train_mace, args.mace_python, args.workdir / "mace", mace_files, epochs, 1, mace_extra
            )
        results = {"HydraGNN": {**ours.result(), "python": sys.executable, "kind": "hydra"}}
        if mace is not None:
            results["MACE"] = {**mace.result(), "python": args.mace_python, "kind": "mace"}
    print(f"trained side by side in {time.perf_counter() - start:.0f} s", flush=True)

    baseline = composition_baseline(files)
    header = "| model | epochs | loop s | " + " | ".join(f"{s} E / F" for s in SPLITS) + " |"
    print(header)
    print("|" + "---|" * (3 + len(SPLITS)))
    print("| composition baseline | - | - | " + " | ".join(f"{baseline[s]:.1f} / -" for s in SPLITS) + " |")
    report = {"baseline": baseline}
    for name, r in results.items():
        scores = {
            s: mlip_fit.evaluate(r["python"], r["kind"], r["model"], files[s], 1, members=s == "test_unseen")
            for s in SPLITS
        }
        report[name] = {"epochs": r["epochs"], "wall_s": r["wall_s"], **scores}
        cells = " | ".join(f"{scores[s]['e_mae']:.2f} / {scores[s]['f_mae']:.1f}" for s in SPLITS)
        print(f"| {name} | {r['epochs']} | {r['wall_s']:.0f} | {cells} |", flush=True)
    for line in breakdown(report, "test_unseen"):
        print(line)
    (args.workdir / "report.json").write_text(json.dumps(report, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())

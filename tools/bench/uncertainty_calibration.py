"""Does a committee's uncertainty say when it extrapolates? Calibration on labelled splits.

    python tools/bench/uncertainty_calibration.py MODEL.hydra SPLIT.xyz [SPLIT.xyz ...] [--json OUT]

For every structure of every split (extxyz with ``REF_energy`` / ``REF_forces``, as
``_organic_data.py`` and ``mlip_fit.py`` write them) the committee artifact is served through
``HydraCalculator(..., uncertainty=True)`` and compared with the labels. Per split it prints the
mean of the structures' largest per-atom force uncertainty (eV/Å) and energy uncertainty per
atom (meV/atom) next to the mean errors (force MAE meV/Å, |energy error| meV/atom), and, over
the structures of all splits together, Spearman's rank correlation between each uncertainty and
the matching error (structure-level: largest force uncertainty vs force MAE, energy
uncertainty vs energy error; atom-level: per-atom force uncertainty vs per-atom force error).
A useful uncertainty is clearly larger on splits the model did not train on and ranks errors.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np


def _ranks(values: np.ndarray) -> np.ndarray:
    """Average ranks (ties share their mean rank)."""
    order = np.argsort(values, kind="mergesort")
    ranks = np.empty(len(values))
    ranks[order] = np.arange(len(values), dtype=float)
    sorted_values = values[order]
    i = 0
    while i < len(values):
        j = i
        while j + 1 < len(values) and sorted_values[j + 1] == sorted_values[i]:
            j += 1
        ranks[order[i : j + 1]] = (i + j) / 2
        i = j + 1
    return ranks


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    """Spearman's rank correlation of two samples."""
    ra, rb = _ranks(np.asarray(a, float)), _ranks(np.asarray(b, float))
    ra, rb = ra - ra.mean(), rb - rb.mean()
    return float((ra * rb).sum() / np.sqrt((ra * ra).sum() * (rb * rb).sum()))


def score(model: str, files: list[Path]) -> dict:
    import ase.io

    from hydragnn.infer import HydraCalculator

    calc = HydraCalculator(model, uncertainty=True)
    rows: dict[str, dict[str, list]] = {}
    for path in files:
        split = rows.setdefault(
            path.stem, {k: [] for k in ("f_unc", "f_mae", "e_unc", "e_err", "atom_unc", "atom_err")}
        )
        for atoms in ase.io.iread(path, index=":"):
            if atoms.info.get("config_type") == "IsolatedAtom":
                continue
            cell = atoms.cell.array if atoms.pbc.any() else None
            out = calc(
                atoms.positions, atoms.numbers, cell=cell, pbc=atoms.pbc if cell is not None else None, forces=True
            )
            n = len(atoms)
            ref_f = np.asarray(atoms.arrays["REF_forces"])
            f_err = np.abs(out["forces"].numpy() - ref_f)
            f_unc = out["forces_uncertainty"].numpy()
            split["f_unc"].append(float(f_unc.max()))
            split["f_mae"].append(1000 * float(f_err.mean()))
            split["e_unc"].append(1000 * float(out["energy_uncertainty"][0]) / n)
            split["e_err"].append(1000 * abs(float(out["energy"][0]) - float(atoms.info["REF_energy"])) / n)
            split["atom_unc"].extend(f_unc.tolist())
            split["atom_err"].extend((1000 * np.linalg.norm(out["forces"].numpy() - ref_f, axis=1)).tolist())
    every = {k: np.concatenate([np.asarray(r[k]) for r in rows.values()]) for k in next(iter(rows.values()))}
    return {
        "splits": {
            name: {
                "structures": len(r["f_unc"]),
                "max_force_uncertainty": float(np.mean(r["f_unc"])),
                "force_mae_meV_per_A": float(np.mean(r["f_mae"])),
                "energy_uncertainty_meV_per_atom": float(np.mean(r["e_unc"])),
                "energy_error_meV_per_atom": float(np.mean(r["e_err"])),
            }
            for name, r in rows.items()
        },
        "spearman": {
            "structure: max force uncertainty vs force MAE": spearman(every["f_unc"], every["f_mae"]),
            "structure: energy uncertainty vs |energy error|": spearman(every["e_unc"], every["e_err"]),
            "atom: force uncertainty vs force error": spearman(every["atom_unc"], every["atom_err"]),
        },
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", help="a committee artifact (Architecture.committee >= 2)")
    parser.add_argument("splits", nargs="+", type=Path, help="labelled extxyz files, one per split")
    parser.add_argument("--json", type=Path, default=None, help="also write the report here")
    args = parser.parse_args(argv)
    report = score(args.model, args.splits)
    print(
        "| split | structures | max force uncertainty eV/Å | force MAE meV/Å | energy uncertainty meV/atom | energy error meV/atom |"
    )
    print("| --- | --- | --- | --- | --- | --- |")
    for name, r in report["splits"].items():
        print(
            f"| {name} | {r['structures']} | {r['max_force_uncertainty']:.3f} | {r['force_mae_meV_per_A']:.1f} | "
            f"{r['energy_uncertainty_meV_per_atom']:.2f} | {r['energy_error_meV_per_atom']:.2f} |"
        )
    for what, rho in report["spearman"].items():
        print(f"Spearman {what}: {rho:.2f}")
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

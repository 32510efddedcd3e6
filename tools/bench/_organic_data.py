"""Data of the organic-molecule MLIP benchmark: H/C/N/O molecules sampled by GFN2-xTB molecular dynamics.

Small closed-shell molecules of ASE's G2 set are run by Langevin dynamics with GFN2-xTB itself
(tblite's ASE calculator), and frames taken every ``interval`` steps after an equilibration are
written as extxyz with the labels ``REF_energy`` (eV, ``atoms.info``) and ``REF_forces`` (eV/Å,
``atoms.arrays``), the way ``tools/bench/mlip_fit.py`` writes its EMT data; ``train.xyz`` starts
with one ``IsolatedAtom`` frame (``config_type``) per element holding GFN2's free-atom energy.
Everything is non-periodic (no cell, ``pbc`` False).

Splits (each trajectory is its own MD run with its own seed, so frames of different splits are
disjoint):

* ``train.xyz`` / ``valid.xyz`` / ``test.xyz``: the training molecules at ``--temperature`` (300 K);
* ``test_hot.xyz``: the training molecules at ``--hot-temperature`` (600 K);
* ``test_unseen.xyz``: molecules absent from training (no formula shared with a training molecule,
  every element present in training) at ``--temperature``.

Training molecules (12): CH4, C2H6, C2H4, H2O, NH3, HCN, H2CO (formaldehyde), CH3OH,
CH3CH2OH (ethanol), H3CNH2 (methylamine), HCOOH (formic acid), CH3CHO (acetaldehyde).
Unseen molecules (5): C3H8 (propane), CH3CN (acetonitrile), CH3COOH (acetic acid), CH3CONH2
(acetamide), CH3CH2NH2 (ethylamine): larger, built from the bond types of the training set;
``--unseen wide`` adds 10 more (15, :data:`WIDE_UNSEEN_MOLECULES`).
``--quick``: train CH3OH and H3CNH2, unseen CH3CN, a few frames each (a smoke run of seconds).

tblite is an extra of this benchmark only, not a dependency of any package:
``python -m pip install tblite==0.8.0``. GFN2 runs on one OpenMP thread here (for molecules this
small it is 5-30x faster than two threads), one trajectory after the other, so two runs with the
same settings on the same machine and library build give identical files. A folder whose
``manifest.json`` records the same settings and file hashes is reused, not regenerated.

Usage::

    python tools/bench/_organic_data.py [--out DIR] [--frames 60] [--valid-frames 10]
                                       [--test-frames 20] [--seed 0] [--temperature 300]
                                       [--hot-temperature 600] [--unseen standard|wide]
                                       [--quick] [--force]
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import sys
import time
import zlib
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]

TRAIN_MOLECULES: tuple[str, ...] = (
    "CH4",
    "C2H6",
    "C2H4",
    "H2O",
    "NH3",
    "HCN",
    "H2CO",
    "CH3OH",
    "CH3CH2OH",
    "H3CNH2",
    "HCOOH",
    "CH3CHO",
)
"""ASE G2 names of the molecules of train / valid / test / test_hot."""
UNSEEN_MOLECULES: tuple[str, ...] = ("C3H8", "CH3CN", "CH3COOH", "CH3CONH2", "CH3CH2NH2")
"""ASE G2 names of the molecules of test_unseen (no formula in common with TRAIN_MOLECULES)."""
WIDE_UNSEEN_MOLECULES: tuple[str, ...] = UNSEEN_MOLECULES + (
    "C2H6CHOH",
    "CH3COCH3",
    "HCOOCH3",
    "C2H6NH",
    "isobutane",
    "C3H6_Cs",
    "trans-butane",
    "CH3CH2OCH3",
    "H2CCO",
    "C3H9N",
)
"""``unseen="wide"``: 15 molecules, adding isopropanol, acetone, methyl formate, dimethylamine,
isobutane, propene, butane, methyl ethyl ether, ketene and trimethylamine (branched chains, an
ester, an ether, tertiary and secondary amines, a cumulated C=C=O: shapes the training set lacks)."""
UNSEEN_SETS: dict[str, tuple[str, ...]] = {"standard": UNSEEN_MOLECULES, "wide": WIDE_UNSEEN_MOLECULES}
QUICK_TRAIN: tuple[str, ...] = ("CH3OH", "H3CNH2")
QUICK_UNSEEN: tuple[str, ...] = ("CH3CN",)

SPLITS: tuple[str, ...] = ("train", "valid", "test", "test_hot", "test_unseen")
_SPLIT_CODE = {name: i + 1 for i, name in enumerate(SPLITS)}  # part of every trajectory's seed

MD_DEFAULT = {"timestep_fs": 0.5, "friction_per_fs": 0.02, "equilibration_steps": 400, "interval_steps": 20}
"""Langevin settings: 200 fs of equilibration (4 thermostat times), then a frame every 10 fs."""
MD_QUICK = {"timestep_fs": 0.5, "friction_per_fs": 0.02, "equilibration_steps": 20, "interval_steps": 5}
COUNTS_DEFAULT = {"frames": 60, "valid_frames": 10, "test_frames": 20}
"""Frames per molecule: train, valid, and each of test / test_hot / test_unseen."""
COUNTS_QUICK = {"frames": 4, "valid_frames": 2, "test_frames": 2}

ACCURACY = 0.1
"""tblite's SCF accuracy (1.0 is its default): 10x tighter makes a label a function of the positions
alone (a warm-started SCF along the trajectory and a fresh one agree to ~1e-5 eV/Å instead of
~1e-4) for ~6 % more time."""
BOND_SCALE = 1.3
"""Two atoms are bonded when closer than BOND_SCALE x the sum of their covalent radii."""
FORMAT = 1
"""Version of the file layout; part of the cache key."""


class OrganicDataError(RuntimeError):
    """Invalid settings or a failed generation."""


def _tblite():
    """tblite's ASE calculator class and version, or an ImportError saying how to install it."""
    try:
        from importlib.metadata import version

        from tblite.ase import TBLite
    except ImportError as err:
        raise ImportError(
            "the organic benchmark labels its data with GFN2-xTB from tblite, an extra of this benchmark "
            "(not a dependency of any package): python -m pip install tblite==0.8.0"
        ) from err
    return TBLite, version("tblite")


@contextlib.contextmanager
def _one_openmp_thread() -> Iterator[None]:
    """Run tblite on one OpenMP thread (faster for small molecules, and reproducible); restored after.

    Must be entered after tblite is imported (its OpenMP runtime is then loaded)."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        threadpool_limits = None
    if threadpool_limits is not None:
        with threadpool_limits(limits=1, user_api="openmp"):
            yield
        return
    import ctypes

    try:
        gomp = ctypes.CDLL("libgomp.so.1")
    except OSError:  # no GNU OpenMP: tblite runs as OMP_NUM_THREADS says
        gomp = None
    before = gomp.omp_get_max_threads() if gomp is not None else None
    if gomp is not None:
        gomp.omp_set_num_threads(1)
    try:
        yield
    finally:
        if gomp is not None:
            gomp.omp_set_num_threads(before)


def _calculator(TBLite):
    """A fresh GFN2-xTB calculator with the settings used for every label: SCF accuracy ACCURACY,
    otherwise tblite's defaults (electronic temperature 300 K, spin-restricted, neutral)."""
    return TBLite(method="GFN2-xTB", accuracy=ACCURACY, verbosity=0)


def _molecule(name: str):
    """The G2 molecule ``name``, non-periodic, no cell."""
    from ase.build import molecule

    atoms = molecule(name)
    atoms.set_cell(np.zeros((3, 3)))
    atoms.pbc = False
    return atoms


def _bonds(atoms) -> np.ndarray:
    """The bond graph (bool [N, N]): distance < BOND_SCALE x (sum of covalent radii)."""
    from ase.data import covalent_radii

    radii = covalent_radii[atoms.numbers]
    d = np.linalg.norm(atoms.positions[:, None] - atoms.positions[None], axis=-1)
    bonded = d < BOND_SCALE * (radii[:, None] + radii[None])
    np.fill_diagonal(bonded, False)
    return bonded


def _rng(seed: int, split: str, name: str) -> np.random.Generator:
    """The generator of one trajectory: a function of (seed, split, molecule name) only."""
    return np.random.default_rng(np.random.SeedSequence([seed, _SPLIT_CODE[split], zlib.crc32(name.encode())]))


def _trajectory(TBLite, name: str, temperature_K: float, n_frames: int, rng: np.random.Generator, md: dict):
    """``n_frames`` labelled frames of Langevin MD of ``name`` at ``temperature_K`` with GFN2-xTB.

    Velocities are drawn from Maxwell-Boltzmann at the temperature (centre of mass at rest), the
    trajectory is equilibrated for ``equilibration_steps`` and a frame kept every
    ``interval_steps``. Each frame is a fresh non-periodic Atoms (no calculator) with
    ``info['REF_energy']``, ``arrays['REF_forces']`` of GFN2 at exactly its positions, and
    ``info['molecule']``, ``info['temperature_K']``.

    Returns:
        (frames, bond_changes): bond_changes counts frames whose bond graph differs from the
        starting geometry's (a reaction or dissociation; expected 0).
    """
    from ase import Atoms, units
    from ase.constraints import FixCom
    from ase.md import velocitydistribution
    from ase.md.langevin import Langevin

    atoms = _molecule(name)
    reference = _bonds(atoms)
    atoms.calc = _calculator(TBLite)
    # thermalize_momenta (ASE >= 3.29) and MaxwellBoltzmannDistribution draw the same numbers
    thermalize = getattr(velocitydistribution, "thermalize_momenta", None)
    if thermalize is None:
        thermalize = velocitydistribution.MaxwellBoltzmannDistribution
    thermalize(atoms, temperature_K=temperature_K, rng=rng)
    velocitydistribution.Stationary(atoms)
    atoms.set_constraint(FixCom())  # the centre of mass stays put (ASE's advice over Langevin's fixcm)
    dyn = Langevin(
        atoms,
        timestep=md["timestep_fs"] * units.fs,
        temperature_K=temperature_K,
        friction=md["friction_per_fs"] / units.fs,
        fixcm=False,
        rng=rng,
    )
    if md["equilibration_steps"]:
        dyn.run(md["equilibration_steps"])
    frames, bond_changes = [], 0
    for _ in range(n_frames):
        dyn.run(md["interval_steps"])
        frame = Atoms(atoms.numbers, positions=atoms.positions.copy(), pbc=False)
        frame.info["REF_energy"] = float(atoms.get_potential_energy())
        frame.info["molecule"] = name
        frame.info["temperature_K"] = float(temperature_K)
        # GFN2's forces as computed: FixCom would remove their (small, nonzero) sum
        frame.arrays["REF_forces"] = np.array(atoms.get_forces(apply_constraint=False), dtype=np.float64)
        if not (np.isfinite(frame.info["REF_energy"]) and np.isfinite(frame.arrays["REF_forces"]).all()):
            raise OrganicDataError(f"{name} at {temperature_K} K: GFN2-xTB gave a non-finite energy or force")
        bond_changes += int(not np.array_equal(_bonds(frame), reference))
        frames.append(frame)
    return frames, bond_changes


def isolated_atom_frames(TBLite, symbols: Sequence[str]) -> list:
    """One free atom per symbol (non-periodic, no cell), ``config_type`` ``IsolatedAtom``, with its
    GFN2-xTB energy as ``info['REF_energy']``: the same calculator settings as the molecules
    (spin-restricted with 300 K Fermi smearing, so open-shell atoms get fractional occupations;
    a consistent reference, not the atoms' spin ground states)."""
    from ase import Atoms

    frames = []
    for symbol in symbols:
        atoms = Atoms(symbol, positions=[[0.0, 0.0, 0.0]], pbc=False)
        atoms.calc = _calculator(TBLite)
        energy = float(atoms.get_potential_energy())
        if not np.isfinite(energy):
            raise OrganicDataError(f"GFN2-xTB gave a non-finite energy for a free {symbol} atom")
        frame = Atoms(symbol, positions=[[0.0, 0.0, 0.0]], pbc=False)
        frame.info["REF_energy"] = energy
        frame.info["config_type"] = "IsolatedAtom"
        frames.append(frame)
    return frames


def _write_atomic(path: Path, frames: list) -> None:
    """Write ``frames`` as extxyz to ``path`` through a temporary file and os.replace."""
    import ase.io

    tmp = path.with_name(f".{path.name}.tmp")
    ase.io.write(str(tmp), frames, format="extxyz")
    os.replace(tmp, path)


def _write_json_atomic(path: Path, data: dict) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    os.replace(tmp, path)


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _formula(name: str) -> str:
    return _molecule(name).get_chemical_formula()


def _check_molecules(train: Sequence[str], unseen: Sequence[str]) -> list[str]:
    """The elements of all molecules (by atomic number); raises when an unseen molecule shares a
    formula with a training one or holds an element absent from training."""
    from ase.data import atomic_numbers

    train_formulas = {_formula(n): n for n in train}
    for name in unseen:
        if _formula(name) in train_formulas:
            raise OrganicDataError(
                f"unseen molecule {name} has the formula of training molecule {train_formulas[_formula(name)]}"
            )
    seen = {s for n in train for s in _molecule(n).get_chemical_symbols()}
    for name in unseen:
        missing = set(_molecule(name).get_chemical_symbols()) - seen
        if missing:
            raise OrganicDataError(
                f"unseen molecule {name} holds {sorted(missing)}, absent from the training molecules"
            )
    return sorted(seen, key=lambda s: atomic_numbers[s])


def _settings(
    *,
    frames: int,
    valid_frames: int,
    test_frames: int,
    seed: int,
    quick: bool,
    temperature_K: float,
    hot_temperature_K: float,
    tblite_version: str,
    unseen: str = "standard",
) -> dict:
    """Everything that determines the files (the cache key), JSON-normalised."""
    for key, value in (("frames", frames), ("valid_frames", valid_frames), ("test_frames", test_frames)):
        if int(value) != value or value < 1:
            raise OrganicDataError(f"{key} must be a positive integer, got {value!r}")
    for key, value in (("temperature_K", temperature_K), ("hot_temperature_K", hot_temperature_K)):
        if not (np.isfinite(value) and value > 0):
            raise OrganicDataError(f"{key} must be a positive temperature, got {value!r}")
    if unseen not in UNSEEN_SETS:
        raise OrganicDataError(f"unseen must be one of {sorted(UNSEEN_SETS)}, got {unseen!r}")
    train, unseen_names = (QUICK_TRAIN, QUICK_UNSEEN) if quick else (TRAIN_MOLECULES, UNSEEN_SETS[unseen])
    return {
        "format": FORMAT,
        "quick": bool(quick),
        "seed": int(seed),
        "train_molecules": list(train),
        "unseen_molecules": list(unseen_names),
        "frames_per_molecule": {
            "train": int(frames),
            "valid": int(valid_frames),
            "test": int(test_frames),
            "test_hot": int(test_frames),
            "test_unseen": int(test_frames),
        },
        "temperature_K": float(temperature_K),
        "hot_temperature_K": float(hot_temperature_K),
        "md": dict(MD_QUICK if quick else MD_DEFAULT),
        "method": "GFN2-xTB",
        "accuracy": ACCURACY,
        "tblite_version": tblite_version,
        "bond_scale": BOND_SCALE,
    }


def _cached(folder: Path, settings: dict) -> dict | None:
    """The manifest of ``folder`` when it records ``settings`` and every file matches its hash."""
    path = folder / "manifest.json"
    try:
        manifest = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if manifest.get("settings") != settings:
        return None
    for split in SPLITS:
        entry = manifest.get("splits", {}).get(split, {})
        file = folder / entry.get("file", f"{split}.xyz")
        if not file.is_file() or _sha256(file) != entry.get("sha256"):
            return None
    return manifest


def make_organic_data(
    out: str | Path,
    *,
    frames: int | None = None,
    valid_frames: int | None = None,
    test_frames: int | None = None,
    seed: int = 0,
    quick: bool = False,
    temperature_K: float = 300.0,
    hot_temperature_K: float = 600.0,
    unseen: str = "standard",
    force: bool = False,
    progress: bool = True,
) -> dict:
    """Write (or reuse) the benchmark's data in ``out``.

    Counts are frames per molecule (``None``: 60 / 10 / 20, or 4 / 2 / 2 with ``quick``);
    ``test_frames`` applies to test, test_hot and test_unseen alike; ``unseen`` names the set of
    unseen molecules (``"standard"``: 5, ``"wide"``: 15, :data:`UNSEEN_SETS`). The folder is reused
    untouched when its manifest records the same settings (tblite version included) and its files
    their recorded hashes, unless ``force``. Files are written atomically, the manifest last.
    With ``progress``, a line per trajectory (split, molecule, frames, seconds) goes to stderr.

    Returns:
        ``{"files": {split: Path}, "manifest": dict, "cached": bool}``; splits are
        train, valid, test, test_hot, test_unseen.

    Raises:
        ImportError: tblite is not installed (the message says how to install it).
        OrganicDataError: invalid settings, or GFN2-xTB failed.
    """
    TBLite, tblite_version = _tblite()
    log = sys.stderr if progress else None
    quick_counts = COUNTS_QUICK if quick else COUNTS_DEFAULT
    settings = _settings(
        frames=quick_counts["frames"] if frames is None else frames,
        valid_frames=quick_counts["valid_frames"] if valid_frames is None else valid_frames,
        test_frames=quick_counts["test_frames"] if test_frames is None else test_frames,
        seed=seed,
        quick=quick,
        temperature_K=temperature_K,
        hot_temperature_K=hot_temperature_K,
        tblite_version=tblite_version,
        unseen=unseen,
    )
    folder = Path(out)
    files = {split: folder / f"{split}.xyz" for split in SPLITS}
    manifest = None if force else _cached(folder, settings)
    if manifest is not None:
        if log is not None:
            print(f"organic_data: reusing {folder} (manifest matches)", file=log, flush=True)
        return {"files": files, "manifest": manifest, "cached": True}

    train, unseen = settings["train_molecules"], settings["unseen_molecules"]
    elements = _check_molecules(train, unseen)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "manifest.json").unlink(missing_ok=True)  # the folder is incomplete until the manifest is back
    plan = {
        "train": (train, settings["temperature_K"]),
        "valid": (train, settings["temperature_K"]),
        "test": (train, settings["temperature_K"]),
        "test_hot": (train, settings["hot_temperature_K"]),
        "test_unseen": (unseen, settings["temperature_K"]),
    }
    t_start = time.perf_counter()
    splits, seconds_per_trajectory, bond_changes = {}, {}, 0
    with _one_openmp_thread():
        isolated = isolated_atom_frames(TBLite, elements)
        for split, (names, temperature) in plan.items():
            n = settings["frames_per_molecule"][split]
            split_frames = list(isolated) if split == "train" else []
            for name in names:
                t0 = time.perf_counter()
                got, changes = _trajectory(
                    TBLite, name, temperature, n, _rng(settings["seed"], split, name), settings["md"]
                )
                seconds = time.perf_counter() - t0
                split_frames += got
                bond_changes += changes
                seconds_per_trajectory[f"{split}/{name}"] = round(seconds, 3)
                if log is not None:
                    warn = f"  WARNING: {changes} frames changed bonds" if changes else ""
                    print(
                        f"organic_data: {split:<11} {name:<9} {len(got[0]):>2} atoms {n:>4} frames "
                        f"at {temperature:.0f} K {seconds:6.1f} s{warn}",
                        file=log,
                        flush=True,
                    )
            _write_atomic(files[split], split_frames)
            splits[split] = {
                "file": files[split].name,
                "molecules": list(names),
                "formulas": [_formula(n) for n in names],
                "temperature_K": temperature,
                "frames": len(split_frames) - (len(isolated) if split == "train" else 0),
                "isolated_atoms": list(elements) if split == "train" else [],
                "sha256": _sha256(files[split]),
            }
    manifest = {
        "settings": settings,
        "splits": splits,
        "isolated_atom_energies_eV": {f.get_chemical_symbols()[0]: f.info["REF_energy"] for f in isolated},
        "seeds": "per trajectory: np.random.SeedSequence([seed, split index 1-5 in "
        "train/valid/test/test_hot/test_unseen order, crc32(molecule name)])",
        "bond_changes": bond_changes,
        "generation_s": round(time.perf_counter() - t_start, 3),
        "seconds_per_trajectory": seconds_per_trajectory,
    }
    _write_json_atomic(folder / "manifest.json", manifest)
    if log is not None:
        print(f"organic_data: wrote {folder} in {manifest['generation_s']:.1f} s", file=log, flush=True)
    return {"files": files, "manifest": manifest, "cached": False}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "organic" / "data", help="output folder")
    parser.add_argument("--frames", type=int, default=None, help="train frames per molecule (60; quick 4)")
    parser.add_argument("--valid-frames", type=int, default=None, help="valid frames per molecule (10; quick 2)")
    parser.add_argument(
        "--test-frames",
        type=int,
        default=None,
        help="frames per molecule of test, test_hot and test_unseen (20; quick 2)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--temperature", type=float, default=300.0, help="K, train/valid/test/test_unseen")
    parser.add_argument("--hot-temperature", type=float, default=600.0, help="K, test_hot")
    parser.add_argument("--unseen", choices=sorted(UNSEEN_SETS), default="standard", help="unseen molecules: 5 or 15")
    parser.add_argument("--quick", action="store_true", help="2 train molecules, 1 unseen, a few frames (seconds)")
    parser.add_argument("--force", action="store_true", help="regenerate even when the manifest matches")
    args = parser.parse_args(argv)
    try:
        result = make_organic_data(
            args.out,
            frames=args.frames,
            valid_frames=args.valid_frames,
            test_frames=args.test_frames,
            seed=args.seed,
            quick=args.quick,
            temperature_K=args.temperature,
            hot_temperature_K=args.hot_temperature,
            unseen=args.unseen,
            force=args.force,
        )
    except (ImportError, OrganicDataError) as err:
        print(f"organic_data: error: {err}", file=sys.stderr)
        return 2
    manifest = result["manifest"]
    for split, entry in manifest["splits"].items():
        print(
            f"{split:<11} {entry['frames']:>5} frames  {len(entry['molecules'])} molecules  "
            f"{entry['temperature_K']:.0f} K  {result['files'][split]}"
        )
    print(f"generation {manifest['generation_s']:.1f} s{' (cached)' if result['cached'] else ''}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

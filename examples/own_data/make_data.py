#!/usr/bin/env python3
"""Write a small "DFT-like" data set the way most users have one: extxyz files with labels under
their own keys. Here the labels come from ASE's EMT potential (real physics, computed locally):

    train.xyz   160 rattled, strained Cu-Au cells of 8, 16 and 32 atoms + the two free atoms
                (config_type IsolatedAtom, their energies are the reference energies)
    valid.xyz   20 cells of the same kind
    test.xyz    40 cells of the same kind

Each frame carries ``REF_energy`` (eV), ``REF_stress`` (eV/Å³, Voigt) in its info line and
``REF_forces`` (eV/Å) per atom. Deterministic: the same files every time.

    python examples/own_data/make_data.py [--out FOLDER]
"""

from __future__ import annotations

import argparse
from pathlib import Path

from hydragnn.data.emt import generate_bulk_atoms, isolated_atom_frames, write_extxyz


def cells(count: int, seed: int) -> list:
    """``count`` cells cycling through 8, 16 and 32 atoms (Au fraction 0 to 1, strain <= 4 %, rattle 0.1 Å)."""
    out = []
    for i, size in enumerate((8, 16, 32)):
        out += generate_bulk_atoms(count // 3 + (i < count % 3), size, seed=seed + i, max_strain=0.04, rattle=0.1)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent)
    args = parser.parse_args()
    write_extxyz(args.out / "train.xyz", cells(160, 10), extra_frames=isolated_atom_frames(["Cu", "Au"]))
    write_extxyz(args.out / "valid.xyz", cells(20, 20))
    write_extxyz(args.out / "test.xyz", cells(40, 30))
    print(f"wrote train.xyz, valid.xyz and test.xyz to {args.out}")


if __name__ == "__main__":
    main()

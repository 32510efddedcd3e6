"""Generate an EMT reference set and print a summary with the time taken.

Usage::

    python tools/generate_emt.py cuau --n 500 --seed 0
    python tools/generate_emt.py bulk --n 4 --atoms 1000

Writing the samples to a dataset container is the containers' job; this tool only generates,
summarises and times (count, atoms, compositions, energy and force ranges, seconds).
"""

from __future__ import annotations

import argparse
import time
from collections import Counter

import torch

from hydragnn.data.emt import generate_bulk, generate_cuau


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("set", choices=("cuau", "bulk"), help="cuau: CuAu_32atoms; bulk: ~n-atom cells")
    parser.add_argument("--n", type=int, default=None, help="structures (default 500 for cuau, 4 for bulk)")
    parser.add_argument("--atoms", type=int, default=1000, help="atoms per bulk cell (about)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--float64", action="store_true", help="float64 samples (default float32)")
    args = parser.parse_args(argv)

    dtype = torch.float64 if args.float64 else torch.float32
    start = time.perf_counter()
    if args.set == "cuau":
        samples = generate_cuau(500 if args.n is None else args.n, seed=args.seed, dtype=dtype)
    else:
        samples = generate_bulk(4 if args.n is None else args.n, n_atoms=args.atoms, seed=args.seed, dtype=dtype)
    elapsed = time.perf_counter() - start
    if not samples:
        print(f"{args.set}: 0 structures in {elapsed:.2f} s")
        return 0

    natoms = [int(s.natoms) for s in samples]
    energy = torch.cat([s.energy.reshape(-1) for s in samples])
    per_atom = torch.cat([s.energy_per_atom.reshape(-1) for s in samples])
    fmax = max(s.forces.norm(dim=1).max().item() for s in samples)
    fractions = Counter(round((s.atomic_number == 79).float().mean().item(), 3) for s in samples)
    print(f"set            {args.set} (seed {args.seed}, {str(dtype).removeprefix('torch.')})")
    print(f"structures     {len(samples)}")
    print(f"atoms          {sum(natoms)} total, {min(natoms)}-{max(natoms)} per structure")
    print(f"Au fraction    {dict(sorted(fractions.items()))}")
    print(f"energy         [{energy.min().item():.4f}, {energy.max().item():.4f}] eV")
    print(f"energy/atom    [{per_atom.min().item():.5f}, {per_atom.max().item():.5f}] eV")
    print(f"max |force|    {fmax:.4f} eV/Å")
    print(f"time           {elapsed:.2f} s ({1e3 * elapsed / len(samples):.1f} ms per structure)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

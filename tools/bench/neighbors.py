"""Benchmark: hydragnn.data.neighbors.radius_graph against ASE's neighbor_list and brute force.

Random periodic structures at a metallic density (0.085 atoms/Å^3) and a non-periodic copy of
each, cutoff 5 Å. Times are the median of ``--repeat`` runs after one warm-up (which also
compiles the Warp kernels); ratios are reference time / radius_graph time (float64), measured
in the same run. Edge counts of every method are checked to agree.

    python tools/bench/neighbors.py [--sizes 100 1000 10000] [--repeat 5] [--brute-max 1000] [--threads 1]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import numpy as np
import torch
from ase import Atoms
from ase.neighborlist import neighbor_list as ase_neighbor_list

import hydragnn.data.neighbors.search as nb

DENSITY = 0.085
CUTOFF = 5.0


def _median_ms(fn: Callable[[], int], repeat: int) -> tuple[float, int]:
    edges = fn()  # warm-up: Warp kernel compilation, allocator
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times), edges


def _structure(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    length = (n / DENSITY) ** (1 / 3)
    g = torch.Generator().manual_seed(seed)
    cell = torch.tensor([[length, 0.0, 0.0], [0.1 * length, length, 0.0], [0.0, -0.05 * length, length]])
    pos = torch.rand(n, 3, generator=g, dtype=torch.float64) @ cell.double()
    return pos, cell.double()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[100, 1000, 10000])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--brute-max", type=int, default=1000, help="skip brute force above this many atoms")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (ASE and Warp on CPU use one)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    header = (
        f"{'atoms':>6} {'pbc':>5} {'method':>9} {'edges':>9} {'rg f64 ms':>10} {'rg f32 ms':>10} "
        f"{'ase ms':>9} {'brute ms':>10} {'ase/rg':>7} {'brute/rg':>9}"
    )
    print(f"torch threads: {torch.get_num_threads()}, cutoff {CUTOFF} Å, density {DENSITY} /Å^3")
    print(header)
    print("-" * len(header))
    for n in args.sizes:
        pos, cell = _structure(n, seed=n)
        for periodic in (True, False):
            c = cell if periodic else None
            atoms = Atoms(numbers=np.ones(n, dtype=int), positions=pos.numpy(), cell=cell.numpy(), pbc=periodic)
            rg64, e_rg = _median_ms(lambda pos=pos, c=c: nb.radius_graph(pos, CUTOFF, cell=c)[0].shape[1], args.repeat)
            pos32, c32 = pos.float(), None if c is None else c.float()
            rg32, e_rg32 = _median_ms(
                lambda pos32=pos32, c32=c32: nb.radius_graph(pos32, CUTOFF, cell=c32)[0].shape[1], args.repeat
            )
            ase, e_ase = _median_ms(lambda atoms=atoms: len(ase_neighbor_list("i", atoms, CUTOFF)), args.repeat)
            brute, brute_ratio = float("nan"), "skipped"
            if n <= args.brute_max:
                reps = max(1, args.repeat // 2)
                brute, e_bf = _median_ms(
                    lambda pos=pos, c=c: nb.brute_force_radius_graph(pos, CUTOFF, cell=c)[0].shape[1], reps
                )
                assert e_bf == e_rg, f"brute force found {e_bf} edges, radius_graph {e_rg}"
                brute_ratio = f"{brute / rg64:9.1f}"
            assert e_rg == e_ase, f"ASE found {e_ase} edges, radius_graph {e_rg}"
            # float32 may differ from float64 only by pairs within rounding of the cutoff
            assert abs(e_rg32 - e_rg) <= max(2, e_rg // 10**5), (e_rg32, e_rg)
            method = "cell_list" if n >= nb.CELL_LIST_MIN_ATOMS else "naive"
            print(
                f"{n:>6} {str(periodic):>5} {method:>9} {e_rg:>9} {rg64:>10.2f} {rg32:>10.2f} "
                f"{ase:>9.2f} {brute:>10.2f} {ase / rg64:>7.1f} {brute_ratio:>9}"
            )


if __name__ == "__main__":
    main()

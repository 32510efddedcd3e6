"""Benchmark of ``HydraCalculator`` modes: regular vs compile (vs kernels when they exist).

Fair-benchmark practice: one untrained SchNet MLIP (fp32) for every mode; energy-only and
energy+forces measured separately; fixed geometry (the same coordinates every call) and moving
geometry (new coordinates every call, so the neighbour list is rebuilt from new data); cold
start (a fresh calculator's first call, including ``torch.compile``) reported apart from the
steady state; several rounds with the order of the modes alternating; the median over rounds
reported with the ratio to the regular mode of the same run; memory reported separately (peak
RSS growth during the steady-state calls, sampled every millisecond). No timing is asserted.

    python tools/bench/infer.py --sizes 32 256 2048 --rounds 3
    python tools/bench/infer.py --sizes 20 100 500 1000 5000      # the 20..5,000 atom range
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
import warnings

import numpy as np
import torch
from ase.build import bulk

from hydragnn.data import Schema
from hydragnn.data.reference import CUAU_VARIABLES
from hydragnn.infer import HydraCalculator, HydraInferWarning
from hydragnn.models import build_model


def make_model(cutoff: float):
    arch = {
        "mpnn_type": "SchNet",
        "hidden_dim": 32,
        "num_conv_layers": 3,
        "radius": cutoff,
        "num_radial": 16,
        "enable_interatomic_potential": True,
        "output_heads": {"node": {"num_headlayers": 1}},
    }
    torch.manual_seed(0)
    return build_model(arch, Schema.from_dict(CUAU_VARIABLES)).eval()


def structure(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A periodic Cu-Au fcc cell with ``n`` atoms (the smallest cubic supercell, vacancies at the end)."""
    k = 1
    while 4 * k**3 < n:
        k += 1
    atoms = bulk("Cu", "fcc", a=3.8, cubic=True).repeat(k)
    rng = np.random.default_rng(seed)
    pos = atoms.positions[:n] + rng.normal(0, 0.05, size=(n, 3))
    return pos, rng.choice([29, 79], size=n), atoms.cell.array


def rss_bytes() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * 4096


class PeakRSS:
    """Peak RSS growth over a block, sampled every millisecond by a thread."""

    def __enter__(self):
        self.base = self.peak = rss_bytes()
        self._stop = False
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _run(self):
        while not self._stop:
            self.peak = max(self.peak, rss_bytes())
            time.sleep(0.001)

    def __exit__(self, *exc):
        self._stop = True
        self._thread.join()
        self.peak = max(self.peak, rss_bytes())

    @property
    def growth_mb(self) -> float:
        return (self.peak - self.base) / 2**20


def steady(calc, geoms, numbers, cell, forces: bool, min_time: float, min_calls: int) -> float:
    """Calls per second over at least ``min_time`` s and ``min_calls`` calls (after one warm-up call)."""
    calc(geoms[0], numbers, cell=cell, forces=forces)
    calls, start = 0, time.perf_counter()
    while calls < min_calls or time.perf_counter() - start < min_time:
        calc(geoms[calls % len(geoms)], numbers, cell=cell, forces=forces)
        calls += 1
    return calls / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[32, 256, 2048])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--modes", nargs="+", default=["regular", "compile"], choices=["regular", "compile", "kernels"])
    parser.add_argument("--cutoff", type=float, default=5.0)
    parser.add_argument("--min-time", type=float, default=0.5, help="seconds per steady-state measurement")
    parser.add_argument("--min-calls", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model = make_model(args.cutoff)
    options = {"regular": {}, "compile": {"compile_model": True}, "kernels": {"inference_kernels": True}}
    data = {n: structure(n) for n in args.sizes}
    rng = np.random.default_rng(1)
    moving = {n: [p + rng.normal(0, 0.02, size=p.shape) for _ in range(8)] for n, (p, _, _) in data.items()}

    # Process warm-up (Warp kernel JIT of the neighbour list), not charged to any mode.
    t0 = time.perf_counter()
    HydraCalculator(model)(*data[args.sizes[0]][:2], cell=data[args.sizes[0]][2])
    print(f"process warm-up (Warp neighbour-list JIT): {time.perf_counter() - t0:.2f} s\n")

    calcs, cold = {}, {}
    n0 = args.sizes[0]
    pos0, z0, cell0 = data[n0]
    for mode in args.modes:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", HydraInferWarning)
            calc = HydraCalculator(model, **options[mode])
            for forces in (False, True):
                t0 = time.perf_counter()
                calc(pos0, z0, cell=cell0, forces=forces)
                cold[(mode, forces)] = time.perf_counter() - t0
        calcs[mode] = calc
    print(f"cold start: first call of a fresh calculator at {n0} atoms (s; compile included)")
    print(f"{'mode':10s} {'energy':>10s} {'energy+forces':>14s}")
    for mode in args.modes:
        print(f"{mode:10s} {cold[(mode, False)]:10.2f} {cold[(mode, True)]:14.2f}")

    rates: dict[tuple, list[float]] = {}
    memory: dict[tuple, float] = {}
    for r in range(args.rounds):
        order = args.modes if r % 2 == 0 else list(reversed(args.modes))
        for n in args.sizes:
            pos, z, cell = data[n]
            for forces in (False, True):
                for geometry, geoms in (("fixed", [pos]), ("moving", moving[n])):
                    for mode in order:
                        with warnings.catch_warnings():
                            warnings.simplefilter("ignore", HydraInferWarning)
                            with PeakRSS() as mem:
                                rate = steady(calcs[mode], geoms, z, cell, forces, args.min_time, args.min_calls)
                        key = (n, forces, geometry, mode)
                        rates.setdefault(key, []).append(rate)
                        memory[key] = max(memory.get(key, 0.0), mem.growth_mb)

    print(f"\nsteady state: calls/s, median of {args.rounds} rounds (mode order alternating); ratio vs regular")
    header = f"{'atoms':>6s} {'task':14s} {'geometry':8s}" + "".join(f" {m:>16s}" for m in args.modes)
    print(header)
    for n in args.sizes:
        for forces in (False, True):
            for geometry in ("fixed", "moving"):
                base = statistics.median(rates[(n, forces, geometry, "regular")]) if "regular" in args.modes else None
                cells = []
                for mode in args.modes:
                    med = statistics.median(rates[(n, forces, geometry, mode)])
                    ratio = f"({med / base:.2f}x)" if base else ""
                    cells.append(f" {med:9.1f} {ratio:>6s}")
                task = "energy+forces" if forces else "energy"
                print(f"{n:6d} {task:14s} {geometry:8s}" + "".join(cells))

    print("\nmemory: peak RSS growth during the steady-state calls (MB, max over rounds)")
    print(f"{'atoms':>6s} {'task':14s}" + "".join(f" {m:>10s}" for m in args.modes))
    for n in args.sizes:
        for forces in (False, True):
            task = "energy+forces" if forces else "energy"
            vals = [max(memory[(n, forces, g, m)] for g in ("fixed", "moving")) for m in args.modes]
            print(f"{n:6d} {task:14s}" + "".join(f" {v:10.1f}" for v in vals))


if __name__ == "__main__":
    main()

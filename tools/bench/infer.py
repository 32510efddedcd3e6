"""Benchmark of ``HydraCalculator`` modes, the fair way (same model, inputs, precision, threads).

Modes: the four combinations of CUDA-graph replay and inference kernels (``regular``,
``kernels``, ``graph``, ``graph+kernels``), then compile-only (``compile``). One untrained MLIP
(fp32; SchNet, or ``--encoder`` PAINN / MACE) serves every mode; energy-only and energy+forces
are measured separately; fixed geometry (the same coordinates every call) and moving geometry
(new coordinates every call, so the neighbour list is rebuilt); periodic cells and molecules (clusters cut from the same bulk);
cold start (a fresh calculator's first two calls: regular, then capture or compile) reported apart
from the steady state; several rounds with the order of the modes alternating, the median
reported with the ratio to ``regular`` of the same run. On CUDA every timing is bracketed by
``torch.cuda.synchronize`` and memory is reported as peak allocated / peak reserved during the
steady state and the bytes the graph cache retains; on CPU as peak RSS growth. Each steady-state
point is first checked against the regular mode (max |dE| per atom, max |dF|). No timing is
asserted anywhere.

``--md-steps K`` adds ASE molecular dynamics (VelocityVerlet, 1 fs, 300 K, K steps per
measurement) through ``HydraASECalculator`` with ``skin=0`` (a fresh neighbour list per step)
and with the adapter's default skin, alternating within each round: MD steps/s of both, their
ratio, the builds / reuses of the default skin, and the largest energy difference of the two
trajectories (0 expected: reuse gives the same edges).

Fraction of peak (``_peak.py``): the matrix-product FLOPs of one regular E+F call (forward and
backward, from the shapes) times the calls/s of the regular and (when measured) the compile mode,
over a square matmul's FLOP/s measured in the same run with the same threads. On CPU, the same call's time split (torch's profiler) into matrix
products, gathers / scatters, element-wise work, custom operators (neighbour search), the
autograd engine and Python: what keeps the call below the matmul rate.

    python tools/bench/infer.py --sizes 32 256 2048 --rounds 3
    python tools/bench/infer.py --device cuda --modes regular kernels graph graph+kernels compile
    python tools/bench/infer.py --replay-backend --modes regular graph   # graph code path on CPU (tests)
    python tools/bench/infer.py --sizes 32 256 --md-steps 50              # + MD steps/s, skin 0 vs default
    python tools/bench/infer.py --encoder MACE --modes regular --systems periodic --rounds 1
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
import warnings
from pathlib import Path

import numpy as np
import torch
from _peak import call_flops, matmul_rate, time_shares
from ase import Atoms, units
from ase.build import bulk
from ase.md.velocitydistribution import thermalize_momenta
from ase.md.verlet import VelocityVerlet

from hydragnn.data import Schema
from hydragnn.data.emt import CUAU_VARIABLES
from hydragnn.infer import HydraASECalculator, HydraCalculator, HydraInferWarning
from hydragnn.infer.neighbors import MD_SKIN
from hydragnn.models import build_model

MODES = {
    "regular": {},
    "kernels": {"inference_kernels": True},
    "graph": {"cuda_graph": True},
    "graph+kernels": {"cuda_graph": True, "inference_kernels": True},
    "compile": {"compile_model": True},
}


SERVED = ("SchNet", "PAINN", "MACE")
"""Encoders ``--encoder`` accepts (each at hidden 32, 3 layers, 16 radial functions, its defaults)."""


def make_model(cutoff: float, encoder: str = "SchNet"):
    arch = {
        "mpnn_type": encoder,
        "hidden_dim": 32,
        "num_conv_layers": 3,
        "radius": cutoff,
        "num_radial": 16,
        "enable_interatomic_potential": True,
        "output_heads": {"node": {"num_headlayers": 1}},
    }
    torch.manual_seed(0)
    return build_model(arch, Schema.from_dict(CUAU_VARIABLES)).eval().requires_grad_(False)


def structure(n: int, system: str = "periodic", seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """A Cu-Au fcc structure of ``n`` atoms: a periodic cell (the smallest cubic supercell, vacancies at
    the end) or a molecule (the same atoms without the cell, so the cluster has surfaces)."""
    k = 1
    while 4 * k**3 < n:
        k += 1
    atoms = bulk("Cu", "fcc", a=3.8, cubic=True).repeat(k)
    rng = np.random.default_rng(seed)
    pos = atoms.positions[:n] + rng.normal(0, 0.05, size=(n, 3))
    cell = atoms.cell.array if system == "periodic" else None
    return pos, rng.choice([29, 79], size=n), cell


def rss_bytes() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * 4096


class Memory:
    """Peak memory over a block: CUDA peak allocated / reserved, or peak RSS growth on CPU."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"

    def __enter__(self):
        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        else:
            self.base = self.peak = rss_bytes()
            self._stop = False
            self._thread = threading.Thread(target=self._sample, daemon=True)
            self._thread.start()
        return self

    def _sample(self):
        while not self._stop:
            self.peak = max(self.peak, rss_bytes())
            time.sleep(0.001)

    def __exit__(self, *exc):
        if self.cuda:
            torch.cuda.synchronize()
            self.result = {
                "peak_allocated_mb": torch.cuda.max_memory_allocated() / 2**20,
                "peak_reserved_mb": torch.cuda.max_memory_reserved() / 2**20,
            }
        else:
            self._stop = True
            self._thread.join()
            self.result = {"rss_growth_mb": (max(self.peak, rss_bytes()) - self.base) / 2**20}


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def steady(calc, geoms, numbers, cell, forces: bool, min_time: float, min_calls: int, device) -> float:
    """Calls per second over at least ``min_time`` s and ``min_calls`` calls (after one warm-up call)."""
    calc(geoms[0], numbers, cell=cell, forces=forces)
    sync(device)
    calls, start = 0, time.perf_counter()
    while calls < min_calls or time.perf_counter() - start < min_time:
        calc(geoms[calls % len(geoms)], numbers, cell=cell, forces=forces)
        calls += 1
    sync(device)
    return calls / (time.perf_counter() - start)


def deviation(calc, ref, pos, numbers, cell) -> dict[str, float]:
    """Max |dE| per atom (eV) and max |dF| (eV/Å) of ``calc`` against ``ref`` on one structure."""
    got, want = calc(pos, numbers, cell=cell, forces=True), ref(pos, numbers, cell=cell, forces=True)
    de = float((got["energy"].double() - want["energy"].double()).abs().max()) / len(numbers)
    df = float((got["forces"].double() - want["forces"].double()).abs().max())
    return {"energy_per_atom": de, "forces": df}


def md_run(model, device, pos, numbers, cell, skin: float, steps: int) -> tuple[float, list[float], dict]:
    """MD steps per second over ``steps`` VelocityVerlet steps (after 2 warm-up steps), the energies, the counters."""
    atoms = Atoms(numbers=numbers, positions=pos, cell=cell, pbc=cell is not None)
    calc = HydraCalculator(model, device=device, skin=skin)
    atoms.calc = HydraASECalculator(calc)
    thermalize_momenta(atoms, temperature_K=300, rng=np.random.default_rng(0))
    dyn = VelocityVerlet(atoms, timestep=1.0 * units.fs)
    energies: list[float] = []
    dyn.attach(lambda: energies.append(atoms.get_potential_energy()), interval=1)
    dyn.run(2)
    sync(device)
    start = time.perf_counter()
    dyn.run(steps)
    sync(device)
    return steps / (time.perf_counter() - start), energies, calc.neighbor_stats


def md_section(args, model, device, data) -> list[dict]:
    """MD steps/s with skin 0 and with the MD default skin, alternating per round; medians and their ratio."""
    rows = []
    print(f"\nMD (ASE VelocityVerlet, {args.md_steps} steps): steps/s, median of {args.rounds} rounds")
    head = f"{'atoms':>6s} {'system':9s} {'skin 0':>10s} {f'skin {MD_SKIN}':>10s} {'ratio':>7s}"
    print(head + "  builds/reuses  max|dE| eV")
    for (n, system), (pos, z, cell) in data.items():
        rates: dict[float, list[float]] = {0.0: [], MD_SKIN: []}
        energies: dict[float, list[float]] = {}
        stats: dict = {}
        for r in range(args.rounds):
            for skin in (0.0, MD_SKIN) if r % 2 == 0 else (MD_SKIN, 0.0):
                rate, energies[skin], counters = md_run(model, device, pos, z, cell, skin, args.md_steps)
                rates[skin].append(rate)
                if skin:
                    stats = counters
        base, fast = statistics.median(rates[0.0]), statistics.median(rates[MD_SKIN])
        de = float(np.abs(np.subtract(energies[0.0], energies[MD_SKIN])).max())
        rows.append({"atoms": n, "system": system, "steps_per_s_skin0": base, "steps_per_s_default": fast,
                     "default_skin": MD_SKIN, "ratio": fast / base, "neighbor_stats": stats, "max_energy_diff": de})  # fmt: skip
        print(f"{n:6d} {system:9s} {base:10.1f} {fast:10.1f} {fast / base:6.2f}x  "
              f"{stats['builds']:>6d}/{stats['reuses']:<6d}  {de:.1e}")  # fmt: skip
    return rows


def build(model, mode: str, device: torch.device, replay_backend: bool) -> HydraCalculator:
    options = dict(MODES[mode])
    if replay_backend and options.get("cuda_graph"):
        options["graph_backend"] = "replay"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", HydraInferWarning)
        return HydraCalculator(model, device=device, **options)


def run(args: argparse.Namespace) -> dict:
    """Measure every mode, size, system, task and geometry; return the report (and print tables)."""
    device = torch.device(args.device)
    torch.set_num_threads(args.threads)
    model = make_model(args.cutoff, args.encoder).to(device)
    report: dict = {"device": str(device), "encoder": args.encoder, "threads": args.threads, "modes": args.modes,
                    "cold": [], "steady": []}  # fmt: skip

    t0 = time.perf_counter()
    probe = structure(args.sizes[0])
    HydraCalculator(model, device=device)(probe[0], probe[1], cell=probe[2])
    report["process_warmup_s"] = time.perf_counter() - t0
    print(f"process warm-up (Warp neighbour-list JIT): {report['process_warmup_s']:.2f} s\n")

    data = {(n, s): structure(n, s) for n in args.sizes for s in args.systems}
    rng = np.random.default_rng(1)
    moving = {key: [p + rng.normal(0, 0.02, size=p.shape) for _ in range(8)] for key, (p, _, _) in data.items()}
    regular = build(model, "regular", device, args.replay_backend)

    print("cold start: the first two calls of a fresh calculator (s): regular, then capture / compile")
    for system in args.systems:
        pos, z, cell = data[(args.sizes[0], system)]
        for mode in args.modes:
            for forces in (False, True):
                calc = build(model, mode, device, args.replay_backend)
                times = []
                for _ in range(2):
                    sync(device)
                    t0 = time.perf_counter()
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore", HydraInferWarning)
                        calc(pos, z, cell=cell, forces=forces)
                    sync(device)
                    times.append(time.perf_counter() - t0)
                row = {"atoms": args.sizes[0], "system": system, "mode": mode, "forces": forces, "first_s": times[0],
                       "second_s": times[1], "compile_fell_back": bool(MODES[mode].get("compile_model")) and not calc.compile_model}  # fmt: skip
                report["cold"].append(row)
                note = "  (torch.compile failed: eager fallback)" if row["compile_fell_back"] else ""
                print(f"  {system:9s} {mode:14s} {'E+F' if forces else 'E':3s} {times[0]:8.3f} {times[1]:8.3f}{note}")

    calcs = {mode: build(model, mode, device, args.replay_backend) for mode in args.modes}
    rates: dict[tuple, list[float]] = {}
    memory: dict[tuple, dict] = {}
    checks: dict[tuple, dict] = {}
    for r in range(args.rounds):
        order = args.modes if r % 2 == 0 else list(reversed(args.modes))
        for (n, system), (pos, z, cell) in data.items():
            for forces in (False, True):
                for geometry, geoms in (("fixed", [pos]), ("moving", moving[(n, system)])):
                    for mode in order:
                        calc = calcs[mode]
                        with warnings.catch_warnings():
                            warnings.simplefilter("ignore", HydraInferWarning)
                            with Memory(device) as mem:
                                rate = steady(calc, geoms, z, cell, forces, args.min_time, args.min_calls, device)
                            key = (n, system, forces, geometry, mode)
                            if key not in checks:
                                checks[key] = deviation(calc, regular, geoms[-1], z, cell)
                        rates.setdefault(key, []).append(rate)
                        memory[key] = mem.result | {
                            "graph_retained_mb": (
                                calc.memory_stats()["graph_pool_bytes"] + calc.memory_stats()["static_buffer_bytes"]
                            )
                            / 2**20
                        }

    print(f"\nsteady state: calls/s, median of {args.rounds} rounds (mode order alternating); ratio vs regular")
    print(f"{'atoms':>6s} {'system':9s} {'task':4s} {'geometry':8s}" + "".join(f" {m:>20s}" for m in args.modes))
    for n, system in data:
        for forces in (False, True):
            for geometry in ("fixed", "moving"):
                base = (
                    statistics.median(rates[(n, system, forces, geometry, "regular")])
                    if "regular" in args.modes
                    else None
                )
                cells = []
                for mode in args.modes:
                    key = (n, system, forces, geometry, mode)
                    med = statistics.median(rates[key])
                    ratio = med / base if base else None
                    cells.append(f" {med:11.3g} {f'({ratio:.2f}x)' if ratio else '':>8s}")
                    report["steady"].append(
                        {
                            "atoms": n,
                            "system": system,
                            "forces": forces,
                            "geometry": geometry,
                            "mode": mode,
                            "calls_per_s": med,
                            "ratio_vs_regular": ratio,
                            "max_deviation": checks[key],
                            "memory": memory[key],
                        }
                    )
                print(f"{n:6d} {system:9s} {'E+F' if forces else 'E':4s} {geometry:8s}" + "".join(cells))

    worst = max((row["max_deviation"]["forces"] for row in report["steady"]), default=0.0)
    print(f"\nlargest force deviation from the regular mode over every point: {worst:.2e} eV/Å")
    print(
        "memory (MB, last round): "
        + (
            "peak allocated / peak reserved / graph cache retained"
            if device.type == "cuda"
            else "peak RSS growth / graph cache retained"
        )
    )
    for n, system in data:
        for mode in args.modes:
            m = memory[(n, system, True, "moving", mode)]
            print(f"  {n:6d} {system:9s} {mode:14s} " + " / ".join(f"{v:.1f}" for v in m.values()))
    report["peak"] = peak_section(args, model, device, data, rates)
    if args.md_steps:
        report["md"] = md_section(args, model, device, data)
    return report


def peak_section(args, model, device, data, rates) -> list[dict]:
    """Fraction of the matmul rate reached by the E+F call on a moving geometry: the regular
    call's FLOPs over each measured mode's time (``regular``, ``compile``: the same work)."""
    modes = [m for m in ("regular", "compile") if m in args.modes]
    if "regular" not in modes:
        return []
    dtype = next(model.parameters()).dtype
    rate = matmul_rate(device, dtype)
    calc = HydraCalculator(model, device=device)
    print(
        f"\nfraction of peak, E+F (moving geometry): matmul rate {rate / 1e9:.1f} GFLOP/s "
        f"({dtype}, {args.threads} thread(s)); counted: matrix-product FLOPs of forward + backward"
    )
    rows = []
    for (n, system), (pos, z, cell) in data.items():
        flops = call_flops(lambda pos=pos, z=z, cell=cell: calc(pos, z, cell=cell, forces=True))
        for mode in modes:
            calls = statistics.median(rates[(n, system, True, "moving", mode)])
            row = {"atoms": n, "system": system, "mode": mode, "mflop_per_call": flops / 1e6, "calls_per_s": calls,
                   "fraction_of_peak": flops * calls / rate}  # fmt: skip
            if device.type == "cpu" and mode == "regular":  # host time is the call's time only on CPU
                row["time_shares"] = time_shares(lambda pos=pos, z=z, cell=cell: calc(pos, z, cell=cell, forces=True))
            rows.append(row)
            print(
                f"  {n:6d} {system:9s} {mode:8s} {row['mflop_per_call']:10.2f} MFLOP/call {calls:9.3g} calls/s "
                f"-> {100 * row['fraction_of_peak']:.1f}% of peak"
            )
            if "time_shares" in row:
                print("         time: " + ", ".join(f"{100 * v:.0f}% {k}" for k, v in row["time_shares"].items()))
    return rows


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", type=int, nargs="+", default=[32, 256, 2048])
    p.add_argument("--systems", nargs="+", default=["periodic", "molecule"], choices=["periodic", "molecule"])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--modes", nargs="+", default=["regular", "compile"], choices=list(MODES))
    p.add_argument("--device", default="cpu")
    p.add_argument("--replay-backend", action="store_true", help="graph modes through the CPU replay backend (tests)")
    p.add_argument("--cutoff", type=float, default=5.0)
    p.add_argument("--encoder", default="SchNet", choices=SERVED, help="the untrained MLIP served (fp32)")
    p.add_argument("--min-time", type=float, default=0.5, help="seconds per steady-state measurement")
    p.add_argument("--min-calls", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--md-steps", type=int, default=0, help="also time ASE MD, skin 0 vs the default (0: skip)")
    p.add_argument("--json", type=Path, help="also write the report here")
    return p


def main(argv: list[str] | None = None) -> dict:
    args = parser().parse_args(argv)
    report = run(args)
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=1))
    return report


if __name__ == "__main__":
    main()

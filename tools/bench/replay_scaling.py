"""How CUDA-graph replay scales with the atom count: time and memory per atom, 1,000 to 100,000 atoms.

Runs the graph engines' code path on CPU through the replay backend (what CI can run; on a GPU
pass ``--device cuda`` for real graphs): for each size, a periodic Cu-Au cell (the cell-list
periodic engine) and the same atoms without the cell (an open cluster: the cell-list sparse
engine). Per size: the regular path's and the replay's time per call and per atom (median of
``--calls`` calls on moved positions), peak memory growth during the replays (RSS on CPU, the
allocator's peak on CUDA) and the engine's retained bytes per atom, and the largest force
deviation of the replay from the regular path. Each size runs in a fresh process, whose peak memory
growth (``ru_maxrss`` over the whole run, regular calls included) is reported per atom. The last
columns divide each per-atom figure by the smallest size's: flat scaling keeps them near 1.

    python tools/bench/replay_scaling.py                       # 1k .. 100k atoms, both systems
    python tools/bench/replay_scaling.py --sizes 1000 4000 --systems periodic --json out.json
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from infer import Memory, build, make_model, structure, sync  # noqa: E402


def measure(model, device, n: int, system: str, calls: int) -> dict:
    pos, numbers, cell = structure(n, system)
    base_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    graph = build(model, "graph", device, replay_backend=device.type != "cuda")
    regular = build(model, "regular", device, replay_backend=False)
    rng = np.random.default_rng(n)
    for _ in range(2):  # first sighting, then capture + admission check
        graph(pos, numbers, cell=cell, forces=True)
    moves = [pos + rng.normal(0, 0.01, size=pos.shape) for _ in range(calls)]
    replay_s, regular_s, replayed = [], [], []
    with Memory(device) as memory:
        for moved in moves:
            sync(device)
            t0 = time.perf_counter()
            replayed.append(graph(moved, numbers, cell=cell, forces=True)["forces"])
            sync(device)
            replay_s.append(time.perf_counter() - t0)
    deviation = 0.0
    for moved, got in list(zip(moves, replayed))[:2]:  # each replay against the regular path on its geometry
        t0 = time.perf_counter()
        want = regular(moved, numbers, cell=cell, forces=True)["forces"]
        sync(device)
        regular_s.append(time.perf_counter() - t0)
        deviation = max(deviation, float((got - want).abs().max()))
    stats = graph.memory_stats()
    engine = next(iter(graph.graph_engine.engines.values()), None)
    grid = getattr(engine, "grid", None)
    if device.type == "cuda":
        peak = memory.result["peak_allocated_mb"]
    else:
        peak = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base_kb) / 1024
    return {
        "atoms": n,
        "system": system,
        "engine": engine.kind if engine is not None else "none",
        "cell_list": grid is not None,
        "replays": stats["replays"],
        "regular_s": statistics.median(regular_s),
        "replay_s": statistics.median(replay_s),
        "replay_us_per_atom": 1e6 * statistics.median(replay_s) / n,
        "regular_us_per_atom": 1e6 * statistics.median(regular_s) / n,
        "peak_mb": peak,
        "peak_bytes_per_atom": peak * 2**20 / n,
        "retained_bytes_per_atom": (stats["graph_pool_bytes"] + stats["static_buffer_bytes"]) / n,
        "max_force_deviation": deviation,
    }


def _one(args: argparse.Namespace, n: int, system: str) -> dict:
    """One size in a fresh process (peak memory is the process's own)."""
    cmd = [sys.executable, __file__, "--one", str(n), system, "--device", args.device, "--threads", str(args.threads),
           "--cutoff", str(args.cutoff), "--calls", str(args.calls)]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{n} atoms, {system}: {proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", type=int, nargs="+", default=[1000, 4000, 16000, 32000, 64000, 100000])
    p.add_argument("--systems", nargs="+", default=["periodic", "molecule"], choices=["periodic", "molecule"])
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--cutoff", type=float, default=5.0)
    p.add_argument("--calls", type=int, default=3, help="timed replays per size")
    p.add_argument("--json", type=Path)
    p.add_argument("--one", nargs=2, metavar=("ATOMS", "SYSTEM"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.one is not None:
        torch.set_num_threads(args.threads)
        device = torch.device(args.device)
        row = measure(make_model(args.cutoff).to(device), device, int(args.one[0]), args.one[1], args.calls)
        print(json.dumps(row))
        return row
    rows = []
    header = (f"{'atoms':>7} {'system':<9} {'engine':<15} {'regular s':>9} {'replay s':>9} {'us/atom':>8} "
              f"{'peak B/atom':>11} {'kept B/atom':>11} {'dF max':>8} {'t/atom x':>8} {'peak/atom x':>11}")  # fmt: skip
    print(header)
    for system in args.systems:
        first = None
        for n in args.sizes:
            row = _one(args, n, system)
            first = first or row
            row["time_per_atom_vs_smallest"] = row["replay_us_per_atom"] / first["replay_us_per_atom"]
            row["peak_per_atom_vs_smallest"] = row["peak_bytes_per_atom"] / first["peak_bytes_per_atom"]
            rows.append(row)
            print(f"{n:>7} {system:<9} {row['engine'] + ('/cells' if row['cell_list'] else ''):<15} "
                  f"{row['regular_s']:>9.3f} {row['replay_s']:>9.3f} {row['replay_us_per_atom']:>8.1f} "
                  f"{row['peak_bytes_per_atom']:>11.0f} {row['retained_bytes_per_atom']:>11.0f} "
                  f"{row['max_force_deviation']:>8.1e} {row['time_per_atom_vs_smallest']:>8.2f} "
                  f"{row['peak_per_atom_vs_smallest']:>11.2f}", flush=True)  # fmt: skip
    report = {"device": args.device, "threads": args.threads, "cutoff": args.cutoff, "rows": rows}
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=1))
    return report


if __name__ == "__main__":
    main()

"""Throughput of the dataset containers: write, sequential read and random read, in samples/s.

    python tools/bench/containers.py                       # 500 CuAu_32atoms samples with edges
    python tools/bench/containers.py --source synthetic    # 500 random 32-atom graphs, 1000 edges
    python tools/bench/containers.py --n 2000 --formats pickle adios

Each format writes the same prepared samples with ``write_dataset`` and reads them back with
``open_dataset``: every index in order, then every index in a random order. The reference row,
measured in the same run, is a plain ``pickle.dump`` / ``pickle.load`` of the whole list in one
file (no random access, no safety); ratios are against it. Best of ``--repeat`` runs. Timings are
printed, never asserted.
"""

from __future__ import annotations

import argparse
import os
import pickle
import random
import shutil
import tempfile
import time
from pathlib import Path

import torch
from torch_geometric.data import Data

from hydragnn.data import Schema, prepare
from hydragnn.data.containers import FORMATS, open_dataset, write_dataset

SYNTHETIC_VARIABLES = {
    "inputs": [
        {"name": "atomic_number", "level": "node", "dim": 1},
        {"name": "pos", "level": "node", "dim": 3, "role": "position"},
    ],
    "outputs": [{"name": "energy", "level": "graph", "dim": 1}, {"name": "forces", "level": "node", "dim": 3}],
}


def synthetic(n: int, atoms: int, edges: int, seed: int = 0) -> tuple[list[Data], Schema]:
    """``n`` random periodic graphs of ``atoms`` atoms and ``edges`` edges, prepared."""
    g = torch.Generator().manual_seed(seed)
    schema = Schema.from_dict(SYNTHETIC_VARIABLES)
    out = []
    for i in range(n):
        raw = Data(
            atomic_number=torch.randint(1, 80, (atoms, 1), generator=g),
            pos=torch.randn(atoms, 3, generator=g) * 4,
            cell=torch.eye(3).reshape(1, 3, 3) * 8,
            pbc=torch.ones(1, 3, dtype=torch.bool),
            edge_index=torch.randint(0, atoms, (2, edges), generator=g),
            edge_shift=torch.randn(edges, 3, generator=g),
            energy=torch.randn(1, 1, generator=g),
            forces=torch.randn(atoms, 3, generator=g),
        )
        out.append(prepare(raw, schema, i))
    return out, schema


def reference(n: int, cutoff: float) -> tuple[list[Data], Schema]:
    """``n`` CuAu_32atoms samples (EMT labels) with radius-graph edges, prepared."""
    from hydragnn.data.emt import CUAU_VARIABLES, generate_cuau
    from hydragnn.data.neighbors import add_edges

    schema = Schema.from_dict(CUAU_VARIABLES)
    return [prepare(add_edges(s, cutoff), schema, i) for i, s in enumerate(generate_cuau(n))], schema


def disk_bytes(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def timed(fn, *args, **kwargs) -> float:
    start = time.perf_counter()
    fn(*args, **kwargs)
    return time.perf_counter() - start


def read_all(ds, indices) -> None:
    for i in indices:
        ds[i]


def bench_format(fmt: str, samples: list[Data], schema: Schema, workdir: Path, repeat: int) -> dict[str, float]:
    path = workdir / f"data.{fmt}"
    n = len(samples)
    order = list(range(n))
    random.Random(0).shuffle(order)
    best = {"write": float("inf"), "seq": float("inf"), "rand": float("inf")}
    for _ in range(repeat):
        best["write"] = min(best["write"], timed(write_dataset, path, samples, fmt, schema=schema))
        ds = open_dataset(path)
        best["seq"] = min(best["seq"], timed(read_all, ds, range(n)))
        best["rand"] = min(best["rand"], timed(read_all, ds, order))
        ds.close()
    result = {k: n / v for k, v in best.items()}
    result["mb"] = disk_bytes(path) / 1e6
    shutil.rmtree(path) if path.is_dir() else path.unlink()
    return result


def bench_reference(samples: list[Data], workdir: Path, repeat: int) -> dict[str, float]:
    path = workdir / "reference.pkl"
    n = len(samples)

    def dump() -> None:
        with open(path, "wb") as f:
            pickle.dump(samples, f, protocol=pickle.HIGHEST_PROTOCOL)

    def load() -> None:
        with open(path, "rb") as f:
            pickle.load(f)

    write = min(timed(dump) for _ in range(repeat))
    read = min(timed(load) for _ in range(repeat))
    result = {"write": n / write, "seq": n / read, "rand": float("nan"), "mb": disk_bytes(path) / 1e6}
    path.unlink()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=500, help="number of samples")
    parser.add_argument("--source", choices=("reference", "synthetic"), default="reference")
    parser.add_argument("--atoms", type=int, default=32, help="atoms per synthetic sample")
    parser.add_argument("--edges", type=int, default=1000, help="edges per synthetic sample")
    parser.add_argument("--cutoff", type=float, default=4.6, help="radius-graph cutoff for reference data, Å")
    parser.add_argument("--formats", nargs="+", choices=FORMATS, default=list(FORMATS))
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--workdir", type=Path, default=None, help="where to write (default: a temp dir)")
    args = parser.parse_args()

    torch.set_num_threads(1)
    start = time.perf_counter()
    if args.source == "reference":
        samples, schema = reference(args.n, args.cutoff)
    else:
        samples, schema = synthetic(args.n, args.atoms, args.edges)
    atoms = sum(s.num_nodes for s in samples) / len(samples)
    edges = sum(s.edge_index.shape[1] for s in samples) / len(samples)
    print(
        f"{len(samples)} {args.source} samples, {atoms:.0f} atoms and {edges:.0f} edges on average, "
        f"keys {list(samples[0].keys())} (built in {time.perf_counter() - start:.1f} s)"
    )

    workdir = Path(tempfile.mkdtemp(prefix="bench-containers-", dir=args.workdir))
    try:
        rows = {"reference": bench_reference(samples, workdir, args.repeat)}
        for fmt in args.formats:
            rows[fmt] = bench_format(fmt, samples, schema, workdir, args.repeat)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)

    ref = rows["reference"]
    print(f"\nbest of {args.repeat}; samples/s (ratio to reference: plain pickle of the whole list)")
    print(f"{'format':<10} {'write':>16} {'sequential read':>18} {'random read':>12} {'disk MB':>8}")
    for name, r in rows.items():
        write = f"{r['write']:9.0f} ({r['write'] / ref['write']:4.2f}x)"
        seq = f"{r['seq']:9.0f} ({r['seq'] / ref['seq']:4.2f}x)"
        rand = "n/a" if name == "reference" else f"{r['rand']:.0f}"
        print(f"{name:<10} {write:>16} {seq:>18} {rand:>12} {r['mb']:8.1f}")
    print(f"\n(pid {os.getpid()}, torch {torch.__version__}, 1 thread)")


if __name__ == "__main__":
    main()

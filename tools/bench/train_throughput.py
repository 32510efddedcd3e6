"""Training throughput: one process vs 2-process DDP (torchrun, gloo) for MLIP encoders.

Trains SchNet, PNA, PAINN and MACE interatomic potentials (energy + forces = -dE/dpos with
``create_graph``) on the ``CuAu_32atoms`` EMT reference set and reports, per encoder:

* graphs/s of one process (batch ``B``),
* graphs/s of 2 DDP ranks together (``B`` graphs per rank: the global batch is ``2B``),
* the ratio DDP / single (2.0 would be perfect scaling; a 2-core machine shared with
  other work is far from that),
* peak resident memory per rank: ``VmHWM`` of ``/proc/self/status`` (``ru_maxrss`` where that
  is missing). Not ``getrusage(RUSAGE_SELF).ru_maxrss`` on Linux: it survives ``fork`` +
  ``execve``, so a worker started by this (already large) process would report the parent's
  peak.

Usage::

    python tools/bench/train_throughput.py [--encoders SchNet,PNA] [--steps 10] [--batch 4]

Each measurement runs in a fresh process (``OMP_NUM_THREADS=1`` per rank, so the single
process and each DDP rank get one core): the timed steps follow ``--warmup`` untimed ones.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ENCODERS = {
    "SchNet": {},
    "PNA": {},
    "PAINN": {},
    "MACE": {},  # the defaults: max_ell 2, correlation 3
}
"""Encoder -> Architecture overrides on top of :func:`architecture`."""


def architecture(encoder: str, hidden: int) -> dict:
    return {
        "mpnn_type": encoder,
        "hidden_dim": hidden,
        "num_conv_layers": 2,
        "radius": 4.0,
        "num_radial": 8,
        "enable_interatomic_potential": True,
        "output_heads": {"node": {"num_headlayers": 1}},
        "task_weights": [3.0, 0.0, 1.0],  # per-atom energy MSE x 3, forces x 1
        "loss_function_type": "mse",
        **ENCODERS[encoder],
    }


def make_data(path: Path, n: int) -> None:
    from hydragnn.data import Schema, prepare
    from hydragnn.data.containers import write_dataset
    from hydragnn.data.neighbors import add_edges
    from hydragnn.data.reference import CUAU_VARIABLES, generate_cuau

    schema = Schema.from_dict(CUAU_VARIABLES)
    data = [add_edges(prepare(s, schema, index=i), 4.0) for i, s in enumerate(generate_cuau(n, seed=0))]
    write_dataset(path, data, "pickle", schema=schema)


def peak_rss_mb() -> float:
    """Peak resident set size of this process image, MiB."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def worker(args: argparse.Namespace) -> None:
    """One rank: train ``steps`` timed steps; write graphs/s and peak RSS to ``args.out``."""
    import torch
    from torch_geometric.data import Batch

    from hydragnn.data import Schema
    from hydragnn.data.containers import open_dataset
    from hydragnn.data.reference import CUAU_VARIABLES
    from hydragnn.models import build_model
    from hydragnn.train.strategies import build_optimizer_factory, make_strategy

    torch.set_num_threads(1)
    ds = open_dataset(args.data)
    data = [ds[i] for i in range(len(ds))]
    strategy = make_strategy({"Parallelism": {"strategy": args.strategy, "timeout_s": 120}})
    torch.manual_seed(0)
    model = build_model(architecture(args.encoder, args.hidden), Schema.from_dict(CUAU_VARIABLES))
    strategy.setup(model, build_optimizer_factory({"type": "Adam", "learning_rate": 1e-3}))
    rank, world = strategy.rank, strategy.world_size
    B = args.batch

    def one_step(k: int) -> None:
        start = ((k * world + rank) * B) % (len(data) - B + 1)
        batch = Batch.from_data_list(data[start : start + B])
        out = strategy.forward(batch)
        loss, _ = strategy.unwrap().loss(out, batch)
        strategy.backward(loss)
        strategy.step()

    for k in range(args.warmup):
        one_step(k)
    strategy.barrier()
    t0 = time.perf_counter()
    for k in range(args.steps):
        one_step(args.warmup + k)
    strategy.barrier()
    elapsed = time.perf_counter() - t0
    result = {
        "rank": rank,
        "world": world,
        "graphs_per_s": args.steps * B / elapsed,
        "maxrss_mb": peak_rss_mb(),
        "params": sum(p.numel() for p in model.parameters()),
    }
    Path(args.out, f"{args.encoder}.{args.strategy}.{world}.rank{rank}.json").write_text(json.dumps(result))
    strategy.teardown()


def run(cmd: list[str], timeout: float) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        print(proc.stdout[-2000:], proc.stderr[-4000:], file=sys.stderr)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--encoders", default=",".join(ENCODERS))
    parser.add_argument("--structures", type=int, default=32)
    parser.add_argument("--batch", type=int, default=4, help="graphs per step per rank")
    parser.add_argument("--hidden", type=int, default=32)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=900, help="seconds per measurement")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--encoder", help=argparse.SUPPRESS)
    parser.add_argument("--strategy", default="none", help=argparse.SUPPRESS)
    parser.add_argument("--data", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return

    out = Path(tempfile.mkdtemp(prefix="hydra_bench_"))
    data = out / "cuau.pkl"
    make_data(data, args.structures)
    common = [
        f"--data={data}",
        f"--out={out}",
        f"--batch={args.batch}",
        f"--hidden={args.hidden}",
        f"--steps={args.steps}",
        f"--warmup={args.warmup}",
        "--worker",
    ]
    rows = []
    for encoder in args.encoders.split(","):
        run([sys.executable, __file__, *common, f"--encoder={encoder}", "--strategy=none"], args.timeout)
        run(
            [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--nproc_per_node=2",
                "--standalone",
                __file__,
                *common,
                f"--encoder={encoder}",
                "--strategy=ddp",
            ],
            args.timeout,
        )

        def load(name: str) -> dict | None:
            path = out / name
            return json.loads(path.read_text()) if path.exists() else None

        single = load(f"{encoder}.none.1.rank0.json")
        ranks = [load(f"{encoder}.ddp.2.rank{r}.json") for r in (0, 1)]
        if single is None or None in ranks:
            rows.append((encoder, None, None, None, None, None, None))
            continue
        ddp = sum(r["graphs_per_s"] for r in ranks)
        rows.append(
            (
                encoder,
                single["params"],
                single["graphs_per_s"],
                ddp,
                ddp / single["graphs_per_s"],
                single["maxrss_mb"],
                max(r["maxrss_mb"] for r in ranks),
            )
        )

    print(
        f"\nCuAu 32-atom MLIP training (energy + forces), hidden {args.hidden}, 2 layers, batch {args.batch}/rank, "
        f"{args.steps} timed steps, 1 thread per process, torchrun gloo"
    )
    print(
        "| encoder | params | single graphs/s | DDP x2 graphs/s | DDP/single | single peak RSS MB | DDP peak RSS MB/rank |"
    )
    print("|---|---|---|---|---|---|---|")
    for enc, params, single, ddp, ratio, m1, m2 in rows:
        if single is None:
            print(f"| {enc} | failed | | | | | |")
        else:
            print(f"| {enc} | {params} | {single:.1f} | {ddp:.1f} | {ratio:.2f} | {m1:.0f} | {m2:.0f} |")


if __name__ == "__main__":
    main()

"""Training throughput: a per-phase profile of a training step, graphs/s before vs after, and DDP.

Default: for upstream HydraGNN's unit-test workload (graphs of 2-8 nodes, batch 32, ci.json's
widths) and the CuAu MLIP (32 atoms, energy + forces, batch 8), every encoder trains in a fresh
process in two variants measured alternately in that process: ``before`` (PyG's
``Batch.from_data_list`` collation in the training thread, torch's default AdamW step, i.e. its
per-parameter loop on CPU) and ``after`` (hydra-data's loaders: the packed in-memory list,
``PackedGraphs``; hydra-train's optimizer factory: fused AdamW, stepped flat between the
strategy's ``begin_training`` / ``end_training`` as the loop does). Printed per encoder:
graphs/s of both and their ratio, where an ``after`` step spends its time (collation, transfer,
forward + loss, backward, optimizer, host reads; neighbour lists are built once when the data is
prepared and reported per graph), and peak memory (VmHWM). With ``--threads`` above 1 an
``after`` variant on one intra-op thread runs in the same rotation: the comparison
``Training.intra_op_threads: "auto"`` makes at the start of a run.

``--compile``: each workload also trains with ``Training.compile`` (the ``after`` setup through
``torch.compile``, dynamic shapes; a potential takes its forces by ``torch.func.grad`` then, so
the forward, the forces and the double backward compile as one step), graphs/s against eager
``after`` in the same process, and the seconds of its first step.

``--mace-python``: the MLIP workload's cells (written as an extxyz file) also train in
mace-torch, in that Python (``python -m venv mace && mace/bin/pip install torch==2.13.0
mace-torch``): its MACE of our MACE's shape (2 interactions, 32 channels, node features up to
l = 1, spherical harmonics up to l = 2, correlation 3, 8 Bessel functions, radius 4 Å, float32),
its data loader, ``WeightedEnergyForcesLoss`` and AdamW, batch 8, the same threads; graphs/s
next to HydraGNN's MACE in the same run (run it with ``--encoders MACE`` or all encoders).

``--ddp``: one process vs 2-process DDP (torchrun, gloo) on the MLIP workload, graphs/s and
peak memory per rank (``OMP_NUM_THREADS=1`` per rank).

Usage::

    python tools/bench/train_throughput.py [--workloads unit,mlip] [--encoders SchNet,PNA] [--steps 22]
    python tools/bench/train_throughput.py --workloads unit --compile
    python tools/bench/train_throughput.py --workloads mlip --encoders MACE --compile --mace-python mace/bin/python
    python tools/bench/train_throughput.py --ddp [--encoders SchNet,PNA] [--steps 10] [--batch 4]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import _train_steps as _steps

ENCODERS = {
    "SchNet": {},
    "PNA": {},
    "PAINN": {},
    "MACE": {},  # the defaults: max_ell 2, correlation 3
}
"""Encoder -> Architecture overrides on top of :func:`architecture`."""


MACE_TRAIN_CHILD = r"""
import json, statistics, sys, time
import numpy as np, torch
from e3nn import o3
from mace import modules
from mace.data import AtomicData
from mace.data.utils import KeySpecification, load_from_xyz
from mace.modules.loss import WeightedEnergyForcesLoss
from mace.tools import AtomicNumberTable
from mace.tools.torch_geometric.dataloader import DataLoader
path, threads, steps, repeats, warmup, batch, cutoff = sys.argv[1:8]
threads, steps, repeats, warmup, batch, cutoff = int(threads), int(steps), int(repeats), int(warmup), int(batch), float(cutoff)
torch.set_num_threads(threads)
torch.set_default_dtype(torch.float32)
torch.manual_seed(0)
_, configs = load_from_xyz(path, KeySpecification.from_defaults())
graphs = [AtomicData.from_config(c, z_table=AtomicNumberTable([29, 79]), cutoff=cutoff) for c in configs]
neighbours = sum(int(g.edge_index.shape[1]) for g in graphs) / sum(int(g.positions.shape[0]) for g in graphs)
block = modules.interaction_classes["RealAgnosticResidualInteractionBlock"]
model = modules.MACE(
    r_max=cutoff, num_bessel=8, num_polynomial_cutoff=5, max_ell=2, interaction_cls=block, interaction_cls_first=block,
    num_interactions=2, num_elements=2, hidden_irreps=o3.Irreps("32x0e + 32x1o"), MLP_irreps=o3.Irreps("16x0e"),
    gate=torch.nn.functional.silu, atomic_energies=np.zeros(2), avg_num_neighbors=neighbours, atomic_numbers=[29, 79],
    correlation=3, radial_type="bessel",
)
loss_fn = WeightedEnergyForcesLoss(energy_weight=3.0, forces_weight=1.0)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
loader = DataLoader(graphs, batch_size=batch, shuffle=True, drop_last=True)
batches = iter(loader)
def step():
    global batches
    try:
        b = next(batches)
    except StopIteration:
        batches = iter(loader)
        b = next(batches)
    optimizer.zero_grad(set_to_none=True)
    out = model(b.to_dict(), training=True, compute_force=True)
    loss_fn(pred=out, ref=b).backward()
    optimizer.step()
    return int(b.num_graphs)
for _ in range(warmup):
    step()
rates = []
for _ in range(repeats):
    t = time.perf_counter()
    n = sum(step() for _ in range(steps))
    rates.append(n / (time.perf_counter() - t))
print(json.dumps({"graphs_per_s": statistics.median(rates), "params": sum(p.numel() for p in model.parameters())}))
"""


def mace_torch(args: argparse.Namespace, structures: int) -> dict | None:
    """mace-torch's training rate on the MLIP workload's cells (``--mace-python``), or ``None``."""
    from hydragnn.data.emt import generate_cuau_atoms, write_extxyz

    with tempfile.TemporaryDirectory() as tmp:
        path = write_extxyz(Path(tmp) / "cuau.xyz", generate_cuau_atoms(structures, seed=0))
        cmd = [args.mace_python, "-c", MACE_TRAIN_CHILD, str(path), str(args.threads), str(args.steps)]
        cmd += [str(args.repeats), str(args.warmup), "8", "4.0"]
        env = {**os.environ, "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD": "1"}  # e3nn 0.4 loads its constants with pickle
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout, env=env)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        print(f"mace-torch: failed\n{proc.stderr[-3000:]}", file=sys.stderr)
        return None
    return json.loads(lines[-1])


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
    from hydragnn.data.emt import CUAU_VARIABLES, generate_cuau
    from hydragnn.data.neighbors import add_edges

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
    from hydragnn.data.emt import CUAU_VARIABLES
    from hydragnn.models import build_model
    from hydragnn.train.strategies import build_optimizer_factory, make_strategy

    torch.set_num_threads(1)
    ds = open_dataset(args.data)
    data = [ds[i] for i in range(len(ds))]
    strategy = make_strategy({"Parallelism": {"strategy": args.strategy, "timeout_s": 120}})
    torch.manual_seed(0)
    model = build_model(architecture(args.encoder, args.hidden), Schema.from_dict(CUAU_VARIABLES))
    strategy.setup(model, build_optimizer_factory({"type": "Adam", "learning_rate": 1e-3}))
    strategy.begin_training()
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
    strategy.end_training()
    strategy.teardown()


def run(cmd: list[str], timeout: float) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        print(proc.stdout[-2000:], proc.stderr[-4000:], file=sys.stderr)


def ddp_main(args: argparse.Namespace) -> None:
    """The ``--ddp`` table: one process vs 2 DDP ranks on the MLIP workload."""
    args.encoders = args.encoders or ",".join(ENCODERS)
    args.steps = args.steps or 8
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
        "--ddp",
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


def profile_worker(args: argparse.Namespace) -> None:
    """One workload x encoder: both variants alternately, the ``after`` phases; JSON to stdout."""
    import torch
    from torch_geometric.loader.dataloader import Collater

    from hydragnn.data import create_dataloaders
    from hydragnn.models import build_model
    from hydragnn.models.execution import set_intra_op_threads
    from hydragnn.train.strategies import Strategy, build_optimizer_factory

    set_intra_op_threads(args.threads)
    make = _steps.unit_workload if args.workload == "unit" else _steps.mlip_workload
    data, base, schema = make(args.structures)
    arch = _steps.architecture(args.workload, args.encoder, data, base)
    prep_ms = _steps.neighbor_ms(data[:64], arch["radius"])
    lr = 0.02 if args.workload == "unit" else 1e-3
    batch = 32 if args.workload == "unit" else 8

    def setup(variant: str):
        torch.manual_seed(0)
        model = build_model(arch, schema)
        strategy = Strategy()
        if variant == "before":
            strategy.setup(model, lambda params: torch.optim.AdamW(params, lr=lr))
        else:
            strategy.setup(model, build_optimizer_factory({"type": "AdamW", "learning_rate": lr}))
        loader = create_dataloaders(data, None, None, batch, prefetch=0)[0]
        if variant == "before":
            loader.collate_fn = Collater(data)
            loader.packed = None
        else:
            strategy.begin_training()
        first_s = 0.0
        if variant == "compiled":  # Training.compile; its first step (the compiler's work) is timed apart
            strategy.compile()
            first_s = _steps.timed_steps(strategy, loader, 1, 0)[2]
        return strategy, loader, sum(p.numel() for p in model.parameters()), first_s

    names = ["before", "after"] + (["after 1 thread"] if args.threads > 1 else [])
    names += ["compiled"] if args.compile else []
    variants = {v: setup(v) for v in names}
    phases = {v: dict.fromkeys(_steps.PHASES, 0.0) for v in variants}
    rates: dict[str, list[float]] = {v: [] for v in variants}
    for r in range(args.repeats):
        for v, (strategy, loader, _, _) in variants.items():
            set_intra_op_threads(1 if v == "after 1 thread" else args.threads)
            totals, graphs, wall = _steps.timed_steps(strategy, loader, args.steps, args.warmup if r == 0 else 0)
            rates[v].append(graphs / wall)
            for k, t in totals.items():
                phases[v][k] += t
    result = {
        "params": variants["after"][2],
        "graphs_per_s": {v: statistics.median(x) for v, x in rates.items()},
        "phases": phases,
        "prep_ms_per_graph": prep_ms,
        "compile_s": variants["compiled"][3] if "compiled" in variants else 0.0,
        "peak_mb": peak_rss_mb(),
    }
    print(json.dumps(result))


def profile_main(args: argparse.Namespace) -> None:
    """The default tables: per workload, per encoder, in a fresh process each."""
    for workload in args.workloads.split(","):
        encoders = args.encoders or ",".join(_steps.UNIT_ENCODERS if workload == "unit" else _steps.MLIP_ENCODERS)
        rows = []
        for encoder in encoders.split(","):
            cmd = [
                sys.executable,
                __file__,
                "--worker",
                f"--workload={workload}",
                f"--encoder={encoder}",
                f"--steps={args.steps}",
                f"--repeats={args.repeats}",
                f"--threads={args.threads}",
                f"--structures={args.structures or (350 if workload == 'unit' else 64)}",
            ]
            cmd += ["--compile"] if args.compile else []
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
            lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
            if proc.returncode != 0 or not lines:
                print(f"{workload} {encoder}: failed\n{proc.stderr[-3000:]}", file=sys.stderr)
                rows.append((encoder, None))
                continue
            rows.append((encoder, json.loads(lines[-1])))
        title = (
            "upstream unit-test workload (2-8 nodes, batch 32, hidden 8, 2 layers)"
            if workload == "unit"
            else "CuAu MLIP (32 atoms, energy + forces, batch 8, hidden 32, 2 layers)"
        )
        print(f"\n{title}; {args.threads} thread(s), {args.repeats} alternating repeats of {args.steps} steps")
        print(
            "| encoder | params | before graphs/s | after graphs/s | after/before | "
            + " | ".join(f"{p} %" for p in _steps.PHASES)
            + " | neighbour list ms/graph (once, at preparation) | peak RSS MB |"
        )
        print("|---" * (7 + len(_steps.PHASES)) + "|")
        for encoder, r in rows:
            if r is None:
                print(f"| {encoder} | failed |" + " |" * (5 + len(_steps.PHASES)))
                continue
            gps = r["graphs_per_s"]
            total = sum(r["phases"]["after"].values()) or 1.0
            shares = " | ".join(f"{100 * r['phases']['after'][p] / total:.0f}" for p in _steps.PHASES)
            print(
                f"| {encoder} | {r['params']} | {gps['before']:.0f} | {gps['after']:.0f} | "
                f"{gps['after'] / gps['before']:.2f} | {shares} | {r['prep_ms_per_graph']:.2f} | {r['peak_mb']:.0f} |"
            )
        single = [(e, r) for e, r in rows if r is not None and "after 1 thread" in r["graphs_per_s"]]
        if single:
            print(f'\nOne intra-op thread vs {args.threads} (the comparison Training.intra_op_threads "auto" makes):')
            print(
                f"| encoder | after, {args.threads} threads graphs/s | after, 1 thread graphs/s | 1 thread / {args.threads} |"
            )
            print("|---|---|---|---|")
            for encoder, r in single:
                gps = r["graphs_per_s"]
                print(
                    f"| {encoder} | {gps['after']:.0f} | {gps['after 1 thread']:.0f} | "
                    f"{gps['after 1 thread'] / gps['after']:.2f} |"
                )
        ours = dict(rows).get("MACE")
        if args.mace_python and workload == "mlip" and ours is not None:
            mace = mace_torch(args, args.structures or 64)
            if mace is not None:
                gps, theirs = ours["graphs_per_s"], mace["graphs_per_s"]
                print(
                    f"\nSide by side with mace-torch (same cells, shape, batch and threads; params: ours {ours['params']}, theirs {mace['params']}):"
                )
                print("| HydraGNN MACE | graphs/s | / mace-torch |")
                print("|---|---|---|")
                print(f"| mace-torch | {theirs:.1f} | 1.00 |")
                for variant in [v for v in ("before", "after", "compiled") if v in gps]:
                    print(f"| {variant} | {gps[variant]:.1f} | {gps[variant] / theirs:.2f} |")
        compiled = [(e, r) for e, r in rows if r is not None and "compiled" in r["graphs_per_s"]]
        if compiled:
            print("\n| encoder | after (eager) graphs/s | compiled graphs/s | compiled/eager | first compiled step s |")
            print("|---|---|---|---|---|")
            for encoder, r in compiled:
                gps = r["graphs_per_s"]
                print(
                    f"| {encoder} | {gps['after']:.0f} | {gps['compiled']:.0f} | {gps['compiled'] / gps['after']:.2f} "
                    f"| {r['compile_s']:.1f} |"
                )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ddp", action="store_true", help="one process vs 2 DDP ranks (MLIP workload)")
    parser.add_argument("--workloads", default="unit,mlip")
    parser.add_argument("--encoders", default=None, help="comma-separated (default: every encoder of the mode)")
    parser.add_argument("--structures", type=int, default=None)
    parser.add_argument("--batch", type=int, default=4, help="--ddp: graphs per step per rank")
    parser.add_argument("--hidden", type=int, default=32, help="--ddp: width")
    parser.add_argument("--steps", type=int, default=None, help="timed steps per repeat (default 22; --ddp 8)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--compile", action="store_true", help="also Training.compile (after + compiled)")
    parser.add_argument("--mace-python", help="a Python with mace-torch: its MACE trains on the MLIP cells too")
    parser.add_argument("--timeout", type=float, default=900, help="seconds per measurement")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--workload", help=argparse.SUPPRESS)
    parser.add_argument("--encoder", help=argparse.SUPPRESS)
    parser.add_argument("--strategy", default="none", help=argparse.SUPPRESS)
    parser.add_argument("--data", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.ddp:
        if args.worker:
            worker(args)
        else:
            args.structures = args.structures or 32
            ddp_main(args)
        return
    args.steps = args.steps or 22
    if args.worker:
        profile_worker(args)
    else:
        profile_main(args)


if __name__ == "__main__":
    main()

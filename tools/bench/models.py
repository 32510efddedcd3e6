"""Benchmark: one training step of every registered encoder at its default size.

Each model is ``build_model({"mpnn_type": name, "radius": 5.0, "enable_interatomic_potential":
true}, CUAU schema)``: the default ``hidden_dim`` / ``num_conv_layers`` / ``num_radial`` of
``ModelConfig`` and the encoder's own defaults. A step is forward (energy and forces = -dE/dpos),
MSE loss on energy and forces, and backward, on one batch of ``--batch`` CuAu 32-atom
structures (``hydragnn.data.emt.generate_cuau``, edges from
``hydragnn.data.neighbors.add_edges`` at the model radius, collated with PyG's ``Batch``).
Times are the median of ``--repeats`` steps after ``--warmup`` warm-up steps; the ratio is
against SchNet's time measured in the same run (SchNet is always measured). Nothing is asserted.

    python tools/bench/models.py [--threads 1] [--encoders SchNet PAINN ...] [--repeats 5]
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from _timing import median_seconds
from torch_geometric.data import Batch

from hydragnn.data import Schema, prepare
from hydragnn.data.emt import CUAU_VARIABLES, generate_cuau
from hydragnn.data.neighbors import add_edges
from hydragnn.models import ENCODERS, build_model

RADIUS = 5.0
REFERENCE = "SchNet"


def make_batch(schema: Schema, n_structures: int, radius: float) -> Batch:
    """``n_structures`` prepared CuAu structures with edges at ``radius``, as one batch."""
    samples = [add_edges(prepare(s, schema, index=i), radius) for i, s in enumerate(generate_cuau(n_structures))]
    return Batch.from_data_list(samples)


def step_seconds(name: str, schema: Schema, batch: Batch, warmup: int, repeats: int) -> tuple[int, float]:
    """Parameter count and median seconds of one training step of encoder ``name``."""
    torch.manual_seed(0)
    model = build_model({"mpnn_type": name, "radius": RADIUS, "enable_interatomic_potential": True}, schema)
    model.train()
    params = sum(p.numel() for p in model.parameters())

    def step() -> None:
        out = model(batch)
        loss = F.mse_loss(out["energy"], batch.energy) + F.mse_loss(out["forces"], batch.forces)
        model.zero_grad(set_to_none=True)
        loss.backward()

    return params, median_seconds(step, warmup, repeats)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--encoders", nargs="+", default=None, help=f"subset of {sorted(ENCODERS)}")
    parser.add_argument("--repeats", type=int, default=5, help="timed steps per encoder (median reported)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed steps before timing")
    parser.add_argument("--batch", type=int, default=32, help="structures per batch")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    names = sorted(ENCODERS) if args.encoders is None else list(args.encoders)
    unknown = sorted(set(names) - set(ENCODERS))
    if unknown:
        parser.error(f"unknown encoder(s) {unknown}; known: {sorted(ENCODERS)}")
    if REFERENCE not in names:
        names.insert(0, REFERENCE)

    schema = Schema.from_dict(CUAU_VARIABLES)
    batch = make_batch(schema, args.batch, RADIUS)
    print(
        f"torch {torch.__version__}, threads {torch.get_num_threads()}, batch {args.batch} x 32 atoms, "
        f"{batch.edge_index.shape[1]} edges (radius {RADIUS} Å), median of {args.repeats} after {args.warmup} warm-up"
    )
    results: dict[str, tuple[int, float]] = {}
    for name in names:
        results[name] = step_seconds(name, schema, batch, args.warmup, args.repeats)
    ref = results[REFERENCE][1]
    print(f"{'encoder':<10} {'params':>10} {'step s':>9} {'/' + REFERENCE:>9}")
    for name in names:
        params, seconds = results[name]
        print(f"{name:<10} {params:>10,} {seconds:>9.3f} {seconds / ref:>9.2f}")


if __name__ == "__main__":
    main()

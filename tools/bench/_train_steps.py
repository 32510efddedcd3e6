"""Workloads and a phase-timed training step for ``train_throughput.py`` (not a benchmark itself).

Two workloads: ``unit`` mirrors upstream HydraGNN's unit-test data (graphs of 2-8 nodes in a
3 Å box, one node feature, the graph output sum(x + x^2 + x^3), radius 2 Å, batch 32, ci.json's
widths: hidden 8, 2 layers, ReLU heads); ``mlip`` is the CuAu EMT set (32 atoms, energy +
forces by double backward, radius 4 Å, batch 8). Edges are built when the data is prepared,
so the neighbour-list phase is a one-off cost reported per graph, not part of a step.

A step is timed in phases (``collate``: the loader's next batch; ``transfer``: ``to(device)``;
``forward`` (+ loss); ``backward``; ``optimizer``; ``host reads``: what the training loop reads
per batch), with a synchronising read at each phase boundary only on CUDA.
"""

from __future__ import annotations

import time

import torch

PHASES = ("collate", "transfer", "forward", "backward", "optimizer", "host reads")

UNIT_ENCODERS: dict[str, dict] = {
    "SchNet": {"num_filters": 126, "num_gaussians": 50},
    "PNA": {
        "aggregators": ["mean", "min", "max", "std"],
        "scalers": ["identity", "amplification", "attenuation", "linear"],
        "residual": False,
    },
    "PAINN": {},
    "MACE": {"max_ell": 1, "node_max_ell": 1, "correlation": 2, "envelope_exponent": 5},
    "EGNN": {"update_coords": False, "attention": False, "avg_num_neighbors": 1.0},
    "DimeNet": {
        "int_emb_size": 64,
        "basis_emb_size": 8,
        "out_emb_size": 128,
        "num_spherical": 7,
        "envelope_exponent": 5,
        "num_before_skip": 1,
        "num_after_skip": 2,
        "num_output_layers": 1,
    },
}
"""Encoder -> keys on top of the unit workload's Architecture (upstream ci.json's values)."""

MLIP_ENCODERS = ("SchNet", "PNA", "PAINN", "MACE", "EGNN", "DimeNet")


def unit_workload(n_graphs: int, seed: int = 97) -> tuple[list, dict, object]:
    """``(prepared graphs, Architecture without encoder keys, schema)`` of the unit workload."""
    from torch_geometric.data import Data

    from hydragnn.data import Schema, add_edges, prepare

    schema = Schema.from_dict(
        {
            "inputs": [
                {"name": "x_feat", "level": "node", "dim": 1},
                {"name": "pos", "level": "node", "dim": 3, "role": "position"},
            ],
            "outputs": [{"name": "sum_x_x2_x3", "level": "graph", "dim": 1}],
        }
    )
    g = torch.Generator().manual_seed(seed)
    data = []
    for i in range(n_graphs):
        n = int(torch.randint(2, 9, (1,), generator=g))
        pos = torch.rand(n, 3, generator=g) * 3.0
        x = torch.rand(n, 1, generator=g)
        target = (x + x**2 + x**3).sum().reshape(1, 1)
        data.append(add_edges(prepare(Data(x_feat=x, pos=pos, sum_x_x2_x3=target), schema, index=i), 2.0))
    arch = {
        "hidden_dim": 8,
        "num_conv_layers": 2,
        "radius": 2.0,
        "num_radial": 6,
        "activation": "relu",
        "output_heads": {
            "graph": {"num_sharedlayers": 2, "dim_sharedlayers": 4, "num_headlayers": 2, "dim_headlayers": [10, 10]}
        },
        "task_weights": [1.0],
    }
    return data, arch, schema


def mlip_workload(n_graphs: int, seed: int = 0) -> tuple[list, dict, object]:
    """``(prepared CuAu graphs, Architecture without the encoder, schema)`` of the MLIP workload."""
    from hydragnn.data import Schema, add_edges, prepare
    from hydragnn.data.emt import CUAU_VARIABLES, generate_cuau

    schema = Schema.from_dict(CUAU_VARIABLES)
    data = [add_edges(prepare(s, schema, index=i), 4.0) for i, s in enumerate(generate_cuau(n_graphs, seed=seed))]
    arch = {
        "hidden_dim": 32,
        "num_conv_layers": 2,
        "radius": 4.0,
        "num_radial": 8,
        "enable_interatomic_potential": True,
        "output_heads": {"node": {"num_headlayers": 1}},
        "task_weights": [3.0, 0.0, 1.0],
    }
    return data, arch, schema


def architecture(workload: str, encoder: str, data: list, base: dict) -> dict:
    """The full Architecture: the workload's, the encoder's keys, and what the encoder computes
    from the training data (``Encoder.data_statistics``, e.g. PNA's degree histogram)."""
    from hydragnn.models import ModelConfig
    from hydragnn.models.encoders import get_encoder

    arch = {**base, "mpnn_type": encoder, **(UNIT_ENCODERS[encoder] if workload == "unit" else {})}
    config = ModelConfig.from_dict(arch)
    return {**arch, **get_encoder(encoder).data_statistics(config.encoder, data)}


def neighbor_ms(graphs: list, radius: float) -> float:
    """Milliseconds per graph of rebuilding the edges of ``graphs`` (after one warm-up call)."""
    from hydragnn.data import add_edges

    add_edges(graphs[0], radius)
    start = time.perf_counter()
    for g in graphs:
        add_edges(g, radius)
    return (time.perf_counter() - start) * 1e3 / len(graphs)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed_steps(strategy, loader, steps: int, warmup: int) -> tuple[dict[str, float], int, float]:
    """Run ``warmup`` + ``steps`` training steps; ``({phase: seconds}, graphs, wall seconds)``
    over the timed steps. The loader is cycled as needed."""
    module = strategy.unwrap()
    names = [v.name for v in module.schema.outputs]
    device = strategy.device
    totals = dict.fromkeys(PHASES, 0.0)
    graphs = 0
    iterator = iter(loader)

    def next_batch():
        nonlocal iterator
        try:
            return next(iterator)
        except StopIteration:
            iterator = iter(loader)
            return next(iterator)

    sums = torch.zeros(len(names) + 1, dtype=torch.float64, device=device)
    t_start = 0.0
    for k in range(warmup + steps):
        if k == warmup:
            _sync(device)
            t_start = time.perf_counter()
        marks = [time.perf_counter()]
        batch = next_batch()
        marks.append(time.perf_counter())
        batch = strategy.to_device(batch)
        _sync(device)
        marks.append(time.perf_counter())
        out = strategy.forward(batch)
        loss, heads = module.loss(out, batch)
        _sync(device)
        marks.append(time.perf_counter())
        strategy.backward(loss)
        _sync(device)
        marks.append(time.perf_counter())
        strategy.step()
        _sync(device)
        marks.append(time.perf_counter())
        finite = bool(torch.isfinite(loss.detach()))  # the loop's one read per batch
        sums.add_(torch.stack([loss.detach(), *(heads[n].detach() for n in names)]).double())
        marks.append(time.perf_counter())
        if k >= warmup:
            graphs += int(batch.num_graphs)
            for phase, a, b in zip(PHASES, marks[:-1], marks[1:]):
                totals[phase] += b - a
        assert finite, "non-finite loss in the benchmark"
    _sync(device)
    return totals, graphs, time.perf_counter() - t_start

"""Benchmark: parameters and seconds per training batch of every global-attention and
conditioning option beside its plain encoder.

Every model is the reference MLIP of the main job (``examples/cuau_mlip.json``: hidden 32,
3 layers, radius 4 Å, 16 radial functions) plus the option's ``Architecture`` keys. A training
batch is forward (energy and forces = -dE/dpos), MSE loss on energy and forces, backward and an
Adam step, on ``--batch`` CuAu 32-atom structures of the EMT reference set. Conditioning
variants get a ``charge`` graph input (a neutral charge, so the data are the same). Times are the
median of ``--repeats`` batches after ``--warmup``; the ratio is against the plain encoder of the
same row group, measured in the same run. Nothing is asserted.

    python tools/bench/global_attention.py [--threads 1] [--batch 8] [--variants SchNet+GPS-performer ...]
"""

from __future__ import annotations

import argparse
import copy
import importlib.util

import torch
import torch.nn.functional as F
from _timing import median_seconds
from torch_geometric.data import Batch

from hydragnn.data import Schema, add_edges, prepare
from hydragnn.data.emt import CUAU_VARIABLES, generate_cuau
from hydragnn.data.positional import add_positional_encodings
from hydragnn.models import ENCODERS, build_model

BASE = {
    "hidden_dim": 32,
    "num_conv_layers": 3,
    "radius": 4.0,
    "num_radial": 16,
    "enable_interatomic_potential": True,
    "output_heads": {"node": {"num_headlayers": 1}},
}
GPS = {"global_attn_engine": "GPS"}
PERFORMER = {"global_attn_engine": "GPS", "global_attn_type": "performer"}
ET = {"global_attn_engine": "EquivariantTransformer"}
# name -> (plain encoder it is compared with, Architecture keys)
VARIANTS: dict[str, tuple[str, dict]] = {
    "SchNet": ("SchNet", {"mpnn_type": "SchNet"}),
    "SchNet+GPS-multihead": ("SchNet", {"mpnn_type": "SchNet", **GPS}),
    "SchNet+GPS-performer": ("SchNet", {"mpnn_type": "SchNet", **PERFORMER}),
    "SchNet+GPS-multihead+pe8": ("SchNet", {"mpnn_type": "SchNet", **GPS, "pe_dim": 8}),
    "SchNet+EquivariantTransformer": ("SchNet", {"mpnn_type": "SchNet", **ET}),
    "EquivariantTransformer": ("SchNet", {"mpnn_type": None, **ET}),
    "SchNet+concat_node": ("SchNet", {"mpnn_type": "SchNet", "use_graph_attr_conditioning": True}),
    "SchNet+film": (
        "SchNet",
        {"mpnn_type": "SchNet", "use_graph_attr_conditioning": True, "graph_attr_conditioning_mode": "film"},
    ),
    "PAINN": ("PAINN", {"mpnn_type": "PAINN"}),
    "PAINN+GPS-performer": ("PAINN", {"mpnn_type": "PAINN", **PERFORMER}),
    "PAINN+EquivariantTransformer": ("PAINN", {"mpnn_type": "PAINN", **ET}),
    "MACE": ("MACE", {"mpnn_type": "MACE"}),
    "MACE+GPS-multihead": ("MACE", {"mpnn_type": "MACE", **GPS}),
    "UMA": ("UMA", {"mpnn_type": "UMA"}),
    "AllScAIP": ("AllScAIP", {"mpnn_type": "AllScAIP"}),
}


def _schema(conditioned: bool) -> Schema:
    variables = copy.deepcopy(CUAU_VARIABLES)
    if conditioned:
        variables["inputs"].append({"name": "charge", "level": "graph", "dim": 1})
    return Schema.from_dict(variables)


def make_batch(schema: Schema, n: int, radius: float, pe_dim: int) -> Batch:
    samples = []
    for i, s in enumerate(generate_cuau(n)):
        if "charge" in schema:
            s.charge = torch.zeros(1, 1)
        data = add_edges(prepare(s, schema, index=i), radius)
        samples.append(add_positional_encodings(data, pe_dim) if pe_dim else data)
    return Batch.from_data_list(samples)


def measure(arch: dict, batch_size: int, warmup: int, repeats: int) -> tuple[int, float]:
    """Parameter count and median seconds of one training batch."""
    conditioned = bool(arch.get("use_graph_attr_conditioning"))
    schema = _schema(conditioned)
    batch = make_batch(schema, batch_size, arch["radius"], arch.get("pe_dim", 0))
    torch.manual_seed(0)
    model = build_model(arch, schema).train()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    params = sum(p.numel() for p in model.parameters())

    def step() -> None:
        out = model(batch)
        loss = F.mse_loss(out["energy"], batch.energy) + F.mse_loss(out["forces"], batch.forces)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    return params, median_seconds(step, warmup, repeats)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--batch", type=int, default=8, help="structures per batch (the main job uses 8)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--variants", nargs="+", default=None, help=f"subset of {list(VARIANTS)}")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    names = list(VARIANTS) if args.variants is None else list(args.variants)
    unknown = sorted(set(names) - set(VARIANTS))
    if unknown:
        parser.error(f"unknown variant(s) {unknown}; known: {list(VARIANTS)}")
    fairchem = importlib.util.find_spec("fairchem") is not None
    names = [n for n in names if VARIANTS[n][1]["mpnn_type"] in ENCODERS or VARIANTS[n][1]["mpnn_type"] is None]
    if not fairchem:
        skipped = [n for n in names if VARIANTS[n][1]["mpnn_type"] in ("UMA", "AllScAIP")]
        names = [n for n in names if n not in skipped]
        if skipped:
            print(f"skipped {skipped}: fairchem-core is not installed (pip install 'hydra-models[fairchem]')")
    for plain in {VARIANTS[n][0] for n in names}:  # every ratio needs its plain row
        if plain not in names and plain in VARIANTS:
            names.insert(0, plain)
    print(
        f"torch {torch.__version__}, threads {torch.get_num_threads()}, batch {args.batch} x 32 atoms, "
        f"median of {args.repeats} after {args.warmup} warm-up"
    )
    results = {n: measure({**BASE, **VARIANTS[n][1]}, args.batch, args.warmup, args.repeats) for n in names}
    print(f"{'variant':<32} {'params':>9} {'batch s':>9} {'/plain':>7}")
    for name in names:
        params, seconds = results[name]
        plain = results.get(VARIANTS[name][0], (0, float("nan")))[1]
        print(f"{name:<32} {params:>9,} {seconds:>9.3f} {seconds / plain:>7.2f}")


if __name__ == "__main__":
    main()

"""Shared by the torchrun worker scripts: the tiny MLIP, its data, per-rank result files.

Not a test module (no ``test_`` prefix). Each rank writes ``<out>/<tag>.rank<r>.json`` with
``"ok": true`` as its last act; the tests judge success by these files, not only by
torchrun's exit code (a rank can abort in C++ after training: "terminate called without an
active exception").
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch_geometric.data import Batch

from hydragnn.data import Schema
from hydragnn.data.containers import open_dataset
from hydragnn.data.emt import CUAU_VARIABLES
from hydragnn.models import build_model

SCHEMA = Schema.from_dict(CUAU_VARIABLES)
N_ATOMS = 32


def arch(precision: str = "fp32", hidden: int = 8, mlip: bool = True, **extra: Any) -> dict[str, Any]:
    """A tiny SchNet interatomic potential: energy, per-atom energy, forces = -dE/dpos.

    ``mlip=False``: the same outputs as three plain heads (forces predicted directly).
    ``extra``: more ``Architecture`` keys (another encoder, global attention, ...).
    """
    return {
        "mpnn_type": "SchNet",
        "hidden_dim": hidden,
        "num_conv_layers": 2,
        "radius": 4.0,
        "num_radial": 8,
        "enable_interatomic_potential": mlip,
        "output_heads": {"node": {"num_headlayers": 1}},
        # per-atom energy MSE x 3 (MLIP energy_loss "per_atom"), the same as total x 3/N² for the plain heads
        "task_weights": [3.0 if mlip else 3.0 / N_ATOMS**2, 0.0, 1.0],
        "loss_function_type": "mse",
        "precision": precision,
        **extra,
    }


def new_model(precision: str = "fp32", seed: int = 0, mlip: bool = True, **extra: Any):
    torch.manual_seed(seed)
    return build_model(arch(precision, mlip=mlip, **extra), SCHEMA)


def load_data(path: str) -> list:
    ds = open_dataset(path)
    return [ds[i] for i in range(len(ds))]


def collate(samples: list, dtype: torch.dtype | None = None) -> Batch:
    batch = Batch.from_data_list(samples)
    if dtype is not None:
        for key in (
            "pos",
            "energy",
            "forces",
            "atomic_energy",
            "y",
            "graph_output",
            "node_output",
            "cell",
            "edge_shift",
        ):
            value = getattr(batch, key, None)
            if torch.is_tensor(value) and value.is_floating_point():
                setattr(batch, key, value.to(dtype))
    return batch


def flat_params(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1).double() for p in model.parameters()])


def state_vector(state: dict[str, torch.Tensor]) -> torch.Tensor:
    return torch.cat([v.detach().reshape(-1).double() for _, v in sorted(state.items()) if v.is_floating_point()])


def rel_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))


def across_ranks_max_diff(vector: torch.Tensor) -> float:
    """max |v_rank - v_rank0| over ranks (collective)."""
    parts = [torch.empty_like(vector) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, vector.contiguous())
    return max(float((p - parts[0]).abs().max()) for p in parts)


def rank() -> int:
    return int(os.environ.get("RANK", "0"))


def write_result(out: str, tag: str, result: dict[str, Any]) -> None:
    path = Path(out) / f"{tag}.rank{rank()}.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(result, indent=1, default=str))
    os.replace(tmp, path)


def run_main(tag: str, out: str, body) -> None:
    """Run ``body() -> dict``; write the result with ``ok`` (or the traceback); exit 0 / 1.

    The process group is created here, once, so that the strategies of one launch share it
    (re-creating the default group in one torchrun launch is not reliable).
    """
    from hydragnn.train.strategies import init_distributed

    init_distributed(timeout_s=120)
    try:
        result = body()
        result["ok"] = True
        code = 0
    except BaseException as exc:  # noqa: BLE001 -- reported in the result file
        result = {"ok": False, "error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}
        print(f"[rank {rank()}] {tag} FAILED: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        code = 1
    write_result(out, tag, result)
    print(f"[rank {rank()}] {tag} {'OK' if code == 0 else 'FAILED'}", flush=True)
    sys.stdout.flush()
    sys.stderr.flush()
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
    sys.exit(code)

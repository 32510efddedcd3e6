"""Worker for the multi-process batching test; run by ``torchrun --nproc_per_node=2 (gloo)``.

Usage: ``python -m torch.distributed.run --standalone --nproc_per_node=2 dist_batching_worker.py OUTDIR``.

Every step does an ``all_reduce``: if ranks disagreed on the number of steps, one would block at
the collective (the gloo timeout then fails the run). Seen sample ids are gathered and checked
on every rank. Each rank writes ``OUTDIR/rank<r>.json`` with ``{"ok": true, ...}`` only after all
checks passed and a final barrier.
"""

from __future__ import annotations

import json
import sys
import traceback
from collections import Counter
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch_geometric.data import Data

from hydragnn.data.batching import CostAwareBatchSampler
from hydragnn.data.loaders import create_dataloaders, set_epoch


def _steps(iterable, ids_of):
    """Iterate in lockstep with the other ranks, returning the ids seen here."""
    seen: list[int] = []
    steps = 0
    for item in iterable:
        token = torch.ones(1)
        dist.all_reduce(token)
        assert token.item() == dist.get_world_size()
        seen.extend(ids_of(item))
        steps += 1
    assert steps == len(iterable), f"{steps} steps but len() said {len(iterable)}"
    return seen, steps


def _gather(seen: list[int]) -> list[list[int]]:
    out: list[list[int]] = [[] for _ in range(dist.get_world_size())]
    dist.all_gather_object(out, seen)
    return out


def _check(label, per_rank, expected, *, exact=True, steps=None):
    """Union of ids == expected (each once when exact); equal step counts across ranks."""
    if steps is not None:
        all_steps: list[int] = [0] * dist.get_world_size()
        dist.all_gather_object(all_steps, steps)
        assert len(set(all_steps)) == 1, f"{label}: step counts differ {all_steps}"
    counts = Counter(i for seen in per_rank for i in seen)
    assert set(counts) <= set(expected), f"{label}: unexpected ids {sorted(set(counts) - set(expected))}"
    if exact:
        assert sorted(counts.elements()) == sorted(expected), f"{label}: {sorted(counts.elements())} != {expected}"
    return counts


def main(outdir: Path) -> None:
    dist.init_process_group("gloo", timeout=timedelta(seconds=30))
    rank, world = dist.get_rank(), dist.get_world_size()
    report: dict[str, object] = {"rank": rank, "world": world}
    gen = torch.Generator().manual_seed(0)

    # 1. the sampler alone over synthetic sizes
    sizes = torch.randint(1, 25, (101,), generator=gen).tolist()
    sizes[17], sizes[60] = 80, 90  # oversized
    for policy in ("single", "skip"):
        for drop_last in (False, True):
            cfg = {
                "mode": "node_budget",
                "max_nodes": 48,
                "max_graphs": 6,
                "oversized_sample": policy,
                "seed": 3,
                "drop_last": drop_last,
            }
            sampler = CostAwareBatchSampler(sizes, cfg, shuffle=True)
            assert (sampler.num_replicas, sampler.rank) == (world, rank)
            for epoch in (0, 1):
                sampler.set_epoch(epoch)
                seen, steps = _steps(sampler, lambda b: b)
                kept = [i for i in range(101) if i not in sampler.skipped]
                label = f"sampler {policy} drop_last={drop_last} epoch {epoch}"
                counts = _check(label, _gather(seen), kept, exact=not drop_last, steps=steps)
                assert max(counts.values()) == 1, f"{label}: duplicates"
                for b in sampler:
                    assert len(b) <= 6 and (len(b) == 1 or sum(sizes[i] for i in b) <= 48), f"{label}: over budget"
    # too few graphs to split: padded by repetition, still equal steps
    sampler = CostAwareBatchSampler([1, 1, 1], {"mode": "node_budget", "max_nodes": 4, "max_graphs": 1})
    seen, steps = _steps(sampler, lambda b: b)
    _check("padded", _gather(seen), [0, 1, 2, sampler.padded[0]], steps=steps)

    # 2. create_dataloaders, fixed batch size: DistributedSampler for training
    ds = [
        Data(x=torch.full((n, 2), float(i)), edge_index=torch.zeros(2, 2 * n, dtype=torch.long), idx=torch.tensor([i]))
        for i, n in enumerate(torch.randint(1, 9, (23,), generator=gen).tolist())
    ]
    ids = lambda batch: batch.idx.tolist()  # noqa: E731
    train, val, test = create_dataloaders(ds[:11], ds[11:18], ds[18:19], 3, seed=5)
    assert type(train.sampler).__name__ == "DistributedSampler"
    for epoch in (0, 1):
        set_epoch(train, epoch)
        seen, steps = _steps(train, ids)
        counts = _check(f"fixed train epoch {epoch}", _gather(seen), list(range(11)), exact=False, steps=steps)
        assert set(counts) == set(range(11)) and sum(counts.values()) == 12  # padded by one repeat
    seen, steps = _steps(val, ids)
    _check("fixed val", _gather(seen), list(range(11, 18)), steps=steps)
    seen, steps = _steps(test, ids)  # one sample, two ranks: repeated once
    _check("fixed test", _gather(seen), [18, 18], steps=steps)

    # 3. create_dataloaders, cost-aware
    batching = {"mode": "edge_budget", "max_edges": 20, "oversized_sample": "single", "seed": 1}
    train, val, test = create_dataloaders(ds[:15], ds[15:22], ds[22:], 4, batching=batching)
    for epoch in (0, 1):
        set_epoch(train, epoch)
        seen, steps = _steps(train, ids)
        _check(f"cost train epoch {epoch}", _gather(seen), list(range(15)), steps=steps)
        assert all(b.num_graphs <= 4 and (b.num_graphs == 1 or b.num_edges <= 20) for b in train)
    seen, steps = _steps(val, ids)
    _check("cost val", _gather(seen), list(range(15, 22)), steps=steps)
    seen, steps = _steps(test, ids)
    _check("cost test", _gather(seen), [22, 22], steps=steps)

    dist.barrier()
    report["ok"] = True
    (outdir / f"rank{rank}.json").write_text(json.dumps(report))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    out = Path(sys.argv[1])
    try:
        main(out)
    except Exception:
        traceback.print_exc()
        sys.exit(1)

"""Cost-aware batching: config validation, packing invariants, determinism, rank balancing."""

from __future__ import annotations

import random
import subprocess
import sys
from collections import Counter

import pytest
import torch
from torch_geometric.data import Data

from hydragnn.data.batching import BatchingConfig, CostAwareBatchSampler, FixedBatchSampler, sample_costs
from hydragnn.data.errors import DataError

NODE = {"mode": "node_budget", "max_nodes": 32, "max_graphs": 4}


# --------------------------------------------------------------------------- config
def test_config_defaults_and_round_trip():
    cfg = BatchingConfig.from_dict({"mode": "edge_budget", "max_edges": 100})
    assert (cfg.max_graphs, cfg.oversized_sample, cfg.seed, cfg.drop_last) == (None, "error", 0, False)
    assert cfg.budget == 100
    full = {
        "mode": "node_budget",
        "max_nodes": 256,
        "max_graphs": 16,
        "oversized_sample": "skip",
        "seed": 3,
        "drop_last": True,
    }
    assert BatchingConfig.from_dict(full).to_dict() == full
    assert BatchingConfig.from_dict(cfg.to_dict()) == cfg


def test_config_parses_without_torch():
    import hydragnn.data

    assert hydragnn.data.BatchingConfig is BatchingConfig  # one class, re-exported by batching
    code = (
        "import sys; from hydragnn.data import BatchingConfig; "
        "BatchingConfig.from_dict({'mode': 'node_budget', 'max_nodes': 8}); print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize(
    ("section", "key", "expected"),
    [
        ({"mode": "node_budget", "max_nodes": 8, "batch": 3}, "batch", "unknown key"),
        ({"max_nodes": 8}, "mode", "missing"),
        ({"mode": "atoms", "max_nodes": 8}, "mode", "node_budget"),
        ({"mode": ["node_budget"], "max_nodes": 8}, "mode", "expected one of"),
        ({"mode": "node_budget"}, "max_nodes", "required"),
        ({"mode": "edge_budget", "max_nodes": 8}, "max_edges", "required"),
        ({"mode": "node_budget", "max_nodes": 8, "max_edges": 9}, "max_edges", "only allowed"),
        ({"mode": "node_budget", "max_nodes": 0}, "max_nodes", "integer > 0"),
        ({"mode": "node_budget", "max_nodes": 8.5}, "max_nodes", "expected int or null, found float 8.5"),
        ({"mode": "node_budget", "max_nodes": True}, "max_nodes", "expected int or null, found bool True"),
        ({"mode": "node_budget", "max_nodes": 8, "max_graphs": -1}, "max_graphs", "integer > 0"),
        ({"mode": "node_budget", "max_nodes": 8, "seed": -2}, "seed", "integer >= 0"),
        ({"mode": "node_budget", "max_nodes": 8, "oversized_sample": "drop"}, "oversized_sample", "single"),
        ({"mode": "node_budget", "max_nodes": 8, "seed": "1"}, "seed", "expected int, found str"),
        ({"mode": "node_budget", "max_nodes": 8, "drop_last": 1}, "drop_last", "expected bool, found int 1"),
    ],
)
def test_config_errors_name_key_path(section, key, expected):
    with pytest.raises(DataError, match=rf"Training\.Batching\.{key}") as err:
        BatchingConfig.from_dict(section)
    assert expected in str(err.value)


def test_config_not_a_mapping():
    with pytest.raises(DataError, match="Training.Batching"):
        BatchingConfig.from_dict([1, 2])


# --------------------------------------------------------------------------- packing
def _check_epoch(batches, sizes, budget, max_graphs):
    for b in batches:
        assert b, "empty batch"
        assert len(b) <= max_graphs
        assert sum(sizes[i] for i in b) <= budget or len(b) == 1


@pytest.mark.parametrize("trial", range(6))
def test_budget_never_exceeded_and_each_sample_once(trial):
    rng = random.Random(trial)
    n = rng.randint(1, 300)
    sizes = [rng.randint(0, 40) for _ in range(n)]
    budget = rng.randint(40, 200)
    max_graphs = rng.choice([None, 1, 3, 16])
    cfg = {"mode": "node_budget", "max_nodes": budget, "max_graphs": max_graphs, "seed": trial}
    sampler = CostAwareBatchSampler(torch.tensor(sizes), cfg, shuffle=bool(trial % 2))
    for epoch in range(2):
        sampler.set_epoch(epoch)
        batches = list(sampler)
        assert len(batches) == len(sampler)
        _check_epoch(batches, sizes, budget, max_graphs or n)
        assert sorted(i for b in batches for i in b) == list(range(n))


def test_greedy_packing_is_next_fit_in_order():
    sampler = CostAwareBatchSampler(
        [3, 3, 3, 5, 1, 1, 1, 1], {"mode": "node_budget", "max_nodes": 7, "max_graphs": 3}, shuffle=False
    )
    assert list(sampler) == [[0, 1], [2], [3, 4, 5], [6, 7]]


def test_deterministic_per_seed_and_epoch():
    sizes = [1 + i % 20 for i in range(60)]
    cfg = {"mode": "node_budget", "max_nodes": 50, "seed": 7}
    a, b = CostAwareBatchSampler(sizes, cfg), CostAwareBatchSampler(sizes, cfg)
    a.set_epoch(2)
    b.set_epoch(2)
    assert list(a) == list(b)
    first = list(a)
    a.set_epoch(3)
    assert list(a) != first
    c = CostAwareBatchSampler(sizes, {**cfg, "seed": 8})
    c.set_epoch(2)
    assert list(c) != first


def test_no_shuffle_keeps_dataset_order():
    sampler = CostAwareBatchSampler([2] * 10, NODE, shuffle=False)
    sampler.set_epoch(5)
    assert [i for b in sampler for i in b] == list(range(10))


# --------------------------------------------------------------------------- oversized
def test_oversized_error_names_index_and_size():
    with pytest.raises(DataError, match=r"sample 2 has 40 nodes, over the budget Training\.Batching\.max_nodes=32"):
        CostAwareBatchSampler([1, 2, 40, 50], NODE)


def test_oversized_single_gets_own_batch():
    sizes = [10, 40, 10, 10, 50]
    sampler = CostAwareBatchSampler(sizes, {**NODE, "oversized_sample": "single"}, shuffle=False)
    batches = list(sampler)
    assert [1] in batches and [4] in batches
    assert sorted(i for b in batches for i in b) == list(range(5))
    assert sampler.oversized == [1, 4] and sampler.skipped == []


def test_oversized_skip_drops_and_counts():
    sizes = [10, 40, 10, 10, 50]
    sampler = CostAwareBatchSampler(sizes, {**NODE, "oversized_sample": "skip"})
    assert sampler.skipped == [1, 4]
    assert sorted(i for b in sampler for i in b) == [0, 2, 3]


def test_bad_sizes():
    with pytest.raises(DataError, match="negative"):
        CostAwareBatchSampler([1, -2], NODE)
    with pytest.raises(DataError, match="1-D"):
        CostAwareBatchSampler([[1, 2]], NODE)


# --------------------------------------------------------------------------- ranks (simulated in one process)
def _all_ranks(make, replicas, epoch=0):
    per_rank = []
    for rank in range(replicas):
        s = make(rank)
        s.set_epoch(epoch)
        per_rank.append((s, list(s)))
    return per_rank


@pytest.mark.parametrize("replicas", [2, 3, 4])
@pytest.mark.parametrize("trial", range(3))
def test_ranks_equal_steps_and_exact_cover(replicas, trial):
    rng = random.Random(100 + trial)
    n = rng.randint(replicas * 2, 120)
    sizes = [rng.randint(1, 30) for _ in range(n)]
    cfg = {"mode": "edge_budget", "max_edges": 60, "max_graphs": 5, "seed": trial}
    for epoch in (0, 1):
        runs = _all_ranks(lambda r: CostAwareBatchSampler(sizes, cfg, num_replicas=replicas, rank=r), replicas, epoch)
        counts = {len(batches) for _, batches in runs}
        assert len(counts) == 1 and counts == {len(runs[0][0])}
        seen = [i for _, batches in runs for b in batches for i in b]
        assert sorted(seen) == list(range(n))
        for _, batches in runs:
            _check_epoch(batches, sizes, 60, 5)


def test_ranks_split_one_batch_many_times():
    cfg = {"mode": "node_budget", "max_nodes": 100}
    runs = _all_ranks(lambda r: CostAwareBatchSampler([1] * 10, cfg, shuffle=False, num_replicas=4, rank=r), 4)
    assert [b for _, bs in runs for b in bs] == [[0, 1, 2], [3, 4, 5], [6, 7], [8, 9]]
    assert runs[0][0].padded == []


def test_ranks_drop_last_drops_tail_only():
    sizes = [5] * 22  # 11 batches of 2 at budget 10 over 4 ranks -> 8 kept
    cfg = {"mode": "node_budget", "max_nodes": 10, "drop_last": True}
    runs = _all_ranks(lambda r: CostAwareBatchSampler(sizes, cfg, num_replicas=4, rank=r), 4)
    assert [len(b) for _, b in runs] == [2, 2, 2, 2]
    seen = Counter(i for _, batches in runs for b in batches for i in b)
    assert len(seen) == 16 and max(seen.values()) == 1


def test_ranks_pad_only_when_too_few_samples():
    cfg = {"mode": "node_budget", "max_nodes": 10, "max_graphs": 1}
    runs = _all_ranks(lambda r: CostAwareBatchSampler([1, 1, 1], cfg, shuffle=False, num_replicas=2, rank=r), 2)
    assert [len(b) for _, b in runs] == [2, 2]
    assert runs[0][0].padded == [0]
    assert sorted(i for _, bs in runs for b in bs for i in b) == [0, 0, 1, 2]


def test_ranks_with_no_samples_take_no_steps():
    cfg = {"mode": "node_budget", "max_nodes": 10, "oversized_sample": "skip"}
    runs = _all_ranks(lambda r: CostAwareBatchSampler([20, 30], cfg, num_replicas=2, rank=r), 2)
    assert [len(b) for _, b in runs] == [0, 0]


def test_empty_dataset():
    sampler = CostAwareBatchSampler([], NODE, num_replicas=2, rank=1)
    assert len(sampler) == 0 and list(sampler) == []


def test_bad_rank():
    with pytest.raises(DataError, match="rank"):
        CostAwareBatchSampler([1], NODE, num_replicas=2, rank=2)


# --------------------------------------------------------------------------- fixed batches
def test_fixed_batch_sampler_single_process_matches_plain_chunks():
    assert list(FixedBatchSampler(7, 3)) == [[0, 1, 2], [3, 4, 5], [6]]


def test_fixed_batch_sampler_ranks_split_instead_of_repeat():
    runs = _all_ranks(lambda r: FixedBatchSampler(10, 4, num_replicas=2, rank=r), 2)
    assert [len(b) for _, b in runs] == [2, 2]
    assert sorted(i for _, bs in runs for b in bs for i in b) == list(range(10))
    assert all(len(b) <= 4 for _, bs in runs for b in bs)


# --------------------------------------------------------------------------- costs
def test_sample_costs_nodes_edges_and_errors():
    ds = [Data(x=torch.zeros(3, 1), edge_index=torch.zeros(2, 5, dtype=torch.long)), Data(x=torch.zeros(4, 1))]
    assert sample_costs(ds, "node_budget") == [3, 4]
    with pytest.raises(DataError, match="sample 1: edge_budget batching needs 'edge_index'"):
        sample_costs(ds, "edge_budget")
    assert sample_costs(ds[:1], "edge_budget") == [5]
    with pytest.raises(DataError, match="mode"):
        sample_costs(ds, "graph_budget")


def test_sample_costs_dataset_hook():
    class Sized(list):
        def sample_costs(self, mode):
            return [7] * len(self)

    assert sample_costs(Sized([None, None]), "edge_budget") == [7, 7]

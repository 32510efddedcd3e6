"""collate_graphs builds exactly the Batch that PyG builds; the prefetching loaders yield the same
batches; PackedGraphs cuts out the same batches, and the list stays the source of truth (a
replaced or edited graph is collated from the list)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import Dataset
from torch_geometric.data import Batch, Data

from hydragnn.data import Schema, add_edges, create_dataloaders, prepare, set_epoch
from hydragnn.data.collate import GraphCollater, collate_graphs
from hydragnn.data.emt import CUAU_VARIABLES, generate_cuau
from hydragnn.data.loaders import GraphLoader
from hydragnn.data.packed import PackedGraphs


def assert_same_batch(ours: Batch, pyg: Batch) -> None:
    assert type(ours) is type(pyg)
    assert sorted(ours.keys()) == sorted(pyg.keys())
    for key in pyg.keys():
        a, b = ours[key], pyg[key]
        if isinstance(b, torch.Tensor):
            assert a.dtype == b.dtype and torch.equal(a, b), key
        else:
            assert a == b, key
    assert ours.num_graphs == pyg.num_graphs and ours.num_nodes == pyg.num_nodes
    assert ours._slice_dict.keys() == pyg._slice_dict.keys()
    for key in pyg._slice_dict:
        for mine, theirs in ((ours._slice_dict[key], pyg._slice_dict[key]), (ours._inc_dict[key], pyg._inc_dict[key])):
            assert (mine is None and theirs is None) or torch.equal(mine, theirs), key
    for x, y in zip(ours.to_data_list(), pyg.to_data_list(), strict=True):
        assert sorted(x.keys()) == sorted(y.keys())
        for key in y.keys():
            assert torch.equal(x[key], y[key]) if isinstance(y[key], torch.Tensor) else x[key] == y[key]


def _prepared(n: int) -> list[Data]:
    schema = Schema.from_dict(CUAU_VARIABLES)
    return [add_edges(prepare(s, schema, index=i), 4.0) for i, s in enumerate(generate_cuau(n, seed=3))]


def test_prepared_structures_collate_as_pyg_does_without_pyg(monkeypatch):
    data = _prepared(5)
    expected = [Batch.from_data_list(chunk) for chunk in (data, data[:1], data[2:4])]

    def refused(*args, **kwargs):
        raise AssertionError("prepared graphs must not fall back to PyG's collate")

    monkeypatch.setattr(Batch, "from_data_list", refused)
    for chunk, pyg in zip((data, data[:1], data[2:4]), expected, strict=True):
        assert_same_batch(collate_graphs(chunk), pyg)


def _graph(nodes: int, edges: int, seed: int) -> Data:
    g = torch.Generator().manual_seed(seed)
    return Data(
        x=torch.randn(nodes, 2, generator=g),
        pos=torch.randn(nodes, 3, generator=g),
        edge_index=torch.randint(0, max(nodes, 1), (2, edges), generator=g)
        if nodes
        else torch.zeros(2, 0, dtype=torch.long),
        edge_attr=torch.randn(edges, 1, generator=g),
        graph_output=torch.randn(1, 1, generator=g),
    )


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 9), st.integers(0, 20)), min_size=1, max_size=6), st.integers(0, 1000))
def test_random_graphs_collate_as_pyg_does(shapes, seed):
    data = [_graph(n, e, seed + i) for i, (n, e) in enumerate(shapes)]
    assert_same_batch(collate_graphs(data), Batch.from_data_list(data))


class Tagged(Data):
    def __inc__(self, key, value, *args, **kwargs):
        return 10 if key == "tag" else super().__inc__(key, value, *args, **kwargs)


def test_graphs_outside_the_fast_path_are_collated_by_pyg():
    plain = [_graph(3, 4, 0), _graph(2, 2, 1)]
    named = [Data(**g.to_dict(), name=f"s{i}") for i, g in enumerate(plain)]  # a non-tensor attribute
    tagged = [Tagged(**g.to_dict(), tag=torch.tensor([1])) for g in plain]  # a subclass with its own __inc__
    missing = [
        plain[0],
        Data(
            x=plain[1].x,
            pos=plain[1].pos,
            edge_index=plain[1].edge_index,
            edge_attr=plain[1].edge_attr,
            graph_output=plain[1].graph_output,
            extra=torch.ones(1),
        ),
    ]
    later_scalar = [plain[0], Data(**{**plain[1].to_dict(), "graph_output": torch.tensor(1.0)})]
    for case in (named, tagged, missing):
        assert_same_batch(collate_graphs(case), Batch.from_data_list(case))
    assert torch.equal(collate_graphs(tagged).tag, torch.tensor([1, 11]))
    # a later graph the fast path cannot concatenate is handed to PyG, which reports it
    with pytest.raises(Exception) as pyg_error:
        Batch.from_data_list(later_scalar)
    with pytest.raises(type(pyg_error.value)) as ours:
        collate_graphs(later_scalar)
    assert str(ours.value) == str(pyg_error.value)


def test_loaders_use_the_collater_and_keep_pyg_batches():
    data = _prepared(6)
    train, val, _ = create_dataloaders(data, data, None, 4)
    assert isinstance(train.collate_fn, GraphCollater)
    batches = list(val)
    assert [b.num_graphs for b in batches] == [4, 2]
    assert_same_batch(batches[0], Batch.from_data_list(data[:4]))


class _Failing(list):
    """A dataset whose item ``bad`` raises, as a corrupt sample would."""

    def __init__(self, items, bad):
        super().__init__(items)
        self.bad = bad

    def __getitem__(self, i):
        if i == self.bad:
            raise ValueError(f"sample {i} is corrupt")
        return super().__getitem__(i)


def test_prefetching_loaders_yield_the_same_batches_and_raise_where_the_plain_one_does():
    import threading

    data = _prepared(10)
    for epoch in (0, 1):
        plain, ahead = (create_dataloaders(data, None, None, 3, prefetch=p)[0] for p in (0, 2))
        set_epoch(plain, epoch)
        set_epoch(ahead, epoch)
        for a, b in zip(ahead, plain, strict=True):
            assert_same_batch(a, b)
    before = threading.active_count()
    ahead = create_dataloaders(data, None, None, 2, prefetch=2)[0]
    for _ in zip(range(1), ahead):  # leave early: the thread stops
        pass
    assert threading.active_count() == before
    failing = create_dataloaders(None, _Failing(data, bad=5), None, 2, prefetch=2)[1]
    seen = []
    with pytest.raises(ValueError, match="sample 5 is corrupt"):
        for batch in failing:
            seen.append(batch.num_graphs)
    assert seen == [2, 2]  # samples 0-3; the batch holding sample 5 raised
    assert threading.active_count() == before


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.tuples(st.integers(1, 9), st.integers(0, 20)), min_size=1, max_size=8),
    st.lists(st.integers(0, 7), min_size=1, max_size=10),
    st.integers(0, 1000),
)
def test_a_packed_batch_equals_the_collated_one(shapes, picks, seed):
    """Any selection (repeats included, as a padded distributed epoch has), any node / edge counts."""
    data = [_graph(n, e, seed + i) for i, (n, e) in enumerate(shapes)]
    indices = [p % len(data) for p in picks]
    packed = PackedGraphs.build(data)
    assert packed is not None and packed.current(data, indices)
    assert_same_batch(packed.batch(indices), collate_graphs([data[i] for i in indices]))


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.tuples(st.integers(1, 9), st.integers(0, 20)), min_size=1, max_size=8),
    st.lists(st.lists(st.integers(0, 7), min_size=1, max_size=6), min_size=1, max_size=5),
    st.integers(0, 1000),
)
def test_batches_cut_together_equal_the_collated_ones_and_own_their_tensors(shapes, selections, seed):
    data = [_graph(n, e, seed + i) for i, (n, e) in enumerate(shapes)]
    selections = [[p % len(data) for p in picks] for picks in selections]
    batches = PackedGraphs.build(data).batches(selections)
    assert len(batches) == len(selections)
    for batch, indices in zip(batches, selections, strict=True):
        assert_same_batch(batch, collate_graphs([data[i] for i in indices]))
    # each batch's data tensors have storage of their own: an in-place edit of one (with autograd
    # recording it) touches no other batch and trips no version check elsewhere
    storages = [b[key].untyped_storage().data_ptr() for b in batches for key in data[0].keys() if b[key].numel()]
    assert len(set(storages)) == len(storages)
    weight = torch.ones(2, requires_grad=True)
    batches[0].x.mul_(weight)
    for batch, indices in zip(batches[1:], selections[1:]):
        assert_same_batch(batch, collate_graphs([data[i] for i in indices]))


def test_a_loader_cuts_an_epoch_in_chunks_and_reads_graphs_edited_meanwhile_from_the_list(monkeypatch):
    from hydragnn.data import packed as packed_module

    data = _prepared(10)
    plain = create_dataloaders(_Listed(data), None, None, 3)[0]
    loader = create_dataloaders(data, None, None, 3)[0]
    per_graph = loader.packed.nbytes // len(data)
    monkeypatch.setattr(packed_module, "CHUNK_BYTES", 6 * per_graph)  # two batches of 3 per cut
    cuts = []
    batches = loader.packed.batches
    monkeypatch.setattr(loader.packed, "batches", lambda chunk: cuts.append(len(chunk)) or batches(chunk))
    for epoch in (0, 1):
        set_epoch(loader, epoch)
        set_epoch(plain, epoch)
        for a, b in zip(loader, plain, strict=True):
            assert_same_batch(a, b)
    assert cuts == [2, 2] * 2  # batches of 3, 3 | 3, 1 graphs
    # an in-place edit after its chunk was cut, before its batch is yielded
    set_epoch(loader, 2)
    set_epoch(plain, 2)
    order = list(plain.batch_sampler)
    ours = iter(loader)
    assert_same_batch(next(ours), collate_graphs([data[i] for i in order[0]]))
    data[order[1][0]].pos.add_(1.0)
    assert_same_batch(next(ours), collate_graphs([data[i] for i in order[1]]))


class _Listed(Dataset):
    """The same graphs behind a map-style dataset (not packed)."""

    def __init__(self, items):
        self.items = items

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return self.items[i]


def test_loaders_over_a_list_are_packed_and_yield_the_same_batches():
    data = _prepared(11)
    train, val, _ = create_dataloaders(data, data, None, 4)
    plain, plain_val, _ = create_dataloaders(_Listed(data), _Listed(data), None, 4)
    assert train.packed is not None and val.packed is not None and plain.packed is None
    for epoch in (0, 1):
        set_epoch(train, epoch)
        set_epoch(plain, epoch)
        for a, b in zip(train, plain, strict=True):
            assert_same_batch(a, b)
    for a, b in zip(val, plain_val, strict=True):
        assert_same_batch(a, b)


def test_a_graph_replaced_or_edited_after_packing_is_read_from_the_list():
    data = _prepared(6)
    loader = create_dataloaders(None, data, None, 3)[1]
    data[1].pos.add_(0.5)  # in place
    data[4] = data[4].clone()
    data[4].energy = data[4].energy + 1.0  # a new object holding a new tensor
    first, second = list(loader)
    assert_same_batch(first, collate_graphs(data[:3]))
    assert_same_batch(second, collate_graphs(data[3:]))
    packed = loader.packed
    assert not packed.current(data, [1]) and not packed.current(data, [4]) and packed.current(data, [0, 2, 3, 5])
    data.append(data[0].clone())  # a graph added after packing
    assert not packed.current(data, [6]) and packed.current(data, [0])


def test_what_is_not_packed():
    data = _prepared(4)
    assert GraphLoader(data, batch_size=2, num_workers=1).packed is None  # worker processes collate
    assert GraphLoader(data, batch_size=2, pin_memory=True).packed is None
    assert GraphLoader(data, batch_size=None).packed is None  # no batching
    assert PackedGraphs.build(data, max_bytes=16) is None
    assert PackedGraphs.build([]) is None
    mixed = [data[0], _graph(3, 2, 0)]  # other attributes
    assert PackedGraphs.build(mixed) is None
    wider = [_graph(3, 2, 0), _graph(3, 2, 1)]
    wider[1].x = torch.randn(3, 5)  # node features that do not concatenate
    assert PackedGraphs.build(wider) is None


def test_new_data_sets_attributes_without_the_attribute_error_path(monkeypatch):
    """``new_data`` behaves as ``Data()`` (kinds, batching, copies, pickling) and setting an
    attribute no longer looks PyG's kind cache up through ``__getattr__``."""
    import copy
    import pickle

    from torch_geometric.data import Batch, Data
    from torch_geometric.data.storage import BaseStorage

    from hydragnn.data.pyg_data import new_data

    looked_up = []
    real = BaseStorage.__getattr__

    def spy(self, key):
        looked_up.append(key)
        return real(self, key)

    monkeypatch.setattr(BaseStorage, "__getattr__", spy)
    fast = new_data()
    fast.pos, fast.energy = torch.randn(3, 3), torch.tensor([[1.0]])
    assert "_cached_attr" not in looked_up
    plain = Data(pos=fast.pos, energy=fast.energy)
    assert "_cached_attr" in looked_up  # what new_data avoids
    monkeypatch.undo()
    assert fast.is_node_attr("pos") and not fast.is_node_attr("energy")
    for other in (copy.copy(fast), copy.deepcopy(fast), pickle.loads(pickle.dumps(fast))):
        assert torch.equal(other.pos, plain.pos) and torch.equal(other.energy, plain.energy)
    batch = Batch.from_data_list([fast, plain])
    assert batch.pos.shape == (6, 3) and batch.energy.shape == (2, 1) and batch.batch.tolist() == [0] * 3 + [1] * 3

"""In-memory graphs concatenated once; a batch is a few ``index_select`` calls, not per-graph Python.

:class:`PackedGraphs` concatenates every attribute of a list of prepared graphs once (the same
rules as :func:`~hydragnn.data.collate.collate_graphs`, indices kept local to their graph).
``batches(selections)`` cuts several batches out at once: per group of attributes with the same
per-graph sizes (node-level, edge-level, graph-level) one vector of element ids over all the
selections, one ``index_select`` per attribute and one shift of the ``*index`` attributes by the
node offsets within each batch; every batch then copies its contiguous slice of those tensors
(a batch owns its data tensors, as a collated one does: editing one in place touches no other; its
``batch``, ``ptr`` and slice bookkeeping are views). A loader cuts a chunk of an epoch's batches
(:data:`CHUNK_BYTES`) in one go: on 32 graphs of a few atoms a batch then takes ~0.2 ms instead of
~0.5 ms for its own cut, which was mostly the fixed cost of ~25 small operations. Each result equals
``collate_graphs([graphs[i] for i in indices])``: the same class, tensors, ``batch``, ``ptr``,
``_slice_dict`` and ``_inc_dict``; :meth:`batch` is the cut of one selection.

The list stays the source of truth: :meth:`PackedGraphs.current` says whether the graphs of a
batch still hold the very tensors that were packed, unmodified (object identity and torch's
in-place version counter), and :class:`~hydragnn.data.loaders.GraphLoader` collates the batch
from the list when they do not. Packing copies the tensors (``max_bytes`` caps it).
"""

from __future__ import annotations

import operator
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import hydragnn.data.pyg_import  # noqa: F401 (PyG as HydraGNN needs it)

import torch
from torch_geometric.data import Batch

from .collate import _cat_dim, _data_batch, _fast_keys

__all__ = ["PackedGraphs"]

MAX_BYTES = 2 << 30
"""Largest total tensor size that :meth:`PackedGraphs.build` packs (the copy doubles it)."""
CHUNK_BYTES = 32 << 20
"""Roughly the most tensor bytes that :meth:`PackedGraphs.chunks` puts in one cut of several batches."""


class _SizeGroup:
    """Attributes whose per-graph sizes (along their concatenation dimension) are equal."""

    def __init__(self, sizes: torch.Tensor) -> None:
        self.sizes = sizes
        self.starts = torch.cumsum(sizes, 0) - sizes
        self.ones = bool((sizes == 1).all())

    def cut(self, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(element ids, per-graph sizes, offsets [B + 1])`` of the graphs ``idx``."""
        if self.ones:
            return idx, torch.ones_like(idx), torch.arange(idx.numel() + 1)
        sizes = self.sizes.index_select(0, idx)
        offsets = sizes.new_zeros(idx.numel() + 1)
        torch.cumsum(sizes, 0, out=offsets[1:])
        total = int(offsets[-1])
        shift = self.starts.index_select(0, idx) - offsets[:-1]
        ids = torch.repeat_interleave(shift, sizes, output_size=total) + torch.arange(total)
        return ids, sizes, offsets


class PackedGraphs:
    """The graphs of ``data_list``, every attribute concatenated once (see the module docstring).

    Build it with :meth:`build` (``None`` for lists that do not qualify).
    """

    def __init__(self, data_list: Sequence[Any], keys: list[str], node_key: str) -> None:
        self.items = list(data_list)
        self.keys = keys
        self.dims = [_cat_dim(key) for key in keys]
        columns = [[d._store._mapping[key] for d in self.items] for key in keys]
        self.values = [torch.cat(col, dim=dim) for col, dim in zip(columns, self.dims)]
        self.nbytes = sum(v.numel() * v.element_size() for v in self.values)
        # per graph, its tensors in its own attribute order (what current() compares)
        self.tensors = [list(d._store._mapping.values()) for d in self.items]
        self.versions = [[t._version for t in row] for row in self.tensors]
        groups: dict[tuple[int, ...], _SizeGroup] = {}
        self.groups: list[_SizeGroup] = []
        for col, dim in zip(columns, self.dims):
            sizes = tuple(v.shape[dim] for v in col)
            if sizes not in groups:
                groups[sizes] = _SizeGroup(torch.tensor(sizes, dtype=torch.long))
            self.groups.append(groups[sizes])
        self.unique_groups = list(groups.values())
        self.node_group = self.groups[keys.index(node_key)]

    @classmethod
    def build(cls, dataset: Any, max_bytes: int = MAX_BYTES) -> PackedGraphs | None:
        """Pack ``dataset`` when it is a non-empty list or tuple of graphs that
        :func:`~hydragnn.data.collate.collate_graphs` batches on its fast path, whose tensors
        total at most ``max_bytes`` and concatenate; else ``None``."""
        if not isinstance(dataset, (list, tuple)) or not dataset:
            return None
        found = _fast_keys(dataset)
        if found is None:
            return None
        size = sum(t.numel() * t.element_size() for d in dataset for t in d._store._mapping.values())
        if size > max_bytes:
            return None
        try:
            return cls(dataset, *found)
        except (TypeError, RuntimeError, KeyError):  # shapes or keys that do not concatenate
            return None

    def current(self, dataset: Sequence[Any], indices: Sequence[int]) -> bool:
        """Whether ``dataset[i]`` for every ``i`` in ``indices`` is the graph that was packed,
        holding the same tensors, none modified in place since."""
        items, tensors, versions, n_keys = self.items, self.tensors, self.versions, len(self.keys)
        for i in indices:
            data = dataset[i]
            if i >= len(items) or data is not items[i]:  # a list grown since holds new graphs
                return False
            held = list(data._store._mapping.values())
            if len(held) != n_keys or not all(map(operator.is_, held, tensors[i])):
                return False
            if [t._version for t in held] != versions[i]:
                return False
        return True

    def chunks(
        self, selections: Iterable[Sequence[int]], max_bytes: int | None = None
    ) -> Iterator[list[Sequence[int]]]:
        """``selections`` in order, grouped into lists whose graphs hold about ``max_bytes``
        (default :data:`CHUNK_BYTES`) of tensors at most, and at least one selection each: what one
        :meth:`batches` call cuts."""
        max_bytes = CHUNK_BYTES if max_bytes is None else max_bytes
        per_graph = max(1, self.nbytes // max(1, len(self.items)))
        chunk: list[Sequence[int]] = []
        graphs = 0
        for indices in selections:
            if chunk and (graphs + len(indices)) * per_graph > max_bytes:
                yield chunk
                chunk, graphs = [], 0
            chunk.append(indices)
            graphs += len(indices)
        if chunk:
            yield chunk

    def batch(self, indices: Sequence[int]) -> Batch:
        """The batch of graphs ``indices`` (equal to ``collate_graphs`` of those graphs)."""
        return self.batches([indices])[0]

    def batches(self, selections: Sequence[Sequence[int]]) -> list[Batch]:
        """One batch per selection of graph indices, each equal to ``collate_graphs`` of its graphs
        (see the module docstring); the tensors of different batches never overlap."""
        counts = [len(indices) for indices in selections]
        if not all(counts):
            raise ValueError("PackedGraphs.batches: every selection needs at least one graph")
        n_total, n_batches = sum(counts), len(counts)
        idx = torch.as_tensor([i for indices in selections for i in indices], dtype=torch.long)
        per_batch = torch.tensor(counts, dtype=torch.long)
        first = torch.cumsum(per_batch, 0) - per_batch  # position of each batch's first graph
        batch_of_graph = torch.repeat_interleave(torch.arange(n_batches), per_batch, output_size=n_total)
        # each batch's graph offsets [n + 1] laid end to end: position -> graph (its batch's n + 1 entries)
        ends = per_batch + 1
        ext_graph = torch.arange(n_total + n_batches) - torch.repeat_interleave(torch.arange(n_batches), ends)
        ext_first = torch.repeat_interleave(first, ends, output_size=n_total + n_batches)
        cuts = {}  # per group: element ids, sizes, and per batch (offsets within it, element count)
        for group in self.unique_groups:
            ids, sizes, offsets = group.cut(idx)
            local = offsets.index_select(0, ext_graph) - offsets.index_select(0, ext_first)
            bounds = offsets.index_select(0, first).tolist() + [int(offsets[-1])]
            lengths = [b - a for a, b in zip(bounds[:-1], bounds[1:])]
            cuts[id(group)] = (ids, sizes, local.split(ends.tolist()), lengths)
        _, node_sizes, node_local, node_lengths = cuts[id(self.node_group)]
        node_offsets = torch.cumsum(node_sizes, 0) - node_sizes
        first_of_graph = first.index_select(0, batch_of_graph)  # its batch's first graph, per graph
        starts = node_offsets - node_offsets.index_select(0, first_of_graph)
        position = torch.arange(n_total) - first_of_graph
        graph_of_node = torch.repeat_interleave(position, node_sizes, output_size=sum(node_lengths))
        parts = []
        for dim, value, group in zip(self.dims, self.values, self.groups):
            ids, sizes, _, lengths = cuts[id(group)]
            out = value.index_select(dim, ids)
            if dim == -1:
                out = out + torch.repeat_interleave(starts, sizes, output_size=out.shape[-1]).to(out.dtype)
            parts.append([part.clone(memory_format=torch.contiguous_format) for part in out.split(lengths, dim)])
        inc_index = starts.split(counts)
        inc_zeros = torch.zeros(n_total, dtype=torch.long).split(counts)
        graph_of_node = graph_of_node.split(node_lengths)
        data_batch = _data_batch()
        result = []
        for b, n_graphs in enumerate(counts):
            out = type.__call__(data_batch)
            store = out._store._mapping
            slice_dict: dict[str, torch.Tensor] = {}
            inc_dict: dict[str, torch.Tensor] = {}
            for key, dim, group, part in zip(self.keys, self.dims, self.groups, parts):
                store[key] = part[b]
                inc_dict[key] = inc_index[b] if dim == -1 else inc_zeros[b]
                slice_dict[key] = cuts[id(group)][2][b]
            store["batch"] = graph_of_node[b]
            store["ptr"] = node_local[b]
            out.__dict__.update(_num_graphs=n_graphs, _slice_dict=slice_dict, _inc_dict=inc_dict)
            result.append(out)
        return result

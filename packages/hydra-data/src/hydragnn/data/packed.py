"""In-memory graphs concatenated once; a batch is a few ``index_select`` calls, not per-graph Python.

:class:`PackedGraphs` concatenates every attribute of a list of prepared graphs once (the same
rules as :func:`~hydragnn.data.collate.collate_graphs`, indices kept local to their graph).
``batch(indices)`` cuts a batch out: per group of attributes with the same per-graph sizes
(node-level, edge-level, graph-level) one vector of element ids from the sizes, then one
``index_select`` per attribute and one shift of the ``*index`` attributes by the new node
offsets. The result equals ``collate_graphs([graphs[i] for i in indices])``: the same class,
tensors, ``batch``, ``ptr``, ``_slice_dict`` and ``_inc_dict``.

The list stays the source of truth: :meth:`PackedGraphs.current` says whether the graphs of a
batch still hold the very tensors that were packed, unmodified (object identity and torch's
in-place version counter), and :class:`~hydragnn.data.loaders.GraphLoader` collates the batch
from the list when they do not. Packing copies the tensors (``max_bytes`` caps it).
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Any

import torch
from torch_geometric.data import Batch

from .collate import _cat_dim, _data_batch, _fast_keys

__all__ = ["PackedGraphs"]

MAX_BYTES = 2 << 30
"""Largest total tensor size that :meth:`PackedGraphs.build` packs (the copy doubles it)."""


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

    def batch(self, indices: Sequence[int]) -> Batch:
        """The batch of graphs ``indices`` (equal to ``collate_graphs`` of those graphs)."""
        idx = torch.as_tensor(indices, dtype=torch.long)
        n_graphs = idx.numel()
        cuts = {id(g): g.cut(idx) for g in self.unique_groups}
        _, node_sizes, node_offsets = cuts[id(self.node_group)]
        starts = node_offsets[:-1]
        zeros = torch.zeros(n_graphs, dtype=torch.long)
        out = type.__call__(_data_batch())
        store = out._store._mapping
        slice_dict: dict[str, torch.Tensor] = {}
        inc_dict: dict[str, torch.Tensor] = {}
        for key, dim, value, group in zip(self.keys, self.dims, self.values, self.groups):
            ids, sizes, offsets = cuts[id(group)]
            picked = value.index_select(dim, ids)
            if dim == -1:
                picked = picked + torch.repeat_interleave(starts, sizes, output_size=picked.shape[-1]).to(picked.dtype)
                inc_dict[key] = starts
            else:
                inc_dict[key] = zeros
            slice_dict[key] = offsets
            store[key] = picked
        out.batch = torch.repeat_interleave(torch.arange(n_graphs), node_sizes, output_size=int(node_offsets[-1]))
        out.ptr = node_offsets
        out._num_graphs = n_graphs
        out._slice_dict = slice_dict
        out._inc_dict = inc_dict
        return out

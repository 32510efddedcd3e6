"""Collation of prepared graphs into a PyG ``Batch``, without PyG's per-attribute Python work.

:func:`collate_graphs` returns exactly what ``Batch.from_data_list`` returns (the same tensors,
``batch``, ``ptr``, ``_slice_dict`` and ``_inc_dict``, so ``to_data_list`` and ``get_example``
work) but builds it with one ``cat`` per attribute and one vectorised index increment, where PyG
asks each graph for its ``__cat_dim__`` / ``__inc__`` per attribute. Prepared graphs from
:func:`hydragnn.data.prepare` always qualify (plain ``Data``, the same tensor attributes in every
graph); anything else (``Data`` subclasses, non-tensor or scalar attributes, differing keys or
dtypes, ``*batch*`` attributes, tensors off the CPU) goes to ``Batch.from_data_list`` unchanged. On 32 graphs of 2-8
nodes it takes a fraction of PyG's time (``tools/bench/train_throughput.py`` reports both).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import hydragnn.data.pyg_import  # noqa: F401 (PyG as HydraGNN needs it)

import torch
from torch_geometric.data import Batch, Data
from torch_geometric.data.storage import N_KEYS
from torch_geometric.loader.dataloader import Collater

__all__ = ["GraphCollater", "collate_graphs"]


def _cat_dim(key: str) -> int:
    return -1 if "index" in key or key == "face" else 0


def _fast_keys(data_list: Sequence[Any]) -> tuple[list[str], str] | None:
    """The attribute names and the attribute that gives node counts (PyG's first ``N_KEYS``
    attribute) when the graphs qualify for the fast path, else ``None``. Only the first graph's
    values are inspected: a later graph that differs makes ``torch.cat`` raise, and
    :func:`collate_graphs` then hands the list to PyG."""
    first = data_list[0]
    if type(first) is not Data:
        return None
    mapping = first._store._mapping
    keys = list(mapping)
    if any(key in ("num_nodes", "ptr") or "batch" in key for key in keys):
        return None
    if any(type(v) is not torch.Tensor or v.dim() == 0 or v.device.type != "cpu" for v in mapping.values()):
        return None
    node_key = next((key for key in keys if key in N_KEYS), None)
    if node_key is None:
        return None
    first_keys = mapping.keys()
    if any(type(d) is not Data or d._store._mapping.keys() != first_keys for d in data_list):
        return None
    return keys, node_key


def collate_graphs(data_list: Sequence[Any]) -> Batch:
    """Collate ``data_list`` into a ``Batch`` equal to ``Batch.from_data_list(data_list)``.

    Attributes whose name contains ``index`` (or is ``face``) are concatenated along their last
    dimension and shifted by the nodes of the graphs before them; every other attribute is
    concatenated along dimension 0 (PyG's rules for plain ``Data``).
    """
    data_list = list(data_list)
    found = _fast_keys(data_list) if data_list else None
    if found is None:
        return Batch.from_data_list(data_list)
    try:
        return _collate(data_list, *found)
    except (TypeError, RuntimeError, AttributeError, IndexError):
        return Batch.from_data_list(data_list)


def _collate(data_list: list[Data], keys: list[str], node_key: str) -> Batch:
    node_dim = _cat_dim(node_key)
    counts = [d._store._mapping[node_key].shape[node_dim] for d in data_list]
    n_graphs = len(data_list)
    dims = [_cat_dim(key) for key in keys]
    columns = [[data._store._mapping[key] for data in data_list] for key in keys]
    flat = counts + [v.shape[d] for col, d in zip(columns, dims) for v in col]
    sizes = torch.tensor(flat, dtype=torch.long).view(len(keys) + 1, n_graphs)
    offsets = sizes.new_zeros(len(keys) + 1, n_graphs + 1)
    torch.cumsum(sizes, 1, out=offsets[:, 1:])
    node_offsets = offsets[0, :-1]
    zeros = torch.zeros(n_graphs, dtype=torch.long)
    shift = sum(counts[:-1]) > 0
    out = type.__call__(_data_batch())  # PyG's Batch(_base_cls=Data) builds its class anew each call
    store = out._store._mapping
    slice_dict: dict[str, torch.Tensor] = {}
    inc_dict: dict[str, torch.Tensor] = {}
    for k, (key, col, dim) in enumerate(zip(keys, columns, dims)):
        value = torch.cat(col, dim=dim)
        if dim == -1:
            if shift:
                value = value + torch.repeat_interleave(node_offsets, sizes[k + 1]).to(value.dtype)
            inc_dict[key] = node_offsets
        else:
            inc_dict[key] = zeros
        slice_dict[key] = offsets[k + 1]
        store[key] = value
    out.batch = torch.repeat_interleave(torch.arange(n_graphs), sizes[0])
    out.ptr = offsets[0]
    out._num_graphs = n_graphs
    out._slice_dict = slice_dict
    out._inc_dict = inc_dict
    return out


@functools.cache
def _data_batch() -> type:
    """The ``DataBatch`` class that ``Batch.from_data_list`` returns for plain ``Data``."""
    return type(Batch(_base_cls=Data))


class GraphCollater(Collater):
    """PyG's loader ``Collater`` with :func:`collate_graphs` for lists of graphs."""

    def __call__(self, batch: list[Any]) -> Any:
        if batch and isinstance(batch[0], Data) and not self.follow_batch and not self.exclude_keys:
            return collate_graphs(batch)
        return super().__call__(batch)

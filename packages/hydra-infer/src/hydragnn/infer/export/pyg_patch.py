"""``pyg_index_select_restored``: torch's own ``torch.index_select`` while metatomic (TorchScript) is
imported or a model is scripted and saved. PyG replaces ``torch.index_select`` by a Python
function when ``torch_geometric.hash_tensor`` loads; TorchScript cannot compile calls to it."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator

import torch

__all__ = ["pyg_index_select_restored"]


@contextlib.contextmanager
def pyg_index_select_restored() -> Iterator[None]:
    """``torch.index_select`` as torch defines it for the duration (undoing PyG's patch, then redoing it)."""
    hash_tensor = sys.modules.get("torch_geometric.hash_tensor")
    original = getattr(hash_tensor, "_old_index_select", None)
    patched = torch.index_select
    if original is None or patched is original:
        yield
        return
    torch.index_select = original
    try:
        yield
    finally:
        torch.index_select = patched

"""PyTorch Geometric and TorchScript in one process, in either import order.

Importing ``torch_geometric`` replaces ``torch.index_select`` and ``torch.select`` by Python
wrappers (``torch_geometric.hash_tensor``, for its ``HashTensor``). TorchScript resolves
``torch.index_select`` by its Python object, no longer finds a builtin and tries to compile the
wrapper, which fails: a library that scripts code calling them after PyG loaded (metatensor-torch
and metatomic-torch at import) raised a RuntimeError when HydraGNN was imported first. Under
scripting each wrapper is the aten op it wraps (its HashTensor branch is guarded by
``torch.jit.is_scripting()``), so :func:`keep_scripting_builtins` registers each wrapper as that
builtin: TorchScript then compiles exactly what it compiled before PyG loaded, and eager calls
still go through PyG's wrapper. The lazy public names of every ``hydragnn`` package call it after
loading a module, which undoes only this side effect of PyG's import; nothing else changes.
"""

from __future__ import annotations

import sys

__all__ = ["keep_scripting_builtins"]

_WRAPPED = (("index_select", "aten::index_select"), ("select", "aten::select"))


def keep_scripting_builtins() -> list[str]:
    """Register PyG's replacements of ``torch.index_select`` / ``torch.select`` as the TorchScript
    builtins they wrap (idempotent; nothing when PyG is not loaded or did not replace them).
    Returns the names registered by this call."""
    hash_tensor = sys.modules.get("torch_geometric.hash_tensor")
    if hash_tensor is None:
        return []
    import torch
    from torch.jit import _builtins

    done = []
    for name, op in _WRAPPED:
        current, original = getattr(torch, name), getattr(hash_tensor, f"_old_{name}", None)
        if original is None or current is original or _builtins._find_builtin(current) is not None:
            continue
        _builtins._register_builtin(current, op)
        done.append(name)
    return done

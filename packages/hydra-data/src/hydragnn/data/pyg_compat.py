"""PyTorch Geometric and TorchScript in one process, in either import order.

Importing ``torch_geometric`` replaces ``torch.index_select`` and ``torch.select`` by Python
wrappers (``torch_geometric.hash_tensor``, for its ``HashTensor``). TorchScript resolves
``torch.index_select`` by its Python object, no longer finds a builtin and tries to compile the
wrapper, which fails: a library that scripts code calling them after PyG loaded (metatensor-torch
and metatomic-torch at import) raised a RuntimeError when HydraGNN was imported first. Under
scripting each wrapper is the aten op it wraps (its HashTensor branch is guarded by
``torch.jit.is_scripting()``), so :func:`keep_scripting_builtins` registers each wrapper as that
builtin: TorchScript then compiles exactly what it compiled before PyG loaded, and eager calls
still go through PyG's wrapper. :mod:`hydragnn.data.pyg_import`, which every ``hydragnn`` module
that uses PyG imports first, calls it after PyG's import; that undoes only this side effect of
PyG's import, and nothing else changes.

torch 2.14 deprecates TorchScript: ``torch.jit.script`` / ``save`` / ``load`` warn (a
``FutureWarning``) on each first use, and PyG scripts a class at import, so every command printed
a warning its user could do nothing about. HydraGNN uses TorchScript on purpose (PyG's import, the
``torchscript`` export format that LAMMPS and metatomic load), and does so inside
:func:`torchscript_quietly`, which hides that one warning for the duration of the block only: the
process's warning filters are as they were afterwards, and a user's own TorchScript calls still warn.
"""

from __future__ import annotations

import contextlib
import sys
import warnings
from collections.abc import Iterator

__all__ = ["keep_scripting_builtins", "torchscript_quietly"]

# torch>=2.14's messages: "`torch.jit.script` is deprecated. Please switch to ..." (also save, load)
_DEPRECATED = r"`torch\.jit\.\w+` is (deprecated|not supported)"

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


@contextlib.contextmanager
def torchscript_quietly() -> Iterator[None]:
    """A block whose TorchScript calls (and PyG's import) do not print torch's deprecation of
    TorchScript (a ``FutureWarning`` on torch >= 2.14); every other warning is shown as before,
    and the warning filters are restored on exit."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_DEPRECATED, category=FutureWarning)
        yield

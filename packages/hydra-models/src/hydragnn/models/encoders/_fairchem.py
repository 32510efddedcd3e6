"""Shared by the fairchem-backed encoders (:mod:`.uma`, :mod:`.allscaip`): the lazy import of
``fairchem-core`` (extra ``hydra-models[fairchem]``), system-level inputs, dtype handling and
the checks common to both. Importing this module does not import fairchem."""

from __future__ import annotations

import importlib
from typing import Any

import torch
from torch import nn

from ..errors import ModelConfigError
from .base import EncoderDims, GraphInputs

ROOT = "NeuralNetwork.Architecture"
INSTALL = 'pip install "hydra-models[fairchem]"'


def _import(module: str, mpnn_type: str) -> Any:
    """Import a fairchem module or raise a :class:`ModelConfigError` naming the extra."""
    try:
        return importlib.import_module(module)
    except ImportError as err:
        raise ModelConfigError(
            f"{ROOT}.mpnn_type: {mpnn_type} needs fairchem-core ({module} could not be imported: {err}); "
            f"install it with: {INSTALL}"
        ) from err


class _SystemDict(dict):
    """The fields fairchem's backbones read from ``AtomicData``, as a dict.

    ``AtomicData`` validates itself with ``.item()`` calls (host synchronisation); the backbones
    only index it and call ``get(key, default=...)``, which this class adds.
    """

    def get(self, key: str, default: Any = None) -> Any:  # noqa: D102 - dict.get with a keyword default
        return super().get(key, default)


def _system_ints(inputs: GraphInputs, index: int | None) -> torch.Tensor:
    """Per-system integer input ``[B]`` (int64): column ``index`` of ``graph_attr`` rounded, or zeros."""
    if index is None or inputs.graph_attr is None:
        return torch.zeros(inputs.num_graphs, dtype=torch.long, device=inputs.x.device)
    return inputs.graph_attr[:, index].round().long()


class _Method(nn.Module):
    """Calls ``module.<method>`` (so :func:`torch.func.functional_call` can run any method)."""

    def __init__(self, module: nn.Module, method: str) -> None:
        super().__init__()
        self.module = module
        self.method = method

    def forward(self, *args: Any) -> Any:
        return getattr(self.module, self.method)(*args)


def _compute_dtype(module: nn.Module, allow_fp64: bool) -> torch.dtype:
    """float64 for a float64 module when ``allow_fp64``, else float32 (also for bf16 / fp16)."""
    dtype = next(module.parameters()).dtype
    return torch.float64 if (dtype == torch.float64 and allow_fp64) else torch.float32


def _call_in(dtype: torch.dtype, module: nn.Module, method: str, *args: Any) -> Any:
    """``module.<method>(*args)`` with its floating parameters and buffers cast to ``dtype``.

    The parameters keep the model's dtype (and receive gradients through the cast): fairchem's
    layers deviate by ~20 % in forces in pure bf16 (fairchem uses bf16 only through autocast), and
    AllScAIP computes some features in float32 only.
    """
    tensors: dict[str, torch.Tensor] = dict(module.named_parameters())
    tensors.update(module.named_buffers())
    if all(t.dtype == dtype for t in tensors.values() if t.is_floating_point()):
        return getattr(module, method)(*args)
    cast = {f"module.{k}": (t.to(dtype) if t.is_floating_point() else t) for k, t in tensors.items()}
    return torch.func.functional_call(_Method(module, method), cast, args)


def _check_common(config: Any, dims: EncoderDims, mpnn_type: str) -> None:
    for key in ("charge_index", "spin_index"):
        index = getattr(config, key)
        if index is not None and not 0 <= index < dims.graph_in:
            raise ModelConfigError(
                f"{ROOT}.{key}: {mpnn_type} reads column {index} of the graph inputs; the schema has "
                f"{dims.graph_in} graph input column(s)"
            )


# ============================================================================================ UMA

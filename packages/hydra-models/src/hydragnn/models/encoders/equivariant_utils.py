"""Helpers shared by the equivariant encoders (PAINN, EGNN, PNAEq): embedding, edge inputs, checks.

Everything here is capture-safe (no host synchronisation, no data-dependent shapes) and
safe on padded batches whose sink edges have zero length: lengths, unit vectors and norms
have finite values *and* finite gradients at zero.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from ..errors import ModelConfigError, ModelError
from ..nn.geometry import safe_norm, safe_unit_vectors
from .base import EncoderDims, GraphInputs


class AtomEmbedding(nn.Module):
    """Initial node scalars ``[N, F] -> [N, hidden_dim]``.

    With ``dims.num_species > 0`` column 0 of ``x`` is an atomic number embedded by an
    :class:`~torch.nn.Embedding`; the remaining columns (if any) are added through a linear
    layer. Without species, a linear layer reads all of ``x``.
    """

    def __init__(self, dims: EncoderDims) -> None:
        super().__init__()
        hidden = dims.hidden_dim
        self.species: nn.Embedding | None = None
        self.extra: nn.Linear | None = None
        self.linear: nn.Linear | None = None
        if dims.num_species > 0:
            self.species = nn.Embedding(dims.num_species, hidden)
            if dims.node_in > 1:
                self.extra = nn.Linear(dims.node_in - 1, hidden, bias=False)
        else:
            self.linear = nn.Linear(dims.node_in, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x [N, F]`` -> ``[N, hidden_dim]`` in the module's dtype."""
        if self.species is not None:
            h = self.species(x[:, 0].long())
            if self.extra is not None:
                h = h + self.extra(x[:, 1:].to(h.dtype))
            return h
        assert self.linear is not None
        return self.linear(x.to(self.linear.weight.dtype))


def edge_geometry(inputs: GraphInputs, encoder: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Edge lengths ``[E]`` and unit vectors ``[E, 3]`` from ``inputs.edge_vec``.

    The length is recomputed from ``edge_vec`` with a double ``torch.where`` so that a
    zero-length (padded sink) edge has length 0, unit vector 0 and zero, not NaN, gradients;
    ``inputs.edge_len`` is therefore not read (its gradient at 0 may be NaN).
    """
    vec = inputs.edge_vec
    if vec is None:
        raise ModelError(f"encoder {encoder} needs positions: GraphInputs.edge_vec is None")
    length = safe_norm(vec)
    return length, safe_unit_vectors(vec, length)


def edge_attributes(inputs: GraphInputs, dims: EncoderDims, encoder: str, dtype: torch.dtype) -> torch.Tensor | None:
    """The schema's edge inputs ``[E, edge_in]`` in ``dtype``, or None when ``dims.edge_in == 0``."""
    if dims.edge_in <= 0:
        return None
    if inputs.edge_attr is None:
        raise ModelError(f"encoder {encoder} was built with edge_in={dims.edge_in} but GraphInputs.edge_attr is None")
    return inputs.edge_attr.to(dtype)


def call_layer(layer: Callable[..., object], checkpointing: bool, *args: object) -> object:
    """Run ``layer(*args)``, through activation checkpointing when asked and grads are on."""
    if checkpointing and torch.is_grad_enabled():
        return checkpoint(layer, *args, use_reentrant=False)
    return layer(*args)


class VectorReadout(nn.Module):
    """Optional channel projection of the vector features ``[N, 3, H] -> [N, 3, C]`` (no bias)."""

    def __init__(self, hidden: int, channels: int | None) -> None:
        super().__init__()
        self.proj = None if channels is None or channels == hidden else nn.Linear(hidden, channels, bias=False)

    def forward(self, v: torch.Tensor) -> torch.Tensor:
        return v if self.proj is None else self.proj(v)


def check_dims(dims: EncoderDims, encoder: str) -> None:
    """Sizes every equivariant encoder needs."""
    for key in ("hidden_dim", "num_conv_layers", "num_radial"):
        value = getattr(dims, key)
        if value <= 0:
            raise ModelConfigError(
                f"NeuralNetwork.Architecture.{key}: {encoder} needs a positive value, found {value!r}"
            )
    if not dims.radius > 0:
        raise ModelConfigError(
            f"NeuralNetwork.Architecture.radius: {encoder} needs a positive cutoff, found {dims.radius!r}"
        )
    if dims.num_species <= 0 and dims.node_in <= 0:
        raise ModelConfigError(f"{encoder}: needs node input features (node_in > 0) or num_species > 0")

"""Helpers shared by the equivariant encoders (PAINN, EGNN, PNAEq): embedding, edge inputs, checks.

Everything here is capture-safe (no host synchronisation, no data-dependent shapes) and
safe on padded batches whose sink edges have zero length: lengths, unit vectors and norms
have finite values *and* finite gradients at zero.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar, cast

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from ..errors import ModelConfigError, ModelError
from ..nn import BesselRBF, CosineCutoff
from ..nn.geometry import safe_norm, safe_unit_vectors
from .base import ConfigT, Encoder, EncoderDims, GraphInputs


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


_Out = TypeVar("_Out")


def call_layer(layer: Callable[..., _Out], checkpointing: bool, *args: object) -> _Out:
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


class EquivariantEncoder(Encoder[ConfigT]):
    """Base of the encoders that carry invariant scalars ``s [N, H]`` and equivariant vectors
    ``v [N, 3, C]`` per atom from positions (PAINN, PNAEq, EGNN).

    It fills a missing config with the subclass's ``Config()``, checks the sizes, then builds,
    in this order (so parameters draw from the RNG as each encoder always did), the atom
    embedding, the Bessel radial basis (trainable when the config's ``trainable_rbf`` is) and the
    cosine cutoff; the subclass builds ``layers`` after. :meth:`edge_inputs` is the common start
    of ``forward``, :meth:`run_layers` the common layer loop (activation checkpointing per layer,
    :meth:`Encoder.mix` after each).
    """

    equivariant = True
    needs_pos = True
    layers: nn.ModuleList
    """The conv layers (built by the subclass after this base)."""

    def __init__(self, dims: EncoderDims, config: ConfigT | None = None) -> None:
        config = cast(ConfigT, self.Config()) if config is None else config
        super().__init__(dims, config)
        check_dims(dims, self.name)
        self.embedding = AtomEmbedding(dims)
        self.rbf = BesselRBF(dims.radius, dims.num_radial, trainable=getattr(config, "trainable_rbf", False))
        self.cutoff = CosineCutoff(dims.radius)

    @property
    def name(self) -> str:
        return type(self).__name__

    def edge_inputs(self, inputs: GraphInputs) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """``(s [N, H], length [E], unit [E, 3], edge_attr [E, edge_in] or None)``: the embedded
        atoms and the edge geometry and inputs in their dtype."""
        length, unit = edge_geometry(inputs, self.name)
        s = self.embedding(inputs.x)
        edge_attr = edge_attributes(inputs, self.dims, self.name, s.dtype)
        return s, length.to(s.dtype), unit.to(s.dtype), edge_attr

    def run_layers(
        self, s: torch.Tensor, v: torch.Tensor | None, inputs: GraphInputs, checkpointing: bool, *args: object
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``s, v = layer(s, v, *args)`` for every layer, each followed by :meth:`Encoder.mix`."""
        for i, layer in enumerate(self.layers):
            s_in = s
            s, v = call_layer(layer, checkpointing, s, v, *args)
            s = self.mix(i, s_in, s, inputs)
        return s, v

"""Shared pieces of the invariant encoders (GIN, GAT, SAGE, MFC, CGCNN, PNA, PNAPlus).

Invariant encoders see geometry only through edge lengths. Each one is a stack of
``dims.num_conv_layers`` convolutions of width ``dims.hidden_dim`` on top of

* :class:`NodeInputEmbedding`: a learned embedding of the atomic number ``x[:, 0]`` when
  ``dims.num_species > 0`` (plus a linear map of the remaining columns), else a linear map of x;
* :class:`RadialEdgeFeatures`: a radial basis of ``edge_len`` times a smooth cutoff envelope,
  concatenated with the schema's ``edge_attr``; and the envelope itself, ``[E, 1]``, which the
  convolutions use to gate messages so that a neighbour's contribution goes smoothly to zero at
  the cutoff radius.

Geometry is used when the inputs carry ``edge_len`` (positions given) and the encoder was built
with ``dims.radius > 0`` and ``dims.num_radial > 0``. Without ``edge_len`` (non-geometric data)
the radial part of the edge features is zero and the envelope is one, so the same weights run.

Everything here is capture-safe: reductions use explicit ``dim_size``, there is no host sync and
no data-dependent shape.
"""

from __future__ import annotations

from typing import ClassVar, TypeVar

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from ..encoder_configs import EncoderConfig
from ..encoder_configs.base import check_at_least
from ..encoder_configs.invariant import (  # the keys and their checks live torch-free
    CUTOFF_FUNCTIONS,
    RADIAL_BASES,
    WHERE,
    InvariantConfig,
    check_choice,
)
from ..errors import ModelConfigError, ModelError
from ..nn.activations import make_activation
from ..nn.radial import BesselRBF, CosineCutoff, GaussianRBF, PolynomialCutoff
from .base import Encoder, EncoderDims, GraphInputs, NodeEmbedding


class NodeInputEmbedding(nn.Module):
    """Node inputs ``x [N, node_in]`` to ``[N, hidden_dim]``.

    With ``num_species > 0``: ``Embedding(num_species)`` of ``int(x[:, 0])`` (the table covers
    atomic numbers ``0 .. num_species - 1``, 0 for padding; out-of-range values are clamped, as
    an index error cannot be raised without a host sync), plus a bias-free linear map of
    ``x[:, 1:]`` when there are more columns. Otherwise a linear map of all of ``x``.
    """

    def __init__(self, dims: EncoderDims) -> None:
        super().__init__()
        if dims.node_in < 1:
            raise ModelConfigError(f"{WHERE}: invariant encoders need node inputs, found node_in={dims.node_in}")
        self.num_species = int(dims.num_species)
        self.species: nn.Embedding | None = None
        self.extra: nn.Linear | None = None
        self.linear: nn.Linear | None = None
        if self.num_species > 0:
            self.species = nn.Embedding(self.num_species, dims.hidden_dim)
            if dims.node_in > 1:
                self.extra = nn.Linear(dims.node_in - 1, dims.hidden_dim, bias=False)
        else:
            self.linear = nn.Linear(dims.node_in, dims.hidden_dim)

    def forward(self, x: Tensor) -> Tensor:
        """``x [N, node_in]`` -> ``[N, hidden_dim]`` in the module's dtype."""
        if self.species is None:
            assert self.linear is not None
            return self.linear(x.to(self.linear.weight.dtype))
        z = x[:, 0].long().clamp(0, self.num_species - 1)
        h = self.species(z)
        if self.extra is not None:
            h = h + self.extra(x[:, 1:].to(h.dtype))
        return h


class RadialEdgeFeatures(nn.Module):
    """Edge features ``cat[rbf(edge_len) * env, edge_attr]`` ``[E, out_dim]`` and envelope ``[E, 1]``.

    ``out_dim = num_radial (when geometric) + edge_in``; the features are ``None`` when it is 0.
    """

    def __init__(self, dims: EncoderDims, config: InvariantConfig) -> None:
        super().__init__()
        check_choice("radial_basis", config.radial_basis, RADIAL_BASES)
        check_choice("cutoff_function", config.cutoff_function, CUTOFF_FUNCTIONS)
        check_at_least("envelope_exponent", config.envelope_exponent)
        self.geometric = dims.radius > 0 and dims.num_radial > 0
        self.num_radial = int(dims.num_radial) if self.geometric else 0
        self.edge_in = int(dims.edge_in)
        self.out_dim = self.num_radial + self.edge_in
        self.rbf: nn.Module | None = None
        self.envelope: nn.Module | None = None
        if self.geometric:
            if config.radial_basis == "gaussian":
                self.rbf = GaussianRBF(dims.radius, dims.num_radial)
            else:
                self.rbf = BesselRBF(dims.radius, dims.num_radial)
            if config.cutoff_function == "cosine":
                self.envelope = CosineCutoff(dims.radius)
            else:
                self.envelope = PolynomialCutoff(dims.radius, config.envelope_exponent)

    def forward(self, inputs: GraphInputs) -> tuple[Tensor | None, Tensor]:
        num_edges = inputs.edge_index.shape[1]
        length = inputs.edge_len
        dtype = length.dtype if length is not None else inputs.x.dtype
        device = inputs.x.device
        parts: list[Tensor] = []
        if self.geometric and length is not None:
            assert self.rbf is not None and self.envelope is not None
            env = self.envelope(length).unsqueeze(-1)
            parts.append(self.rbf(length) * env)
        else:
            env = torch.ones(num_edges, 1, dtype=dtype, device=device)
            if self.geometric:
                parts.append(torch.zeros(num_edges, self.num_radial, dtype=dtype, device=device))
        if self.edge_in > 0:
            if inputs.edge_attr is None:
                raise ModelError(f"encoder built with edge_in={self.edge_in} but the inputs carry no edge_attr")
            parts.append(inputs.edge_attr.to(dtype).reshape(num_edges, self.edge_in))
        if not parts:
            return None, env
        feat = parts[0] if len(parts) == 1 else torch.cat(parts, dim=-1)
        return feat, env


InvariantConfigT = TypeVar("InvariantConfigT", bound=InvariantConfig)


class InvariantEncoder(Encoder[InvariantConfigT]):
    """Base of the invariant encoders: embedding, edge features, a stack of convolutions.

    Subclasses set ``Config`` and implement :meth:`make_conv`; a convolution is called as
    ``conv(h, edge_index, edge_feat, env) -> [N, hidden_dim]`` (override :meth:`apply_conv`
    for another calling convention). Each layer is ``h <- h + act(conv(h))`` with
    ``residual``, else ``h <- act(conv(h))``.
    """

    Config: ClassVar[type[EncoderConfig]] = InvariantConfig
    equivariant: ClassVar[bool] = False
    needs_pos: ClassVar[bool] = False

    def __init__(self, dims: EncoderDims, config: InvariantConfigT) -> None:
        super().__init__(dims, config)
        check_at_least("hidden_dim", dims.hidden_dim)
        check_at_least("num_conv_layers", dims.num_conv_layers)
        self.embedding = NodeInputEmbedding(dims)
        self.edges = RadialEdgeFeatures(dims, config)
        self.act = make_activation(config.activation)
        self.residual = bool(config.residual)
        self.checkpointing = bool(dims.conv_checkpointing)
        self.convs = nn.ModuleList(
            [self.make_conv(dims, config, self.edges.out_dim) for _ in range(dims.num_conv_layers)]
        )

    def make_conv(self, dims: EncoderDims, config: InvariantConfigT, edge_dim: int) -> nn.Module:
        """One convolution ``hidden_dim -> hidden_dim`` taking ``edge_dim`` edge features."""
        raise NotImplementedError

    def apply_conv(
        self, conv: nn.Module, h: Tensor, edge_index: Tensor, edge_feat: Tensor | None, env: Tensor
    ) -> Tensor:
        return conv(h, edge_index, edge_feat, env)

    def _layer(self, conv: nn.Module, h: Tensor, edge_index: Tensor, edge_feat: Tensor | None, env: Tensor) -> Tensor:
        out = self.act(self.apply_conv(conv, h, edge_index, edge_feat, env))
        return h + out if self.residual else out

    def forward(self, inputs: GraphInputs) -> NodeEmbedding:
        h = self.embedding(inputs.x)  # in the module's dtype
        edge_feat, env = self.edges(inputs)
        env = env.to(h.dtype)
        edge_feat = None if edge_feat is None else edge_feat.to(h.dtype)
        edge_index = inputs.edge_index
        for i, conv in enumerate(self.convs):
            h_in = h
            if self.checkpointing and torch.is_grad_enabled():
                h = checkpoint(self._layer, conv, h, edge_index, edge_feat, env, use_reentrant=False)
            else:
                h = self._layer(conv, h, edge_index, edge_feat, env)
            h = self.mix(i, h_in, h, inputs)
        return NodeEmbedding(scalar=h)

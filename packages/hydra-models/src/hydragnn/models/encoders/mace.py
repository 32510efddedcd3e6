"""MACE (Batatia et al. 2022, "MACE: Higher Order Equivariant Message Passing Neural Networks").

Each layer: an equivariant convolution builds the atomic basis ``A_i`` (node features
``Linear(h_j)`` times the edge spherical harmonics ``Y(r_ij)`` up to ``max_ell``, weighted
per path and channel by a radial MLP on a Bessel basis with a polynomial cutoff, summed over
neighbours and divided by the constant ``avg_num_neighbors``, the training set's mean in-degree
unless the config sets it); a many-body product of ``A`` up to ``correlation`` copies with
element-dependent weights (:class:`~hydragnn.models.nn.mace.ProductBasis`, a compact symmetric
contraction: see its docstring for how it differs from MACE's U-matrix version); an element-dependent residual
(``FullyConnectedTensorProduct(h, one-hot species)``, from the second layer on, as in the MACE
paper, or from the first with ``residual_first_layer``, as mace-torch 0.3 does by default).
Node features are ``hidden_dim`` channels of each irrep ``0e, 1o, ..., node_max_ell``
(``node_max_ell = 0``: scalars only, mace-torch's ``max_L=0``).
Per-species tables have a row per atomic number below ``num_species``, or per listed
``elements`` (mace-torch's z table, which is what makes its models several times smaller).

Defaults: ``max_ell = 2``, ``correlation = 3`` (body order 4), a 3 x 64 radial MLP, as in MACE's
smaller published models (docs/notes/encoder_design.md); the input scales: ``MACEConfig.scales``.
Output: ``scalar`` = the ``0e`` channels ``[N, hidden_dim]``, ``vector`` = the ``1o`` channels
``[N, 3, hidden_dim]`` in ``(x, y, z)`` order (e3nn 0.6's ``1o`` basis is already Cartesian),
``None`` with ``node_max_ell = 0``.

Capture-safe: fixed shapes, scatter with ``dim_size = N``, species one-hot by comparison with
``arange(num_species)``. Zero-length (padding) edges: unit vector 0, so their harmonics are
``Y_0`` only, radial basis finite, gradients zero; they only touch the sink.

bf16 / fp16: e3nn's tensor products and linears run in the module's dtype (they work in bf16,
with bf16 accuracy); the geometry (lengths, unit vectors, harmonics, radial basis) is computed in
float32 and cast to the module dtype.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from e3nn import o3
from torch import nn
from torch.utils.checkpoint import checkpoint

from ..encoder_configs.base import ROOT
from ..encoder_configs.geometric import MACE_DEFAULT_AVG_NUM_NEIGHBORS, MACEConfig
from ..errors import ModelConfigError, ModelError
from ..nn._e3nn import irreps
from ..nn.geometry import safe_norm, safe_unit_vectors
from ..nn.mace import E3nnResidual, Interaction, ProductBasis, natural_irreps
from ..nn.radial import BesselRBF, PolynomialCutoff
from .base import Encoder, EncoderDims, GraphInputs, NodeEmbedding, register_encoder
from .graph_statistics import avg_num_neighbors_statistics


def _geometry_dtype(dtype: torch.dtype) -> torch.dtype:
    return dtype if dtype in (torch.float32, torch.float64) else torch.float32


@register_encoder("MACE")
class MACEEncoder(Encoder[MACEConfig]):
    """MACE stack of ``num_conv_layers`` interaction + product layers (equivariant)."""

    Config = MACEConfig
    config: MACEConfig
    equivariant = True
    needs_pos = True
    row_of: torch.Tensor
    species_ids: torch.Tensor

    @classmethod
    def data_statistics(cls, config: MACEConfig, trainset: Sequence[Any]) -> dict[str, Any]:
        """``avg_num_neighbors``: the mean in-degree of the training graphs (edges per atom), when
        the config leaves it unset and the samples carry their edges (else ``{}``: the default)."""
        return avg_num_neighbors_statistics(config.avg_num_neighbors is None, trainset)

    def __init__(self, dims: EncoderDims, config: MACEConfig) -> None:
        super().__init__(dims, config)
        avg_num_neighbors = config.avg_num_neighbors or MACE_DEFAULT_AVG_NUM_NEIGHBORS
        hidden = dims.hidden_dim
        num_attrs = dims.num_species if dims.num_species > 0 else 1
        if dims.num_species > 0:
            self.species = nn.Embedding(dims.num_species, hidden)
            self.node_lin = None
        else:
            self.species = None
            self.node_lin = nn.Linear(dims.node_in, hidden)
        # row of each atomic number in the per-species tables: itself, or its place in `elements`
        # (-1, no row, for an element not listed)
        row_of = torch.arange(max(dims.num_species, 1))
        if config.elements is not None:
            if dims.num_species <= 0:
                raise ModelConfigError(f"{ROOT}.elements: needs species inputs (num_species > 0)")
            if max(config.elements) >= dims.num_species:
                raise ModelConfigError(
                    f"{ROOT}.elements: atomic number {max(config.elements)} is not below num_species={dims.num_species}"
                )
            num_attrs = len(config.elements)
            row_of = torch.full((dims.num_species,), -1, dtype=torch.long)
            row_of[list(config.elements)] = torch.arange(num_attrs)
        if self.species is not None and config.scales == "mace-torch":
            # mace-torch's embedding: the one-hot times an e3nn linear, whose weights are N(0, 1)
            # divided by sqrt(fan-in)
            nn.init.normal_(self.species.weight, std=1.0 / math.sqrt(num_attrs))
        self.register_buffer("row_of", row_of, persistent=False)
        self.register_buffer("species_ids", torch.arange(num_attrs), persistent=False)

        sh_irreps = o3.Irreps.spherical_harmonics(config.max_ell)
        self.sh = o3.SphericalHarmonics(sh_irreps, normalize=False, normalization="component")
        self.radial_basis = BesselRBF(dims.radius, dims.num_radial)
        self.cutoff = PolynomialCutoff(dims.radius, p=config.envelope_exponent)
        # the constant input scales (MACEConfig.scales). "unit": BesselRBF, sqrt(2/rc) sin(n pi d/rc)
        # / d, becomes the dimensionless sin(n pi u) / u (u = d/rc), of order 1, and the one-hot
        # (variance 1/num_attrs) gets the unit variance e3nn's normalisation expects.
        # "mace-torch": both as they are, so the radial MLP's SiLUs start near their linear range
        # and the learned radial functions start as smooth combinations of the basis
        unit = config.scales == "unit"
        self.radial_scale = float(dims.radius) * math.sqrt(float(dims.radius) / 2.0) if unit else 1.0
        self.attrs_scale = math.sqrt(float(num_attrs)) if unit else 1.0

        self.hidden_irreps = natural_irreps(hidden, config.node_max_ell)
        target_irreps = natural_irreps(hidden, config.max_ell)
        attrs_irreps = irreps([(num_attrs, (0, 1))])
        self.interactions = nn.ModuleList()
        self.products = nn.ModuleList()
        self.skips = nn.ModuleList()
        first_in = irreps([(hidden, (0, 1))])  # the species embedding: scalars
        for layer in range(dims.num_conv_layers):
            irreps_in = first_in if layer == 0 else self.hidden_irreps
            self.interactions.append(
                Interaction(
                    irreps_in,
                    sh_irreps,
                    target_irreps,
                    dims.num_radial,
                    config.radial_mlp_dim,
                    config.radial_mlp_layers,
                    avg_num_neighbors,
                )
            )
            self.products.append(ProductBasis(target_irreps, self.hidden_irreps, config.correlation, num_attrs))
            if layer > 0:  # element-dependent residual, from the second layer on (MACE)
                self.skips.append(E3nnResidual(irreps_in, attrs_irreps, self.hidden_irreps))
        # and in the first layer (MACEConfig.residual_first_layer): its own module, so that the
        # state-dict keys of models without it are unchanged
        self.skip_first = (
            E3nnResidual(first_in, attrs_irreps, self.hidden_irreps) if config.residual_first_layer else None
        )

    def _layer(self, layer: int, h, edge_sh, edge_radial, edge_index, node_attrs):
        a = self.interactions[layer](h, edge_sh, edge_radial, edge_index)
        out = self.products[layer](a, node_attrs)
        if layer > 0:
            out = out + self.skips[layer - 1](h, node_attrs * self.attrs_scale)
        elif self.skip_first is not None:
            out = out + self.skip_first(h, node_attrs * self.attrs_scale)
        return out

    def forward(self, inputs: GraphInputs) -> NodeEmbedding:
        """``inputs.edge_vec [E, 3]`` -> ``scalar [N, hidden_dim]``, ``vector [N, 3, hidden_dim]``."""
        if inputs.edge_vec is None:
            raise ModelError("MACE needs positions: GraphInputs.edge_vec is None")
        x = inputs.x
        embed = self.species if self.species is not None else self.node_lin
        assert embed is not None  # __init__ builds one of the two
        dtype = embed.weight.dtype  # the module dtype
        num_nodes = inputs.num_nodes
        hidden = self.dims.hidden_dim

        vec = inputs.edge_vec.to(_geometry_dtype(inputs.edge_vec.dtype))
        dist = safe_norm(vec)
        edge_sh = self.sh(safe_unit_vectors(vec, dist)).to(dtype)
        edge_radial = (self.radial_basis(dist) * (self.cutoff(dist) * self.radial_scale).unsqueeze(-1)).to(dtype)

        if self.species is not None:
            z = x[:, 0].long()
            node_attrs = (self.row_of[z].unsqueeze(-1) == self.species_ids).to(dtype)  # one-hot, no host sync
            h = self.species(z)
        else:
            node_attrs = torch.ones(num_nodes, 1, dtype=dtype, device=x.device)
            h = embed(x.to(dtype))  # node_lin

        for layer in range(len(self.interactions)):
            h_in = h
            if self.dims.conv_checkpointing:
                h = checkpoint(
                    self._layer, layer, h, edge_sh, edge_radial, inputs.edge_index, node_attrs, use_reentrant=False
                )
            else:
                h = self._layer(layer, h, edge_sh, edge_radial, inputs.edge_index, node_attrs)
            # the first `hidden` channels are the 0e scalars; mix() also records them for the
            # per-layer energy readout, so it runs with or without mixers
            scalar = self.mix(layer, h_in[:, :hidden], h[:, :hidden], inputs)
            if self.mixers is not None:
                h = torch.cat([scalar, h[:, hidden:]], dim=-1)

        scalar = h[:, :hidden]
        if self.config.node_max_ell == 0:
            return NodeEmbedding(scalar=scalar)
        vector = h[:, hidden : 4 * hidden].reshape(num_nodes, hidden, 3).transpose(1, 2)
        return NodeEmbedding(scalar=scalar, vector=vector)

    @property
    def vector_channels(self) -> int:
        """``hidden_dim``, or 0 with ``node_max_ell = 0`` (scalar node features: no vectors)."""
        return 0 if self.config.node_max_ell == 0 else self.dims.hidden_dim

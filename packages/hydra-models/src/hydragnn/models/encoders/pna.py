"""PNA: principal neighbourhood aggregation (PyG's :class:`~torch_geometric.nn.conv.PNAConv`).

PNAConv layers with the radial basis of the distances (times the cutoff envelope, plus the
schema's edge inputs) as edge features, whose messages ``m_ij = pre_nn([x_i, x_j, W_e e_ij])``
are weighted by the cutoff envelope ``env(r_ij)`` and aggregated with envelope weights (the
aggregation of :class:`~hydragnn.models.nn.pna.GatedPNAConv`, without PNAPlus's learned
radial gate ``W_g e_ij``). The degree scalers use the envelope-weighted degree ``sum_j env_ij``
and are normalised by a degree histogram given at construction (``pna_deg``; hydra-train's
pipeline fills it from the training split's in-degrees when the config leaves it unset, see
``hydragnn.train.pipeline.fill_data_statistics``; a default typical of atomistic neighbour
counts otherwise), never computed in forward. Messages are aggregated in float32 when the model runs in bfloat16.

Why the envelope: with PyG's unweighted aggregators a neighbour's message does not vanish at the
cutoff (the mean and the degree scalers count it fully until it leaves), so the energy jumps when
a neighbour crosses the radius, and a model fitted to forces learns a rough energy surface
(measurements in docs/notes/encoder_design.md).

Aggregators (``sum``, ``mean``, ``min``, ``max``, ``var``, ``std``, ``softmax``, ``softmin``)
and scalers are the envelope-weighted ones described in :mod:`.pnaplus` (``mean`` divides by the
smooth degree ``sqrt(1 + d_i^2)``, ``std`` is ``sqrt(var + 1e-4) - 1e-2``, ``softmax`` /
``softmin`` are smooth maxima / minima over the messages and 0). The defaults replace HydraGNN's
hard ``min`` / ``max`` by ``softmin`` / ``softmax``: a hard maximum is not differentiable where
messages tie, which they do in every symmetric structure, so forces would be ill-defined there.
:func:`~hydragnn.models.nn.pna.pyg_aggregators` maps the names to PyG aggregation modules for
:class:`PNAConv`'s constructor (which also derives the degree-scaler averages from ``pna_deg``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from ..encoder_configs.base import check_at_least
from ..encoder_configs.invariant import (  # the keys live torch-free
    DEFAULT_PNA_DEG,
    PNA_AGGREGATORS,
    PNA_SCALERS,
    WHERE,
    PNAConfig,
    check_choice,
)
from ..errors import ModelConfigError
from ..nn.pna import GatedPNAConv, pyg_aggregators
from .base import EncoderDims, register_encoder
from .graph_statistics import degree_histogram
from .invariant_utils import InvariantEncoder


def degree_statistics(config: PNAConfig, trainset: Sequence[Any]) -> dict[str, Any]:
    """The ``data_statistics`` of the PNA family: ``{"pna_deg": histogram}`` of the training set
    when ``config.pna_deg`` is unset (the degree scalers are normalised by it), else ``{}``."""
    return {} if config.pna_deg is not None else {"pna_deg": degree_histogram(trainset)}


def pna_kwargs(dims: EncoderDims, config: PNAConfig) -> dict:
    """Validated keyword arguments of :class:`PNAConv` (width ``hidden_dim``) from ``config``."""
    if not config.aggregators:
        raise ModelConfigError(f"{WHERE}.aggregators: expected at least one of {list(PNA_AGGREGATORS)}")
    if not config.scalers:
        raise ModelConfigError(f"{WHERE}.scalers: expected at least one of {list(PNA_SCALERS)}")
    for name in config.aggregators:
        check_choice("aggregators", name, PNA_AGGREGATORS)
    for name in config.scalers:
        check_choice("scalers", name, PNA_SCALERS)
    deg = DEFAULT_PNA_DEG if config.pna_deg is None else tuple(config.pna_deg)
    if any(int(c) < 0 for c in deg) or sum(deg[1:]) <= 0:
        raise ModelConfigError(
            f"{WHERE}.pna_deg: expected a histogram of non-negative counts with some node of degree >= 1, found {list(deg)}"
        )
    check_at_least("towers", config.towers)
    check_at_least("pre_layers", config.pre_layers)
    check_at_least("post_layers", config.post_layers)
    if dims.hidden_dim % config.towers:
        raise ModelConfigError(
            f"{WHERE}.towers: hidden_dim ({dims.hidden_dim}) must be divisible by towers ({config.towers})"
        )
    return dict(
        in_channels=dims.hidden_dim,
        out_channels=dims.hidden_dim,
        aggregators=pyg_aggregators(config.aggregators),
        scalers=list(config.scalers),
        deg=torch.tensor(deg, dtype=torch.long),
        towers=config.towers,
        pre_layers=config.pre_layers,
        post_layers=config.post_layers,
        divide_input=False,
        act=config.activation,
    )


@register_encoder("PNA")
class PNAEncoder(InvariantEncoder[PNAConfig]):
    """Stack of envelope-weighted PNA convolutions (see the module docstring)."""

    Config = PNAConfig

    @classmethod
    def data_statistics(cls, config: PNAConfig, trainset: Sequence[Any]) -> dict[str, Any]:
        """``pna_deg`` from the training set's in-degrees (see :func:`degree_statistics`)."""
        return degree_statistics(config, trainset)

    def make_conv(self, dims: EncoderDims, config: PNAConfig, edge_dim: int) -> nn.Module:
        """A :class:`~hydragnn.models.nn.pna.GatedPNAConv` whose gate is the envelope alone: ``conv(h, edge_index, edge_feat, env)``."""
        # messages weighted by env(r_ij) only (PNAPlus learns W_g e_ij on top)
        conv = GatedPNAConv(edge_dim, config.aggregators, learned_gate=False, **pna_kwargs(dims, config))
        return conv

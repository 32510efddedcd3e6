"""PNA: principal neighbourhood aggregation (PyG's :class:`~torch_geometric.nn.conv.PNAConv`).

PNAConv layers with the radial basis of the distances (times the cutoff envelope, plus the
schema's edge inputs) as edge features, whose messages ``m_ij = pre_nn([x_i, x_j, W_e e_ij])``
are weighted by the cutoff envelope ``env(r_ij)`` and aggregated with envelope weights (the
aggregation of :class:`.pnaplus.GatedPNAConv`, without PNAPlus's learned radial gate
``W_g e_ij``). The degree scalers use the envelope-weighted degree ``sum_j env_ij`` and are
normalised by a degree histogram given at construction (``pna_deg``; hydra-train's pipeline
fills it from the training split's in-degrees when the config leaves it unset, see
``hydragnn.train.pipeline.fill_data_statistics``; a default typical of atomistic neighbour
counts otherwise), never computed in forward. Messages are aggregated in float32 when the model runs in bfloat16.

Why the envelope: with PyG's unweighted aggregators a neighbour's message does not vanish at the
cutoff (the mean and the degree scalers count it fully until it leaves), so the energy jumps when
a neighbour crosses the radius, and a model fitted to forces learns a rough energy surface
(measurements in docs/notes/encoder_design.md).

Aggregators (``sum``, ``mean``, ``min``, ``max``, ``var``, ``std``, ``softmax``, ``softmin``)
and scalers are the envelope-weighted ones defined in :mod:`.pnaplus` (``mean`` divides by the
smooth degree ``sqrt(1 + d_i^2)``, ``std`` is ``sqrt(var + 1e-4) - 1e-2``, ``softmax`` /
``softmin`` are smooth maxima / minima over the messages and 0). The defaults replace HydraGNN's
hard ``min`` / ``max`` by ``softmin`` / ``softmax``: a hard maximum is not differentiable where
messages tie, which they do in every symmetric structure, so forces would be ill-defined there.
:func:`pyg_aggregators` maps the names to PyG aggregation modules for :class:`PNAConv`'s
constructor (which also derives the degree-scaler averages from ``pna_deg``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn
from torch_geometric.nn.aggr import Aggregation, SoftmaxAggregation

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
from .base import EncoderDims, register_encoder
from .invariant_utils import InvariantEncoder

STD_EPS = 1e-2
"""``std = sqrt(var + STD_EPS**2) - STD_EPS``: smooth, 0 for equal messages."""


class SmoothStdAggregation(Aggregation):
    """``sqrt(var + eps^2) - eps`` per node, with the two-pass variance ``mean((x - mean)^2)``."""

    def forward(
        self,
        x: Tensor,
        index: Tensor | None = None,
        ptr: Tensor | None = None,
        dim_size: int | None = None,
        dim: int = -2,
    ) -> Tensor:
        self.assert_index_present(index)
        assert index is not None
        mean = self.reduce(x, index, ptr, dim_size, dim, reduce="mean")
        diff = x - mean.index_select(dim, index)
        var = self.reduce(diff * diff, index, ptr, dim_size, dim, reduce="mean")
        return torch.sqrt(var + STD_EPS * STD_EPS) - STD_EPS


def pyg_aggregators(names: tuple[str, ...] | list[str]) -> list[str | Aggregation]:
    """PyG aggregations for the configured names (strings PyG resolves, or modules)."""
    special = {
        "std": SmoothStdAggregation,
        "softmax": lambda: SoftmaxAggregation(t=1.0),
        "softmin": lambda: SoftmaxAggregation(t=-1.0),
    }
    return [special[name]() if name in special else name for name in names]


def degree_histogram(samples: Sequence[Any]) -> list[int]:
    """In-degree histogram of prepared samples: ``hist[k]`` = number of nodes with ``k`` incoming edges."""
    hist = torch.zeros(1, dtype=torch.long)
    for i, data in enumerate(samples):
        edge_index = getattr(data, "edge_index", None)
        if edge_index is None:
            raise ValueError(f"degree_histogram: sample {i} has no edge_index (prepare it with edges first)")
        deg = torch.bincount(edge_index[1], minlength=int(data.num_nodes))
        counts = torch.bincount(deg)
        if counts.numel() > hist.numel():
            hist = torch.cat([hist, hist.new_zeros(counts.numel() - hist.numel())])
        hist[: counts.numel()] += counts
    return hist.tolist()


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
class PNAEncoder(InvariantEncoder):
    """Stack of envelope-weighted PNA convolutions (see the module docstring)."""

    Config = PNAConfig

    @classmethod
    def data_statistics(cls, config: PNAConfig, trainset: Sequence[Any]) -> dict[str, Any]:
        """``pna_deg`` from the training set's in-degrees (see :func:`degree_statistics`)."""
        return degree_statistics(config, trainset)

    def make_conv(self, dims: EncoderDims, config: PNAConfig, edge_dim: int) -> nn.Module:
        """A :class:`.pnaplus.GatedPNAConv` whose gate is the envelope alone: ``conv(h, edge_index, edge_feat, env)``."""
        from .pnaplus import GatedPNAConv  # pnaplus imports this module's config helpers

        # messages weighted by env(r_ij) only (PNAPlus learns W_g e_ij on top)
        conv = GatedPNAConv(edge_dim, config.aggregators, learned_gate=False, **pna_kwargs(dims, config))
        return conv

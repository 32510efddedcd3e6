"""PNAPlus: HydraGNN's PNA+ (PNA with radial-basis edge features and radially gated messages).

Each message of PyG's :class:`~torch_geometric.nn.conv.PNAConv`,
``m_ij = pre_nn([x_i, x_j, W_e e_ij])``, is multiplied by the continuous filter
``g_ij = env(r_ij) * W_g e_ij`` (``e_ij`` = radial basis of the distance times the envelope,
plus the schema's edge inputs), with the keys and aggregator names of :mod:`.pna`. HydraGNN's
PNA+ used a Bessel basis with the polynomial envelope (``radial_basis="bessel"``,
``cutoff_function="polynomial"``); the default here is the Gaussian basis with the cosine
cutoff, whose forces lose less precision in bfloat16.

Unlike plain PNA, the aggregation weighs neighbours by their envelope, so the output is
continuous when a neighbour crosses the cutoff. With the envelope-weighted degree
``d_i = sum_j env_ij`` and ``D_i = sqrt(1 + d_i^2)`` (a smooth ``max(d_i, 1)``):

* ``sum``: ``sum_j m_ij``; ``mean``: ``mu_i = sum_j m_ij / D_i``;
* ``var``: ``sum_j env_ij (m_ij - mu_i)^2 / D_i``; ``std``: ``sqrt(var + 1e-4) - 1e-2``;
* ``softmax`` / ``softmin``: ``sum_j env_ij e^{t m_ij} m_ij / (1 + sum_j env_ij e^{t m_ij})``
  with ``t = +1 / -1``, a smooth maximum / minimum over ``{m_ij} U {0}``;
* ``max`` / ``min``: hard, over ``{m_ij} U {0}`` (not differentiable where messages tie);
* scalers use ``d_i`` (amplification ``log(d+1)``, linear ``d``) and ``D_i`` (attenuation
  ``1 / log(D+1)``, inverse_linear ``1 / D``), normalised by the ``pna_deg`` histogram.

Aggregation runs in float32 when the model runs in bfloat16.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torch import nn

from ..encoder_configs.invariant import PNAPlusConfig
from ..nn.pna import GatedPNAConv
from .base import EncoderDims, register_encoder
from .invariant_utils import InvariantEncoder
from .pna import degree_statistics, pna_kwargs


@register_encoder("PNAPlus")
class PNAPlusEncoder(InvariantEncoder[PNAPlusConfig]):
    """Stack of :class:`~hydragnn.models.nn.pna.GatedPNAConv` (see the module docstring)."""

    Config = PNAPlusConfig

    @classmethod
    def data_statistics(cls, config: PNAPlusConfig, trainset: Sequence[Any]) -> dict[str, Any]:
        """``pna_deg`` from the training set's in-degrees (see :func:`.pna.degree_statistics`)."""
        return degree_statistics(config, trainset)

    def make_conv(self, dims: EncoderDims, config: PNAPlusConfig, edge_dim: int) -> nn.Module:
        return GatedPNAConv(edge_dim, config.aggregators, **pna_kwargs(dims, config))

"""MFC: molecular-fingerprint convolutions with degree-specific weights, made smooth and capture-safe.

``x_i' = sum_k w_k(d_i) (W^l_k h_i + W^r_k x_i)`` with ``h_i = sum_j g_ij * x_j`` (gate
``g_ij = env(r_ij) * W e_ij``) and weights ``w_k`` a C1 partition of unity over the
envelope-weighted degree ``d_i = sum_j env(r_ij)`` clamped to ``max_degree``. For an integer
degree this is PyG's :class:`~torch_geometric.nn.conv.MFConv` (whose ``lins_l``/``lins_r`` it
reuses); unlike it, there is no ``nonzero()`` (data-dependent shape) and the output changes
smoothly when a neighbour crosses the cutoff.
"""

from __future__ import annotations

from torch import nn

from ..encoder_configs.base import check_at_least
from ..encoder_configs.invariant import MFCConfig
from ..nn.mfc import SmoothMFConv
from .base import EncoderDims, register_encoder
from .invariant_utils import InvariantEncoder


@register_encoder("MFC")
class MFCEncoder(InvariantEncoder[MFCConfig]):
    """Stack of :class:`SmoothMFConv` (see the module docstring)."""

    Config = MFCConfig

    def make_conv(self, dims: EncoderDims, config: MFCConfig, edge_dim: int) -> nn.Module:
        check_at_least("max_degree", config.max_degree)
        return SmoothMFConv(dims.hidden_dim, edge_dim, config.max_degree)

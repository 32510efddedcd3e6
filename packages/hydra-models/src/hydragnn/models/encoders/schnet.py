"""SchNet (Schütt et al., 2017): continuous-filter convolutions on interatomic distances.

Each interaction block computes ``h_i += lin(ssp(lin2(sum_j lin1(h_j) * W(r_ij))))`` with the
filter ``W(r) = MLP(gaussians(r)) * cosine_cutoff(r)``. Written here (not PyG's
``InteractionBlock``) because PyG's ``CFConv`` does not zero edges beyond the cutoff and
accumulates in the input dtype; this version takes the precomputed edges of
:class:`GraphInputs`, is capture-safe and sums bfloat16 messages in float32.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from ..encoder_configs.geometric import SchNetConfig
from ..nn import ContinuousFilterConv, CosineCutoff, GaussianRBF, RadialEdges, RadialFilter
from ..nn.activations import ShiftedSoftplus
from .base import Encoder, EncoderDims, GraphInputs, NodeEmbedding, register_encoder


class Interaction(nn.Module):
    """One SchNet interaction block: ``[N, H] -> [N, H]`` (the residual is added by the caller).

    ``lin(act(lin2(conv(lin1(h), filter(edges), edges))))`` with the primitives
    :class:`~hydragnn.models.nn.RadialFilter` and :class:`~hydragnn.models.nn.ContinuousFilterConv`.
    """

    def __init__(self, hidden_dim: int, num_radial: int, num_filters: int) -> None:
        super().__init__()
        self.filter = RadialFilter(num_radial, num_filters)
        self.conv = ContinuousFilterConv()
        self.lin1 = nn.Linear(hidden_dim, num_filters, bias=False)
        self.lin2 = nn.Linear(num_filters, hidden_dim)
        self.act = ShiftedSoftplus()
        self.lin = nn.Linear(hidden_dim, hidden_dim)

    def forward(self, h: torch.Tensor, edges: RadialEdges) -> torch.Tensor:
        """Args: h ``[N, H]``, edges with a Gaussian basis and a cosine envelope."""
        agg = self.conv(self.lin1(h), self.filter(edges), edges)
        return self.lin(self.act(self.lin2(agg)))


@register_encoder("SchNet")
class SchNet(Encoder):
    """SchNet encoder: invariant node features ``[N, hidden_dim]``.

    Species: an ``nn.Embedding`` of ``int(x[:, 0])`` when ``dims.num_species > 0``, else a
    linear layer on ``x``. Radial basis: ``num_gaussians`` (or ``dims.num_radial``) Gaussians on
    ``[0, radius]``.
    """

    Config = SchNetConfig

    equivariant = False
    needs_pos = True

    def __init__(self, dims: EncoderDims, config: SchNetConfig) -> None:
        super().__init__(dims, config)
        H = dims.hidden_dim
        num_filters = config.num_filters or H
        num_radial = config.num_gaussians or dims.num_radial
        if dims.num_species > 0:
            self.embed: nn.Module = nn.Embedding(dims.num_species, H)
        else:
            self.embed = nn.Linear(dims.node_in, H)
        self.rbf = GaussianRBF(dims.radius, num_radial)
        self.envelope = CosineCutoff(dims.radius)
        self.interactions = nn.ModuleList(Interaction(H, num_radial, num_filters) for _ in range(dims.num_conv_layers))

    def forward(self, inputs: GraphInputs) -> NodeEmbedding:
        """Args: inputs with ``edge_len [E]``. Returns: ``NodeEmbedding(scalar=[N, H])``."""
        if isinstance(self.embed, nn.Embedding):
            h = self.embed(inputs.x[:, 0].long())
        else:
            h = self.embed(inputs.x)
        src, dst = inputs.edge_index[0], inputs.edge_index[1]
        assert inputs.edge_len is not None  # needs_pos: built only for data with positions
        edges = RadialEdges(src, dst, inputs.edge_len, h.shape[0], h.dtype, self.rbf, self.envelope)
        checkpointing = self.dims.conv_checkpointing and torch.is_grad_enabled()
        if checkpointing:
            edges.materialize()
        for i, block in enumerate(self.interactions):
            h_in = h
            if checkpointing:
                h = h + checkpoint(block, h, edges, use_reentrant=False)
            else:
                h = h + block(h, edges)
            h = self.mix(i, h_in, h, inputs)
        return NodeEmbedding(scalar=h)

"""Output heads: graph-level (pool + shared MLP + one MLP per output), node-level (``mlp`` or
``conv``) and edge-level (MLP on ``[h_src, h_dst, edge features]``).

Every head reads the encoder's invariant node features ``NodeEmbedding.scalar [N, H]`` and the
:class:`~hydragnn.models.encoders.GraphInputs`; none of them normalises by the current batch's
statistics (the graph heads' input standardisation uses running statistics only), so padding by
a sink graph leaves the real outputs unchanged.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from .encoders import GraphInputs
from .heads_config import EdgeHeadConfig, GraphHeadConfig, NodeHeadConfig
from .nn.activations import make_activation, mlp
from .nn.radial import CosineCutoff
from .nn.scatter import POOLINGS, scatter_sum
from .nn.standardise import RunningStandardise

GRAPH_HEAD_INPUT = "@graph_head_input"
"""Output key, in training mode only, of the rows the graph heads standardised ``[B, F]``: the model
pops it after its forward and updates the statistics with it (:meth:`GraphHeads.update_statistics`)."""


class GraphHeads(nn.Module):
    """Pool node features per graph, standardise them, apply shared layers, then one MLP per graph output.

    Args:
        hidden_dim: width H of the node embedding.
        graph_in: width G of ``graph_attr`` (concatenated to the pooled features; 0 for none).
        outputs: ``(name, dim)`` of every graph output.
        config: layer widths and the input standardisation (``config.input_norm``).
        pooling: ``add``/``sum``, ``mean`` or ``max`` (accumulated in float32 for bf16).
        activation: activation name.
        fuse_graph_attr: conditioning mode ``fuse_pool``: instead of concatenating ``graph_attr``
            to the pooled features, fuse them, ``pooled + MLP([pooled, graph_attr])`` (width H).
    """

    def __init__(
        self,
        hidden_dim: int,
        graph_in: int,
        outputs: Sequence[tuple[str, int]],
        config: GraphHeadConfig,
        pooling: str,
        activation: str,
        fuse_graph_attr: bool = False,
    ) -> None:
        super().__init__()
        self.names = [name for name, _ in outputs]
        self.pool = POOLINGS[pooling]
        self.fuse = (
            mlp(hidden_dim + graph_in, (hidden_dim,), hidden_dim, activation) if fuse_graph_attr and graph_in else None
        )
        layers: list[nn.Module] = []
        width = hidden_dim if self.fuse is not None else hidden_dim + graph_in
        self.input_norm = RunningStandardise(width) if config.input_norm == "running" else None
        for d in config.shared_dims:
            layers += [nn.Linear(width, d), make_activation(activation)]
            width = d
        self.shared = nn.Sequential(*layers)
        self.heads = nn.ModuleDict({name: mlp(width, config.head_dims, dim, activation) for name, dim in outputs})

    def forward(self, h: torch.Tensor, inputs: GraphInputs) -> dict[str, torch.Tensor]:
        """``h [N, H]`` -> ``{name: [B, dim]}`` (+ :data:`GRAPH_HEAD_INPUT` in training mode)."""
        pooled = self.pool(h, inputs.batch, inputs.num_graphs)
        if inputs.graph_attr is not None:
            joined = torch.cat([pooled, inputs.graph_attr.to(pooled.dtype)], dim=-1)
            pooled = pooled + self.fuse(joined) if self.fuse is not None else joined
        rows = pooled
        if self.input_norm is not None:
            pooled = self.input_norm(pooled)
        shared = self.shared(pooled)
        out = {name: self.heads[name](shared) for name in self.names}
        if self.input_norm is not None and self.training:
            out[GRAPH_HEAD_INPUT] = rows.detach()
        return out

    def update_statistics(self, rows: torch.Tensor) -> None:
        """Update the input standardisation from the training rows a forward returned under
        :data:`GRAPH_HEAD_INPUT` (the model calls it once its forward, derivatives included, is done)."""
        if self.input_norm is not None:
            self.input_norm.update(rows)


class NodeConvLayer(nn.Module):
    """``h_i' = act(W_s h_i + sum_j c(r_ij) W_m h_j)``; ``c`` is a smooth cutoff (1 without geometry)."""

    def __init__(self, in_dim: int, out_dim: int, activation: str, cutoff: float | None) -> None:
        super().__init__()
        self.lin_self = nn.Linear(in_dim, out_dim)
        self.lin_msg = nn.Linear(in_dim, out_dim, bias=False)
        self.act = make_activation(activation)
        self.cutoff = CosineCutoff(cutoff) if cutoff is not None else None

    def forward(self, h: torch.Tensor, inputs: GraphInputs) -> torch.Tensor:
        src, dst = inputs.edge_index[0], inputs.edge_index[1]
        msg = self.lin_msg(h).index_select(0, src)
        if self.cutoff is not None and inputs.edge_len is not None:
            msg = msg * self.cutoff(inputs.edge_len).unsqueeze(-1).to(msg.dtype)
        return self.act(self.lin_self(h) + scatter_sum(msg, dst, inputs.num_nodes))


class NodeHead(nn.Module):
    """One node-level output: ``[N, H] -> [N, dim]``.

    ``mlp``: a per-node MLP. ``conv``: ``len(head_dims)`` :class:`NodeConvLayer` over the same
    edges as the encoder, then a linear layer.
    """

    def __init__(
        self, hidden_dim: int, dim: int, config: NodeHeadConfig, activation: str, cutoff: float | None
    ) -> None:
        super().__init__()
        self.type: str = config.type  # pyright: ignore[reportIncompatibleMethodOverride]  (the head layout, hiding nn.Module.type)
        if config.type == "mlp":
            self.net = mlp(hidden_dim, config.head_dims, dim, activation)
            self.convs = nn.ModuleList()
        else:
            widths = [hidden_dim, *config.head_dims]
            self.convs = nn.ModuleList(NodeConvLayer(a, b, activation, cutoff) for a, b in zip(widths[:-1], widths[1:]))
            self.net = nn.Linear(widths[-1], dim)

    def forward(self, h: torch.Tensor, inputs: GraphInputs) -> torch.Tensor:
        for conv in self.convs:
            h = conv(h, inputs)
        return self.net(h)


class NodeHeads(nn.Module):
    """One :class:`NodeHead` per node output: ``h [N, H]`` -> ``{name: [N, dim]}``."""

    def __init__(
        self,
        hidden_dim: int,
        outputs: Sequence[tuple[str, int]],
        config: NodeHeadConfig,
        activation: str,
        cutoff: float | None,
    ) -> None:
        super().__init__()
        self.heads = nn.ModuleDict(
            {name: NodeHead(hidden_dim, dim, config, activation, cutoff) for name, dim in outputs}
        )

    def forward(self, h: torch.Tensor, inputs: GraphInputs) -> dict[str, torch.Tensor]:
        return {name: head(h, inputs) for name, head in self.heads.items()}


class EdgeHeads(nn.Module):
    """One MLP per edge output on ``[h_src, h_dst, edge_attr?, edge_len?]``: ``-> {name: [E, dim]}``.

    Args:
        hidden_dim: width H of the node embedding.
        edge_in: width of ``edge_attr`` (0 for none).
        geometric: append the (invariant) edge length.
        outputs: ``(name, dim)`` of every edge output.
        config: layer widths.
        activation: activation name.
    """

    def __init__(
        self,
        hidden_dim: int,
        edge_in: int,
        geometric: bool,
        outputs: Sequence[tuple[str, int]],
        config: EdgeHeadConfig,
        activation: str,
    ) -> None:
        super().__init__()
        self.geometric = geometric
        width = 2 * hidden_dim + edge_in + int(geometric)
        self.heads = nn.ModuleDict({name: mlp(width, config.head_dims, dim, activation) for name, dim in outputs})

    def forward(self, h: torch.Tensor, inputs: GraphInputs) -> dict[str, torch.Tensor]:
        src, dst = inputs.edge_index[0], inputs.edge_index[1]
        feats = [h.index_select(0, src), h.index_select(0, dst)]
        if inputs.edge_attr is not None:
            feats.append(inputs.edge_attr.to(h.dtype))
        if self.geometric and inputs.edge_len is not None:
            feats.append(inputs.edge_len.unsqueeze(-1).to(h.dtype))
        z = torch.cat(feats, dim=-1)
        return {name: head(z) for name, head in self.heads.items()}

"""Graph-level conditioning of the node embedding (``use_graph_attr_conditioning``).

The schema's graph inputs ``graph_attr [B, G]`` (for example total charge and spin) are
broadcast to the nodes of each graph and change the invariant node features ``h [N, H]``
before the heads (and before the MLIP's per-atom energies):

* ``concat_node``: ``h_i + MLP([h_i, g_b(i)])`` (``graph_attr`` appended to every node
  embedding, projected back to ``hidden_dim``, residual);
* ``film``: ``h_i * (1 + gamma(g_b(i))) + beta(g_b(i))``, per-graph scale and shift of the
  channels; the last layers of ``gamma`` / ``beta`` start at zero, so an untrained model
  starts unconditioned and learns how much to use the graph inputs.

The third mode, ``fuse_pool``, lives in the graph heads
(:class:`hydragnn.models.heads.GraphHeads` with ``fuse_graph_attr``).

Only invariant channels are touched: vector features pass unchanged, so a model stays
rotation-equivariant as long as ``graph_attr`` is rotation-invariant (a charge, a spin, a
temperature; not a dipole or a field). Graph inputs enter unscaled: give them O(1) values.
Capture-safe: ``graph_attr[batch]`` is a gather with an integer index.
"""

from __future__ import annotations

import torch
from torch import nn

from .encoders import GraphInputs
from .errors import ModelConfigError, ModelError
from .nn.activations import mlp

ROOT = "NeuralNetwork.Architecture"
NODE_MODES: tuple[str, ...] = ("concat_node", "film")
"""Modes applied to the node embedding (``fuse_pool`` is applied in the graph heads)."""


class NodeConditioning(nn.Module):
    """Condition node scalars on the graph inputs of their graph.

    Args:
        mode: ``concat_node`` or ``film`` (``graph_attr_conditioning_mode``).
        hidden_dim: width H of the node scalars.
        graph_in: width G of ``graph_attr`` (> 0).
        activation: activation name of the MLPs.

    Raises:
        ModelConfigError: for another mode or ``graph_in <= 0``.
    """

    def __init__(self, mode: str, hidden_dim: int, graph_in: int, activation: str) -> None:
        super().__init__()
        if mode not in NODE_MODES:
            raise ModelConfigError(
                f"{ROOT}.graph_attr_conditioning_mode: node conditioning takes one of {list(NODE_MODES)}, "
                f"found {mode!r}"
            )
        if graph_in <= 0:
            raise ModelConfigError(
                f"{ROOT}.use_graph_attr_conditioning: conditioning needs graph inputs in the schema, found {graph_in}"
            )
        self.mode, self.hidden_dim, self.graph_in = mode, int(hidden_dim), int(graph_in)
        if mode == "concat_node":
            self.net = mlp(hidden_dim + graph_in, (hidden_dim,), hidden_dim, activation)
        else:
            self.net = mlp(graph_in, (hidden_dim,), 2 * hidden_dim, activation)
            last = self.net[-1]
            assert isinstance(last, nn.Linear)
            nn.init.zeros_(last.weight)
            nn.init.zeros_(last.bias)

    def forward(self, h: torch.Tensor, inputs: GraphInputs) -> torch.Tensor:
        """``h [N, H]`` and ``inputs.graph_attr [B, G]`` (``inputs.batch [N]``) -> conditioned ``[N, H]``."""
        if inputs.graph_attr is None:
            raise ModelError(
                f"graph-attribute conditioning ({self.mode}) needs GraphInputs.graph_attr [B, {self.graph_in}]; "
                "the batch has none (prepare the data with the schema's graph inputs)"
            )
        g = inputs.graph_attr.to(h.dtype).index_select(0, inputs.batch)  # [N, G]
        if self.mode == "concat_node":
            return h + self.net(torch.cat([h, g], dim=-1))
        gamma, beta = self.net(g).split(self.hidden_dim, dim=-1)
        return h * (1.0 + gamma) + beta

"""The ``output_heads`` section of ``Architecture``: graph, node and edge head layer widths.

The JSON keys of each head kind (``num_headlayers``, ``dim_headlayers``, ...) are the fields of a
small dataclass parsed by :mod:`hydragnn.data.config_parse`; :meth:`HeadsConfig.from_dict`
turns them into per-layer widths (an int width is repeated, a list gives one per layer).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hydragnn.data.config_parse import check_keys, check_range, parse_dataclass

from .errors import ModelConfigError

ROOT = "NeuralNetwork.Architecture"
NODE_HEAD_TYPES: tuple[str, ...] = ("mlp", "conv")
GRAPH_INPUT_NORMS: tuple[str, ...] = ("running", "none")
_COUNT = {"min": 0}
Widths = int | tuple[int, ...] | None


@dataclass(frozen=True)
class _GraphKeys:
    num_sharedlayers: int = field(default=1, metadata=_COUNT)
    dim_sharedlayers: Widths = None
    num_headlayers: int = field(default=2, metadata=_COUNT)
    dim_headlayers: Widths = None
    input_norm: str = field(default="running", metadata={"choices": GRAPH_INPUT_NORMS})


@dataclass(frozen=True)
class _NodeKeys:
    num_headlayers: int = field(default=2, metadata=_COUNT)
    dim_headlayers: Widths = None
    type: str = field(default="mlp", metadata={"choices": NODE_HEAD_TYPES})


@dataclass(frozen=True)
class _EdgeKeys:
    num_headlayers: int = field(default=2, metadata=_COUNT)
    dim_headlayers: Widths = None


def _layer_dims(num: int, dims: int | tuple[int, ...] | None, default: int, where: str) -> tuple[int, ...]:
    """``dim_*layers`` as an int (same width for every layer) or a list of ``num`` ints (> 0)."""
    if dims is None:
        return (default,) * num
    if isinstance(dims, tuple):
        if len(dims) != num:
            raise ModelConfigError(f"{where}: expected {num} widths (one per layer), found {len(dims)}")
        out = dims
    else:
        out = (dims,) * num
    for i, d in enumerate(out):
        check_range(d, {"gt": 0}, f"{where}[{i}]", ModelConfigError)
    return out


@dataclass(frozen=True)
class GraphHeadConfig:
    """Graph heads: pooled embedding -> (standardised) -> shared MLP layers -> one MLP per graph output.

    ``input_norm`` ``"running"`` standardises each feature of the pooled embedding by running
    statistics of the training batches (:class:`~hydragnn.models.nn.standardise.RunningStandardise`).
    Without it, the offset that all graphs' pooled features share can fix the sign of every
    pre-activation of a narrow ReLU shared layer, and the heads then predict the training mean
    (docs/notes/upstream_configs_dead_heads.md). ``"none"`` is how artifacts written before
    format version 3 read.
    """

    shared_dims: tuple[int, ...]
    head_dims: tuple[int, ...]
    input_norm: str = "running"


@dataclass(frozen=True)
class NodeHeadConfig:
    """Node heads: ``type`` ``mlp`` (per-node MLP) or ``conv`` (message passing over the edges)."""

    head_dims: tuple[int, ...]
    type: str = "mlp"


@dataclass(frozen=True)
class EdgeHeadConfig:
    """Edge heads: MLP on ``[h_src, h_dst, edge features]``."""

    head_dims: tuple[int, ...]


@dataclass(frozen=True)
class HeadsConfig:
    """The ``output_heads`` section."""

    graph: GraphHeadConfig
    node: NodeHeadConfig
    edge: EdgeHeadConfig

    @classmethod
    def from_dict(cls, values: Any, hidden_dim: int, where: str = f"{ROOT}.output_heads") -> HeadsConfig:
        """Parse ``output_heads``; widths default to ``hidden_dim``, layer counts to 1 shared / 2 head."""
        sections = check_keys(values, where, {"graph", "node", "edge"}, ModelConfigError)
        w = f"{where}.graph"
        g = parse_dataclass(_GraphKeys, sections.get("graph"), w, ModelConfigError)
        graph = GraphHeadConfig(
            shared_dims=_layer_dims(g.num_sharedlayers, g.dim_sharedlayers, hidden_dim, f"{w}.dim_sharedlayers"),
            head_dims=_layer_dims(g.num_headlayers, g.dim_headlayers, hidden_dim, f"{w}.dim_headlayers"),
            input_norm=g.input_norm,
        )
        w = f"{where}.node"
        n = parse_dataclass(_NodeKeys, sections.get("node"), w, ModelConfigError)
        node = NodeHeadConfig(
            head_dims=_layer_dims(n.num_headlayers, n.dim_headlayers, hidden_dim, f"{w}.dim_headlayers"), type=n.type
        )
        w = f"{where}.edge"
        e = parse_dataclass(_EdgeKeys, sections.get("edge"), w, ModelConfigError)
        edge = EdgeHeadConfig(
            head_dims=_layer_dims(e.num_headlayers, e.dim_headlayers, hidden_dim, f"{w}.dim_headlayers")
        )
        return cls(graph=graph, node=node, edge=edge)

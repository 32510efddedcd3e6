"""The ``output_heads`` section of ``Architecture``: graph, node and edge head layer widths."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .config_values import check_choice, check_positive, check_section, check_typed
from .errors import ModelConfigError

ROOT = "NeuralNetwork.Architecture"
NODE_HEAD_TYPES: tuple[str, ...] = ("mlp", "conv")


def _layer_dims(num: int, dims: Any, default: int, where: str) -> tuple[int, ...]:
    """``dim_*layers`` as an int (same width for every layer) or a list of ``num`` ints."""
    if dims is None:
        return (default,) * num
    if isinstance(dims, list):
        out = tuple(check_typed(d, "int", f"{where}[{i}]") for i, d in enumerate(dims))
        if len(out) != num:
            raise ModelConfigError(f"{where}: expected {num} widths (one per layer), found {len(out)}")
    else:
        out = (check_typed(dims, "int", where),) * num
    for i, d in enumerate(out):
        check_positive(d, f"{where}[{i}]")
    return out


@dataclass(frozen=True)
class GraphHeadConfig:
    """Graph heads: pooled embedding -> shared MLP layers -> one MLP per graph output."""

    shared_dims: tuple[int, ...]
    head_dims: tuple[int, ...]


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
        sections = check_section(values if values is not None else {}, where, {"graph", "node", "edge"})

        def counts(sec: dict[str, Any], w: str, key: str, default: int) -> int:
            n = check_typed(sec.get(key, default), "int", f"{w}.{key}")
            check_positive(n, f"{w}.{key}", allow_zero=True)
            return n

        w = f"{where}.graph"
        g = check_section(
            sections.get("graph") or {}, w, {"num_sharedlayers", "dim_sharedlayers", "num_headlayers", "dim_headlayers"}
        )
        graph = GraphHeadConfig(
            shared_dims=_layer_dims(
                counts(g, w, "num_sharedlayers", 1), g.get("dim_sharedlayers"), hidden_dim, f"{w}.dim_sharedlayers"
            ),
            head_dims=_layer_dims(
                counts(g, w, "num_headlayers", 2), g.get("dim_headlayers"), hidden_dim, f"{w}.dim_headlayers"
            ),
        )
        w = f"{where}.node"
        n = check_section(sections.get("node") or {}, w, {"num_headlayers", "dim_headlayers", "type"})
        node = NodeHeadConfig(
            head_dims=_layer_dims(
                counts(n, w, "num_headlayers", 2), n.get("dim_headlayers"), hidden_dim, f"{w}.dim_headlayers"
            ),
            type=check_choice(check_typed(n.get("type", "mlp"), "str", f"{w}.type"), NODE_HEAD_TYPES, f"{w}.type"),
        )
        w = f"{where}.edge"
        e = check_section(sections.get("edge") or {}, w, {"num_headlayers", "dim_headlayers"})
        edge = EdgeHeadConfig(
            head_dims=_layer_dims(
                counts(e, w, "num_headlayers", 2), e.get("dim_headlayers"), hidden_dim, f"{w}.dim_headlayers"
            ),
        )
        return cls(graph=graph, node=node, edge=edge)

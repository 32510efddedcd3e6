"""PNA's envelope-weighted convolution and aggregations on PyG's :class:`~torch_geometric.nn.conv.PNAConv`.

:class:`GatedPNAConv` is the convolution of the PNA and PNAPlus encoders
(:mod:`hydragnn.models.encoders.pna`, :mod:`hydragnn.models.encoders.pnaplus`, where the
aggregators and scalers are described): messages ``pre_nn([x_i, x_j, W_e e_ij])`` gated by
``env(r_ij) * W_g e_ij`` (or by the envelope alone), aggregated with envelope weights in float32
when the model runs in bfloat16. :func:`pyg_aggregators` maps the aggregator names to PyG
aggregation modules for :class:`PNAConv`'s constructor (``std`` as :class:`SmoothStdAggregation`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

import hydragnn.data.pyg_import  # noqa: F401 (PyG as HydraGNN needs it)

import torch
from torch import Tensor, nn
from torch_geometric.nn.aggr import Aggregation, SoftmaxAggregation
from torch_geometric.nn.conv import PNAConv

from .scatter import accumulate_dtype, scatter_sum, smooth_count

if TYPE_CHECKING:
    from torch_geometric.nn.aggr import DegreeScalerAggregation

STD_EPS = 1e-2
"""``std = sqrt(var + STD_EPS**2) - STD_EPS``: smooth, 0 for equal messages."""


class SmoothStdAggregation(Aggregation):
    """``sqrt(var + eps^2) - eps`` per node, with the two-pass variance ``mean((x - mean)^2)``."""

    def forward(  # pyright: ignore[reportIncompatibleMethodOverride]  (PyG's own signature, positional)
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


class GatedPNAConv(PNAConv):
    """:class:`PNAConv` with messages gated by ``env * W_g e_ij`` and envelope-weighted aggregation."""

    propagate_type = {"x": "Tensor", "edge_attr": "OptTensor", "gate": "Tensor", "env": "Tensor"}

    def __init__(
        self, edge_dim: int, aggregator_names: tuple[str, ...], learned_gate: bool = True, **kwargs: Any
    ) -> None:
        """``kwargs``: :class:`PNAConv`'s arguments (from :func:`hydragnn.models.encoders.pna.pna_kwargs`, validated there).
        ``learned_gate`` False: messages are weighted by the envelope alone (plain PNA)."""
        super().__init__(edge_dim=edge_dim if edge_dim > 0 else None, **kwargs)
        self.aggregator_names = tuple(aggregator_names)
        self.scaler_names = tuple(kwargs["scalers"])
        self.gate = nn.Linear(edge_dim, self.F_in, bias=False) if edge_dim > 0 and learned_gate else None

    def forward(self, x: Tensor, edge_index: Tensor, edge_feat: Tensor | None, env: Tensor) -> Tensor:  # type: ignore[override]
        """``x [N, C]``, ``edge_index [2, E]``, ``edge_feat [E, D]`` or None, ``env [E, 1]`` -> ``[N, C]``.

        PyG's message passing with its ``propagate`` machinery left out: the messages of
        ``x_i = x[edge_index[1]]`` (receiver) and ``x_j = x[edge_index[0]]`` are aggregated at the receiver.
        """
        gate = env if self.gate is None else self.gate(edge_feat) * env  # [E, F_in] or [E, 1]
        n = x.shape[0]
        x = x.view(n, 1, self.F_in)
        if self.towers > 1:
            x = x.expand(-1, self.towers, -1)  # every tower reads all of x (a view, never written)
        dst = edge_index[1]
        msg = self.message(x.index_select(0, dst), x.index_select(0, edge_index[0]), edge_feat, gate.unsqueeze(1))
        out = torch.cat([x, self.aggregate(msg, dst, dim_size=n, env=env)], dim=-1)
        if self.towers == 1:
            return self.lin(self.post_nns[0](out.view(n, -1)))
        return self.lin(torch.cat([post(out[:, i]) for i, post in enumerate(self.post_nns)], dim=1))

    def message(self, x_i: Tensor, x_j: Tensor, edge_attr: Tensor | None, gate: Tensor) -> Tensor:  # type: ignore[override]
        """PyG's PNA message ``pre_nn([x_i, x_j, W_e e_ij])`` per tower, times ``gate``: ``[E, T, F_in]``
        (the edge term broadcast to the towers as a view; one tower runs on ``[E, 1, .]`` directly)."""
        parts = [x_i, x_j]
        if edge_attr is not None:
            parts.append(self.edge_encoder(edge_attr).view(-1, 1, self.F_in).expand(-1, self.towers, -1))
        h = torch.cat(parts, dim=-1)
        if self.towers == 1:
            return self.pre_nns[0](h) * gate
        return torch.stack([pre(h[:, i]) for i, pre in enumerate(self.pre_nns)], dim=1) * gate

    def aggregate(  # type: ignore[override]
        self,
        inputs: Tensor,
        index: Tensor,
        ptr: Tensor | None = None,
        dim_size: int | None = None,
        env: Tensor | None = None,
    ) -> Tensor:
        """Messages ``[E, T, F]`` -> ``[N, T, S * A * F]`` (A aggregators, S scalers, PyG's layout)."""
        assert env is not None and dim_size is not None
        dtype = inputs.dtype
        acc = accumulate_dtype(dtype)  # 16-bit messages are aggregated in float32
        m = inputs.to(acc)
        w = env.to(acc).unsqueeze(-1)  # [E, 1, 1]
        deg = scatter_sum(w, index, dim_size)  # [N, 1, 1]
        count = smooth_count(deg)
        mean = scatter_sum(m, index, dim_size) / count
        names = self.aggregator_names
        done = _hard_extremes(m, index, dim_size) if "max" in names and "min" in names else {}
        outs = [done[n] if n in done else self._aggregate_one(n, m, w, index, dim_size, count, mean) for n in names]
        out = torch.cat(outs, dim=-1) if len(outs) > 1 else outs[0]

        degrees = cast("DegreeScalerAggregation", self.aggr_module)  # PNAConv's aggregation
        avg_lin = degrees.avg_deg_lin.to(acc)
        avg_log = degrees.avg_deg_log.to(acc)
        scaled = []  # the scalers' blocks side by side, as PyG's cat lays them
        for name in self.scaler_names:
            if name == "identity":
                scaled.append(out)
            elif name == "amplification":
                scaled.append(out * (torch.log(deg + 1.0) / avg_log))
            elif name == "attenuation":
                scaled.append(out * (avg_log / torch.log(count + 1.0)))
            elif name == "linear":
                scaled.append(out * (deg / avg_lin))
            else:  # inverse_linear
                scaled.append(out * (avg_lin / count))
        out = scaled[0] if len(scaled) == 1 else torch.cat(scaled, dim=-1)
        return out.to(dtype)

    @staticmethod
    def _aggregate_one(
        name: str, m: Tensor, w: Tensor, index: Tensor, dim_size: int, count: Tensor, mean: Tensor
    ) -> Tensor:
        """One envelope-weighted aggregator over gated messages ``m [E, T, F]`` (weights ``w [E, 1, 1]``)."""
        if name == "sum":
            return scatter_sum(m, index, dim_size)
        if name == "mean":
            return mean
        if name in ("var", "std"):
            diff = m - mean.index_select(0, index)
            var = scatter_sum(w * diff * diff, index, dim_size) / count
            return torch.sqrt(var + STD_EPS * STD_EPS) - STD_EPS if name == "std" else var
        if name in ("max", "min"):  # hard, over the messages and 0
            return _extreme_with_zero(m, index, dim_size, "amax" if name == "max" else "amin")
        # softmax / softmin: sum_j w_j e^{t m_j} m_j / (1 + sum_j w_j e^{t m_j}), i.e. over the messages and 0
        t = 1.0 if name == "softmax" else -1.0
        logits = t * m
        shift = _extreme_with_zero(logits.detach(), index, dim_size, "amax")  # [N, T, F], >= 0
        weight = w * torch.exp(logits - shift.index_select(0, index))
        norm = torch.exp(-shift) + scatter_sum(weight, index, dim_size)
        return scatter_sum(weight * m, index, dim_size) / norm


def _extreme_with_zero(x: Tensor, index: Tensor, dim_size: int, reduce: str) -> Tensor:
    """Per receiver, the maximum (``"amax"``) or minimum (``"amin"``) over ``{x_ij} U {0}``:
    ``[E, T, F] -> [N, T, F]`` (0 for a node without messages)."""
    base = x.new_zeros((dim_size,) + tuple(x.shape[1:]))
    return base.scatter_reduce(0, index.view(-1, 1, 1).expand_as(x), x, reduce=reduce, include_self=True)


def _hard_extremes(m: Tensor, index: Tensor, dim_size: int) -> dict[str, Tensor]:
    """``max`` and ``min`` over ``{m_ij} U {0}`` per receiver by one reduction of ``[m, -m]``
    (its backward, the costliest of the aggregation, then runs once)."""
    high, low = _extreme_with_zero(torch.cat([m, -m], dim=-1), index, dim_size, "amax").split(m.shape[-1], dim=-1)
    return {"max": high, "min": -low}

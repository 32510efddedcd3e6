"""The continuous-filter convolution (SchNet's interaction core) as two primitives.

``w = RadialFilter(edges)`` is an MLP ``Linear -> act -> Linear`` on the radial basis values
``[E, R] -> [E, F]``; ``ContinuousFilterConv(x, w, edges)`` multiplies the gathered node
features by the filter and the envelope and sums them into the targets:
``out_i = sum_{j -> i} x_j * w_ji * env(r_ji)``, ``[N, F]``. Split at the point where a fused
backend splits them (hydra-infer's Triton kernels fuse basis + first layer + activation, and
envelope + gather + product + scatter), so any encoder built from them gets the kernels.
"""

from __future__ import annotations

import torch
from torch import nn

from .activations import ShiftedSoftplus
from .backends import Primitive
from .edges import RadialEdges
from .scatter import scatter_sum


class RadialFilter(Primitive, nn.Sequential):
    """``Linear(R, F) -> act -> Linear(F, F)`` on ``edges.basis_values``: ``[E, R] -> [E, F]``.

    An ``nn.Sequential`` (children ``0``, ``1``, ``2``), so state-dict keys are those of the
    plain MLP it replaces. The envelope is not applied here (see :class:`ContinuousFilterConv`).
    By default on CPU the MLP runs once per distinct length where
    :meth:`RadialEdges.shared_basis_values` applies (:mod:`.distinct`).
    """

    def __init__(self, num_radial: int, num_filters: int, activation: nn.Module | None = None) -> None:
        super().__init__(
            nn.Linear(num_radial, num_filters),
            ShiftedSoftplus() if activation is None else activation,
            nn.Linear(num_filters, num_filters),
        )

    def forward(self, edges: RadialEdges) -> torch.Tensor:  # type: ignore[override]
        """``edges`` -> filters ``[E, F]`` (in the layers' dtype)."""
        return nn.Sequential.forward(self, edges.basis_values)


class ContinuousFilterConv(Primitive):
    """``scatter_sum(x[src] * (w * env(r)), dst)``: ``x [N, F]``, ``w [E, F]`` -> ``[N, F]``.

    Parameter-free; the envelope is ``edges.envelope``. Sums of 16-bit messages accumulate in
    float32.
    """

    def forward(self, x: torch.Tensor, w: torch.Tensor, edges: RadialEdges) -> torch.Tensor:
        msg = x.index_select(0, edges.src) * (w * edges.envelope_values)
        return scatter_sum(msg, edges.dst, edges.num_nodes)

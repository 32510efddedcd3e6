"""Radial bases and smooth cutoffs shared by the geometric encoders and heads.

Each is a :class:`~.backends.Primitive` ``[E] -> [E]`` or ``[E] -> [E, R]``: smooth in the
distance (forces by autograd are well defined); the cutoffs vanish at the radius with zero
slope, so energies are continuous when an atom crosses it. Backends read their parameters
(``centers`` / ``coeff``, ``freqs`` / ``prefactor``, ``cutoff``) to fuse them into kernels.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from .backends import Primitive


class CosineCutoff(Primitive):
    """``0.5 * (cos(pi r / rc) + 1)`` for ``r < rc``, else 0. Shape-preserving."""

    def __init__(self, cutoff: float) -> None:
        super().__init__()
        self.cutoff = float(cutoff)

    def forward(self, r: torch.Tensor) -> torch.Tensor:
        inside = (r < self.cutoff).to(r.dtype)
        return 0.5 * (torch.cos(r * (math.pi / self.cutoff)) + 1.0) * inside


class PolynomialCutoff(Primitive):
    """The DimeNet / MACE polynomial envelope of order ``p`` (smooth to order p at ``rc``)."""

    def __init__(self, cutoff: float, p: int = 6) -> None:
        super().__init__()
        self.cutoff = float(cutoff)
        self.p = int(p)

    def forward(self, r: torch.Tensor) -> torch.Tensor:
        p = self.p
        u = r / self.cutoff
        env = (
            1.0
            - (p + 1.0) * (p + 2.0) / 2.0 * u.pow(p)
            + p * (p + 2.0) * u.pow(p + 1)
            - p * (p + 1.0) / 2.0 * u.pow(p + 2)
        )
        return env * (u < 1.0).to(r.dtype)


class GaussianRBF(Primitive):
    """Gaussians centred on ``num_radial`` points in ``[0, cutoff]``: ``[E] -> [E, num_radial]``.

    Values below ``exp(0.8 log tiny)`` (4.7e-31 in float32) are exact zeros: narrow Gaussians
    reach the subnormal range a few widths from their centre, and x86 arithmetic on subnormals
    (the filter network's matrix products, forward and backward) ran 20-50x slower; the margin
    keeps their products with weights normal too. The change in value is below 1e-30.
    """

    centers: torch.Tensor

    def __init__(self, cutoff: float, num_radial: int) -> None:
        super().__init__()
        centers = torch.linspace(0.0, float(cutoff), num_radial)
        self.register_buffer("centers", centers)
        spacing = float(cutoff) / max(num_radial - 1, 1)
        self.coeff = -0.5 / spacing**2

    def forward(self, r: torch.Tensor) -> torch.Tensor:
        diff = r.unsqueeze(-1) - self.centers.to(r.dtype)
        arg = self.coeff * diff.pow(2)
        floor = 0.8 * math.log(torch.finfo(r.dtype).tiny)
        return torch.exp(arg.clamp_min(floor)) * (arg > floor).to(r.dtype)


class BesselRBF(Primitive):
    """``sqrt(2/rc) sin(n pi r / rc) / r`` for n = 1..num_radial: ``[E] -> [E, num_radial]``.

    Safe at ``r == 0`` (padded sink edges have zero length): the limit ``n pi / rc`` is used.
    """

    def __init__(self, cutoff: float, num_radial: int, trainable: bool = False) -> None:
        super().__init__()
        freqs = torch.arange(1, num_radial + 1, dtype=torch.get_default_dtype()) * math.pi / float(cutoff)
        if trainable:
            self.freqs = nn.Parameter(freqs)
        else:
            self.register_buffer("freqs", freqs)
        self.prefactor = math.sqrt(2.0 / float(cutoff))

    def forward(self, r: torch.Tensor) -> torch.Tensor:
        freqs = self.freqs.to(r.dtype)
        r = r.unsqueeze(-1)
        small = r.abs() < 1e-9
        safe_r = torch.where(small, torch.ones_like(r), r)
        value = torch.sin(freqs * safe_r) / safe_r
        return self.prefactor * torch.where(small, freqs.expand_as(value), value)

"""DimeNet's radial (Bessel) and spherical (Fourier-Bessel x Legendre) bases, NaN-safe.

Differences from ``torch_geometric.nn.models.dimenet`` (same functions, safer numerics):

* no sympy / scipy: zeros of the spherical Bessel functions come from a bisection in float64
  at construction time, ``j_l`` from a power series for small arguments and the upward
  recurrence above them (both accurate in float32, smooth across the switch);
* zero-length edges (padding sink -> sink) give finite values and zero gradients: the envelope's
  ``1/x`` and the Bessel quotients are evaluated on a guarded argument;
* the angle enters through ``cos(angle)`` (Legendre polynomials in ``cos``), never ``atan2`` of a
  cross-product norm, whose gradient is undefined for collinear triplets;
* bf16 / fp16 inputs are evaluated in float32 and cast back (the encoder also keeps float32 edge
  vectors as they are and casts the bases to its own dtype).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from .radial import PolynomialCutoff

_SERIES_TERMS = 20
_TINY = 1e-6  # reduced distance below which an edge counts as zero-length (padding)


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return dtype if dtype in (torch.float32, torch.float64) else torch.float32


def _sph_jn_float(l_order: int, x: float) -> float:
    """Spherical Bessel ``j_l(x)`` by upward recurrence, for ``x > l`` (root finding only)."""
    j0 = math.sin(x) / x
    if l_order == 0:
        return j0
    j1 = math.sin(x) / x**2 - math.cos(x) / x
    for l_cur in range(1, l_order):
        j0, j1 = j1, (2 * l_cur + 1) / x * j1 - j0
    return j1


def spherical_bessel_zeros(num_spherical: int, num_radial: int) -> list[list[float]]:
    """The first ``num_radial`` positive zeros of ``j_l`` for ``l < num_spherical`` (float64)."""
    points = [math.pi * (n + 1) for n in range(num_radial + num_spherical - 1)]
    zeros = [points[:num_radial]]
    for l_order in range(1, num_spherical):
        roots = []
        for a, b in zip(points[:-1], points[1:], strict=False):  # zeros of j_l interlace with j_{l-1}
            fa = _sph_jn_float(l_order, a)
            for _ in range(200):
                mid = 0.5 * (a + b)
                fm = _sph_jn_float(l_order, mid)
                if (fm > 0) == (fa > 0):
                    a, fa = mid, fm
                else:
                    b = mid
                if b - a < 1e-15 * b:
                    break
            roots.append(0.5 * (a + b))
        points = roots
        zeros.append(roots[:num_radial])
    return zeros


class SphericalBessel(nn.Module):
    """``j_l(x)`` for a fixed list of orders, on a tensor ``[..., L, K]`` (order along dim -2)."""

    coeffs: torch.Tensor
    lead: torch.Tensor
    switch: torch.Tensor

    def __init__(self, num_spherical: int) -> None:
        super().__init__()
        self.num_spherical = num_spherical
        coeffs = torch.zeros(num_spherical, _SERIES_TERMS, dtype=torch.float64)
        lead = torch.zeros(num_spherical, dtype=torch.float64)
        for order in range(num_spherical):
            lead[order] = 1.0 / math.prod(range(1, 2 * order + 2, 2))  # 1 / (2l+1)!!
            c = 1.0
            for k in range(_SERIES_TERMS):
                coeffs[order, k] = c
                c *= -0.5 / ((k + 1) * (2 * order + 2 * k + 3))
        self.register_buffer("coeffs", coeffs, persistent=False)
        self.register_buffer("lead", lead, persistent=False)
        # series below x = max(l, 0.5), recurrence above
        self.register_buffer(
            "switch",
            torch.tensor([max(float(o), 0.5) for o in range(num_spherical)], dtype=torch.float64),
            persistent=False,
        )
        # the terms that change a float32 / float64 result: the largest |c_k x^2k| below the switch
        # against eps / 256. The later float32 coefficients are subnormal (< 1e-38), and Horner
        # steps on subnormals ran tens of times slower on x86 without changing the sum.
        largest = (coeffs.abs() * self.switch.view(-1, 1) ** (2 * torch.arange(_SERIES_TERMS))).amax(0)
        self.terms = {
            dt: int(torch.nonzero(largest >= torch.finfo(dt).eps / 256).max()) + 1
            for dt in (torch.float32, torch.float64)
        }

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        shape = [1] * (x.dim() - 2) + [self.num_spherical]
        terms = self.terms[dtype]
        coeffs = self.coeffs.to(dtype)
        switch = self.switch.to(dtype).view(*shape, 1)
        lead = self.lead.to(dtype).view(*shape, 1)
        # power series (exact at 0): x^l / (2l+1)!! * sum_k c_k x^(2k)
        y = x * x
        series = coeffs[:, terms - 1].view(*shape, 1).expand_as(x)
        for k in range(terms - 2, -1, -1):
            series = series * y + coeffs[:, k].view(*shape, 1)
        powers = [torch.ones_like(x[..., 0:1, :])]  # x^l by products: pow's gradient at 0 is NaN
        for order in range(1, self.num_spherical):
            xo = x[..., order : order + 1, :]
            term = xo
            for _ in range(order - 1):
                term = term * xo
            powers.append(term)
        series = series * lead * torch.cat(powers, dim=-2)
        # upward recurrence on a guarded argument (x >= switch >= 0.5 where it is used)
        xr = torch.where(x < switch, switch.expand_as(x), x)
        sin, cos = torch.sin(xr), torch.cos(xr)
        j_prev = sin / xr
        j_cur = sin / (xr * xr) - cos / xr
        recur = [j_prev[..., 0:1, :]]
        for order in range(1, self.num_spherical):
            recur.append(j_cur[..., order : order + 1, :])
            j_prev, j_cur = j_cur, (2 * order + 1) / xr * j_cur - j_prev
        recur = torch.cat(recur, dim=-2)
        return torch.where(x < switch, series, recur)


class BesselEdgeBasis(nn.Module):
    """DimeNet's radial basis ``env(d/c) * sin(f_n d/c)``, ``f_n = n pi`` trainable: ``[E] -> [E, R]``.

    ``env(x) = poly_p(x) / x`` (poly the :class:`PolynomialCutoff` with ``p = exponent + 1``), so
    the product is ``poly(x) * sin(f x) / x``, finite at ``x = 0`` (limit ``f``).
    """

    def __init__(self, num_radial: int, cutoff: float, envelope_exponent: int = 5) -> None:
        super().__init__()
        self.cutoff = float(cutoff)
        self.envelope = PolynomialCutoff(1.0, p=envelope_exponent + 1)
        self.freq = nn.Parameter(torch.arange(1, num_radial + 1, dtype=torch.get_default_dtype()) * math.pi)

    def forward(self, dist: torch.Tensor) -> torch.Tensor:
        dtype = dist.dtype
        work = _compute_dtype(dtype)
        x = (dist.to(work) / self.cutoff).unsqueeze(-1)
        freq = self.freq.to(work)
        small = x < _TINY
        xs = torch.where(small, torch.ones_like(x), x)
        ratio = torch.where(small, freq.expand(x.shape[:-1] + freq.shape), torch.sin(freq * xs) / xs)
        return (self.envelope(x) * ratio).to(dtype)


class SphericalBasis(nn.Module):
    """DimeNet's 2D basis ``a_{ln}(d_kj, angle) = env(d/c) N_ln j_l(z_ln d/c) Y_l^0(angle)``.

    The radial part is computed per edge (``[E, L, R]``) and gathered per triplet.
    ``forward(dist [E], cos_angle [T], idx_kj [T]) -> [T, L * R]``; zero-length edges give 0.
    """

    zeros: torch.Tensor
    norm: torch.Tensor
    sph_prefactor: torch.Tensor

    def __init__(self, num_spherical: int, num_radial: int, cutoff: float, envelope_exponent: int = 5) -> None:
        super().__init__()
        self.num_spherical = num_spherical
        self.num_radial = num_radial
        self.cutoff = float(cutoff)
        self.envelope = PolynomialCutoff(1.0, p=envelope_exponent + 1)
        self.bessel = SphericalBessel(num_spherical)
        zeros = torch.tensor(spherical_bessel_zeros(num_spherical, num_radial), dtype=torch.float64)  # [L, R]
        norm = torch.empty_like(zeros)
        for order in range(num_spherical):
            for n in range(num_radial):
                z = float(zeros[order, n])
                norm[order, n] = 1.0 / math.sqrt(0.5 * _sph_jn_float(order + 1, z) ** 2)
        self.register_buffer("zeros", zeros, persistent=False)
        self.register_buffer("norm", norm, persistent=False)
        prefactor = [math.sqrt((2 * o + 1) / (4 * math.pi)) for o in range(num_spherical)]
        self.register_buffer("sph_prefactor", torch.tensor(prefactor, dtype=torch.float64), persistent=False)

    def radial(self, dist: torch.Tensor) -> torch.Tensor:
        """``[E] -> [E, L, R]`` in the compute dtype (zero for zero-length edges)."""
        x = (dist / self.cutoff).unsqueeze(-1).unsqueeze(-1)  # [E, 1, 1]
        small = x < _TINY
        xs = torch.where(small, torch.ones_like(x), x)
        env = torch.where(small, torch.zeros_like(x), self.envelope(xs) / xs)
        return env * self.norm.to(x.dtype) * self.bessel(self.zeros.to(x.dtype) * xs)

    def angular(self, cos_angle: torch.Tensor) -> torch.Tensor:
        """``Y_l^0`` from Legendre polynomials of ``cos``: ``[T] -> [T, L]``."""
        legendre = [torch.ones_like(cos_angle)]
        if self.num_spherical > 1:
            legendre.append(cos_angle)
        for order in range(1, self.num_spherical - 1):
            legendre.append(((2 * order + 1) * cos_angle * legendre[order] - order * legendre[order - 1]) / (order + 1))
        return torch.stack(legendre, dim=-1) * self.sph_prefactor.to(cos_angle.dtype)

    def forward(self, dist: torch.Tensor, cos_angle: torch.Tensor, idx_kj: torch.Tensor) -> torch.Tensor:
        dtype = dist.dtype
        work = _compute_dtype(dtype)
        rad = self.radial(dist.to(work)).index_select(0, idx_kj)  # [T, L, R]
        ang = self.angular(cos_angle.to(work)).unsqueeze(-1)  # [T, L, 1]
        return (rad * ang).reshape(-1, self.num_spherical * self.num_radial).to(dtype)

"""The fused ops of :mod:`.ops` written in plain PyTorch, exactly as the stock encoders compute them.

Used by the tests (kernel vs reference, values and gradients) and as the specification of
each kernel. Shapes as in :mod:`.ops`.
"""

from __future__ import annotations

import math

import torch
from torch.nn import functional as F


def cosine_cutoff(r: torch.Tensor, cutoff: float) -> torch.Tensor:
    """``hydragnn.models.encoders.basis.CosineCutoff``."""
    return 0.5 * (torch.cos(r * (math.pi / cutoff)) + 1.0) * (r < cutoff).to(r.dtype)


def schnet_filter(r, centers, coeff: float, w1, b1) -> torch.Tensor:
    """``ssp(Linear(GaussianRBF(r)))``: ``[E] -> [E, F]``."""
    rbf = torch.exp(coeff * (r.unsqueeze(-1) - centers).pow(2))
    return F.softplus(F.linear(rbf, w1, b1)) - math.log(2.0)


def cfconv(x, w, r, src, dst, cutoff: float, num_nodes: int) -> torch.Tensor:
    """``scatter_sum(x[src] * (w * envelope), dst)``: SchNet's ``Interaction`` aggregation."""
    msg = x[src] * (w * cosine_cutoff(r, cutoff).unsqueeze(-1))
    return x.new_zeros((num_nodes, x.shape[1])).index_add(0, dst, msg)


def bessel(r, freqs, prefactor: float) -> torch.Tensor:
    """``hydragnn.models.encoders.basis.BesselRBF``."""
    r = r.unsqueeze(-1)
    small = r.abs() < 1e-9
    safe = torch.where(small, torch.ones_like(r), r)
    value = torch.sin(freqs * safe) / safe
    return prefactor * torch.where(small, freqs.expand_as(value), value)


def painn_message(phi, v, r, u, freqs, wf, bf, src, dst, prefactor: float, cutoff: float, num_nodes: int):
    """``PaiNNMessage.forward`` up to (excluding) the residual and the update block."""
    hidden = wf.shape[0] // 3
    x = phi[src] * F.linear(bessel(r, freqs, prefactor), wf, bf) * cosine_cutoff(r, cutoff).unsqueeze(-1)
    ds, g_vv, g_vs = torch.split(x, hidden, dim=-1)
    dv = v[src] * g_vv.unsqueeze(1) + g_vs.unsqueeze(1) * u.unsqueeze(-1)
    out_s = phi.new_zeros((num_nodes, hidden)).index_add(0, dst, ds)
    out_v = phi.new_zeros((num_nodes, 3, hidden)).index_add(0, dst, dv)
    return out_s, out_v

"""ZBL repulsion: the screened nuclear repulsion of close contacts, as a fixed per-atom energy.

``V(r) = k Z_i Z_j / r * phi(r / a)`` with ``k = e^2 / (4 pi eps0) = 14.399645 eV Å``, the
universal screening ``phi(x) = 0.18175 e^(-3.19980 x) + 0.50986 e^(-0.94229 x) +
0.28022 e^(-0.40290 x) + 0.02817 e^(-0.20162 x)`` and ``a = 0.46850 Å / (Z_i^0.23 + Z_j^0.23)``
(Ziegler, Biersack and Littmark 1985; the constants of LAMMPS's ``pair_style zbl``).

Decision: the pair term is switched off by MACE's polynomial envelope (``p = 6``) at the sum of
the two covalent radii (ASE's table), as mace-torch's ``ZBLBasis`` does, so it acts on contacts
closer than a bond and leaves bonded distances to the network: it adds no parameters and no
range (the receptive field is unchanged). Each directed edge ``j -> i`` gives atom ``i`` half the
pair energy, so a graph with both directions of every pair counts each pair once, and a rank's
atoms in domain decomposition get their own halves. Energies in eV, lengths in Å (the MLIP
convention).
"""

from __future__ import annotations

import torch
from torch import nn

from .radial import PolynomialCutoff

__all__ = ["COULOMB_EV_ANGSTROM", "ZBLRepulsion", "zbl_pair_energy"]

COULOMB_EV_ANGSTROM = 14.399645
"""``e^2 / (4 pi eps0)`` in eV Å."""

_SCREEN_COEFFS = (0.18175, 0.50986, 0.28022, 0.02817)
_SCREEN_EXPONENTS = (3.19980, 0.94229, 0.40290, 0.20162)
_SCREEN_LENGTH = 0.46850  # 0.8854 Bohr radii, in Å


def zbl_pair_energy(z_i: torch.Tensor, z_j: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
    """The unswitched ZBL energy (eV) of pairs of atomic numbers ``z_i``, ``z_j`` at distances
    ``r > 0`` (Å), all ``[E]``."""
    zi, zj = z_i.to(r.dtype), z_j.to(r.dtype)
    x = r * (zi.pow(0.23) + zj.pow(0.23)) / _SCREEN_LENGTH
    phi = sum(c * torch.exp(-b * x) for c, b in zip(_SCREEN_COEFFS, _SCREEN_EXPONENTS, strict=True))
    return COULOMB_EV_ANGSTROM * zi * zj / r * phi


class ZBLRepulsion(nn.Module):
    """Per-atom ZBL energies ``[N, 1]`` from the species ``[N]``, the edges ``[2, E]`` (source
    ``j``, target ``i``) and their lengths ``[E]``: ``E_i = 1/2 sum_j V(r_ij) f(r_ij / (R_i + R_j))``
    (module docstring), in the dtype of ``length``. Zero-length (padding) edges contribute nothing,
    with finite gradients.

    Computed in float64 whatever the model's dtype: a close contact's pair energy and force are
    orders of magnitude above the network's, and the net force on an atom is a difference of
    them, so float32 rounding of the exponentials (which differs between vectorised and scalar
    code, hence between a batch and its structures alone) would show in the forces at 1e-5.
    The cost is elementwise work on the edges."""

    covalent_radii_pm: torch.Tensor

    def __init__(self, p: int = 6) -> None:
        super().__init__()
        from ase.data import covalent_radii  # hydra-data's dependency: read once, at construction

        # in integer picometres (ASE's table is given to 0.01 Å): no dtype cast of the model rounds them
        picometres = torch.tensor([round(100 * float(r)) for r in covalent_radii], dtype=torch.int64)
        self.register_buffer("covalent_radii_pm", picometres, persistent=False)
        self.envelope = PolynomialCutoff(1.0, p=p)  # of r / (R_i + R_j), as DimeNet reads it

    def forward(self, species: torch.Tensor, edge_index: torch.Tensor, length: torch.Tensor) -> torch.Tensor:
        dtype = length.dtype
        length = length.double()  # see the class docstring
        src, dst = edge_index[0], edge_index[1]
        z_j, z_i = species.index_select(0, src), species.index_select(0, dst)
        radii = self.covalent_radii_pm.to(length.dtype) / 100.0
        u = length / (radii.index_select(0, z_i) + radii.index_select(0, z_j))
        inside = (length > 0) & (u < 1.0)
        safe_r = torch.where(inside, length, torch.ones_like(length))
        envelope = self.envelope(torch.where(inside, u, torch.zeros_like(u)))
        pair = torch.where(inside, 0.5 * zbl_pair_energy(z_i, z_j, safe_r) * envelope, torch.zeros_like(length))
        out = torch.zeros(species.shape[0], dtype=length.dtype, device=length.device)
        return out.index_add(0, dst, pair).unsqueeze(-1).to(dtype)

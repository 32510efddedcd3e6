"""Admission of a captured graph: its replay must match a fresh regular evaluation.

Both results are compared in calculator units (eV, eV/Å) after :func:`..outputs.convert`:

* energy: ``|dE| / N_atoms <= 5e-6`` eV/atom per structure;
* forces and every per-atom head: ``max |d| <= 1e-4 + 1e-5 * max |reference| + 1e-7 * N``, with
  ``N`` the atom count of the largest structure of the call (FP32 noise of the long sums grows
  with the system);
* other per-structure heads: ``max |d| <= 1e-4 + 1e-5 * max |reference|``.

The names and shapes must agree as well, and every replayed value must be finite.
"""

from __future__ import annotations

from collections.abc import Collection

import torch

ENERGY_PER_ATOM = 5e-6
ABS = 1e-4
REL = 1e-5
PER_ATOM = 1e-7


def tolerance(reference: torch.Tensor, atoms: int = 0) -> float:
    """Allowed max deviation of a head: ``ABS + REL * max|reference| + PER_ATOM * atoms``."""
    peak = float(reference.to(torch.float64).abs().max()) if reference.numel() else 0.0
    return ABS + REL * peak + PER_ATOM * atoms


def mismatch(
    got: dict[str, torch.Tensor],
    want: dict[str, torch.Tensor],
    counts: torch.Tensor,
    per_atom: Collection[str] = ("forces",),
) -> str | None:
    """``None`` when ``got`` matches ``want`` within FP32 noise, else what differs.

    Args:
        got, want: converted outputs (``energy [B]``, ``forces``, other heads).
        counts: ``[B]`` atoms per structure.
        per_atom: names of the per-atom heads (forces, atomic energies, node heads).
    """
    if set(got) != set(want):
        return f"outputs {sorted(got)} != {sorted(want)}"
    largest = int(counts.max()) if counts.numel() else 0
    for name, ref in want.items():
        val = got[name]
        if val.shape != ref.shape:
            return f"{name}: shape {tuple(val.shape)} != {tuple(ref.shape)}"
        if not bool(torch.isfinite(val).all()):
            return f"{name}: non-finite values"
        diff = (val.to(torch.float64) - ref.to(torch.float64)).abs()
        if name == "energy":
            per_atom_diff = diff / counts.to(torch.float64).clamp_min(1)
            worst = float(per_atom_diff.max()) if per_atom_diff.numel() else 0.0
            if worst > ENERGY_PER_ATOM:
                return f"energy: {worst:.3g} eV/atom > {ENERGY_PER_ATOM:g}"
        elif diff.numel():
            tol = tolerance(ref, largest if name in per_atom else 0)
            worst = float(diff.max())
            if worst > tol:
                return f"{name}: max deviation {worst:.3g} > {tol:.3g}"
    return None

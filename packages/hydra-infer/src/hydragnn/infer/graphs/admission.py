"""Admission of a captured graph: its replay must match a fresh regular evaluation.

Both results are compared in calculator units (eV, eV/Å) after :func:`..outputs.convert`:

* energy: ``|dE| / N_atoms <= 5e-6`` eV/atom per structure;
* forces and every per-atom head: ``max |d| <= 1e-4 + 1e-5 * max |reference|``;
* other per-structure heads: the same absolute + relative rule.

The names and shapes must agree as well.
"""

from __future__ import annotations

import torch

ENERGY_PER_ATOM = 5e-6
ABS = 1e-4
REL = 1e-5


def mismatch(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor], counts: torch.Tensor) -> str | None:
    """``None`` when ``got`` matches ``want`` within FP32 noise, else what differs."""
    if set(got) != set(want):
        return f"outputs {sorted(got)} != {sorted(want)}"
    for name, ref in want.items():
        val = got[name]
        if val.shape != ref.shape:
            return f"{name}: shape {tuple(val.shape)} != {tuple(ref.shape)}"
        diff = (val.to(torch.float64) - ref.to(torch.float64)).abs()
        if not bool(torch.isfinite(val).all()):
            return f"{name}: non-finite values"
        if name == "energy":
            per_atom = diff / counts.to(torch.float64).clamp_min(1)
            worst = float(per_atom.max()) if per_atom.numel() else 0.0
            if worst > ENERGY_PER_ATOM:
                return f"energy: {worst:.3g} eV/atom > {ENERGY_PER_ATOM:g}"
        elif diff.numel():
            tol = ABS + REL * float(ref.to(torch.float64).abs().max())
            worst = float(diff.max())
            if worst > tol:
                return f"{name}: max deviation {worst:.3g} > {tol:.3g}"
    return None

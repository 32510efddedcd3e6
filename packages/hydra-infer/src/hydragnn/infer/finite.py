"""The finite check where a potential's output enters an MD engine.

A NaN or inf energy, force or stress moves every atom it touches to NaN at the next step, and the
engines go on integrating (LAMMPS ran on with NaN positions; ASE and torch-sim do the same).
:func:`require_finite` runs in the ASE and torch-sim adapters and in the LAMMPS drivers on what
the potential returned, before the engine sees it, and raises :class:`NonFiniteOutput` naming
where (the engine, the step or call), which output and which atoms, so the run stops with its
positions still finite. The check costs one reduction per output where it lives (on a GPU, one
synchronisation); values are copied to the host only to name what is bad.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .errors import InferenceError

__all__ = ["NonFiniteOutput", "require_finite", "require_finite_pairs"]

SHOWN = 10
"""How many atoms a message names (then how many more)."""


class NonFiniteOutput(InferenceError):
    """A potential returned NaN or inf where an MD engine would have used it. Attributes:
    ``output`` (``"energy"``, ``"forces"``, ...), ``atoms`` (the atoms named, engine ids or indices)."""

    def __init__(self, message: str, output: str, atoms: Sequence[int]) -> None:
        super().__init__(message)
        self.output = output
        self.atoms = list(atoms)


def _all_finite(value: Any) -> bool:
    """Whether ``value`` (a torch tensor, checked where it lives, or anything numpy reads) is finite."""
    if hasattr(value, "detach"):
        import torch

        return bool(torch.isfinite(value.detach()).all())
    return bool(np.isfinite(np.asarray(value, dtype=np.float64)).all())


def _numpy(value: Any) -> np.ndarray:
    if hasattr(value, "detach"):  # a torch tensor: copied to the host only once it is known bad
        value = value.detach().cpu().numpy()
    return np.asarray(value, dtype=np.float64)


def _named(ids: np.ndarray, symbols: Sequence[str] | None, rows: np.ndarray) -> str:
    shown = [f"{int(ids[i])}" + (f" ({symbols[i]})" if symbols is not None else "") for i in rows[:SHOWN]]
    more = f", ... and {len(rows) - SHOWN} more" if len(rows) > SHOWN else ""
    return ", ".join(shown) + more


def require_finite(
    where: str,
    per_atom: dict[str, Any] | None = None,
    other: dict[str, Any] | None = None,
    *,
    atom_ids: Any = None,
    symbols: Sequence[str] | None = None,
    id_name: str = "atom",
) -> None:
    """Raise :class:`NonFiniteOutput` if any output holds a NaN or inf.

    Args:
        where: the engine and step or call, e.g. ``"LAMMPS fix 'hydragnn' at step 12"``.
        per_atom: ``{name: [N] or [N, ...]}`` outputs with one row per atom (forces): their bad
            atoms are named. ``None`` values are skipped.
        other: ``{name: value}`` any other output (energy, stress, virial): named alone.
        atom_ids: ``[N]`` the engine's identifier of each row (LAMMPS ids; default: 0-based indices).
        symbols: ``[N]`` chemical symbol of each atom, added to the names.
        id_name: what an identifier is called in the message (``"atom"``, ``"LAMMPS atom id"``).
    """
    for name, value in (per_atom or {}).items():
        if value is None or _all_finite(value):
            continue
        array = _numpy(value)
        n = array.shape[0] if array.ndim else 1
        bad = ~np.isfinite(array.reshape(n, -1)).all(axis=1)
        rows = np.flatnonzero(bad)
        ids = np.arange(n) if atom_ids is None else np.asarray(atom_ids).reshape(-1)
        raise NonFiniteOutput(
            f"{where}: the potential returned non-finite {name} (NaN or inf) on {len(rows)} of {n} atoms, "
            f"{id_name}s {_named(ids, symbols, rows)}; the run is stopped before they move (a model outside "
            "its training data, atoms closer than it has seen, or weights that diverged)",
            name,
            [int(ids[i]) for i in rows],
        )
    for name, value in (other or {}).items():
        if value is None or _all_finite(value):
            continue
        array = _numpy(value)
        raise NonFiniteOutput(
            f"{where}: the potential returned a non-finite {name} (NaN or inf: {array.reshape(-1)[:6].tolist()}); "
            "the run is stopped before the engine uses it",
            name,
            [],
        )


def require_finite_pairs(where: str, pair_forces: Any, pair_i: Any, pair_j: Any) -> None:
    """Raise :class:`NonFiniteOutput` if a pair force ``[P, 3]`` is NaN or inf, naming the atoms
    (LAMMPS's local indices) of the bad pairs."""
    if _all_finite(pair_forces):
        return
    forces = _numpy(pair_forces)
    bad = ~np.isfinite(forces.reshape(len(forces), -1)).all(axis=1)
    atoms = np.unique(np.concatenate([np.asarray(pair_i)[bad], np.asarray(pair_j)[bad]]))
    raise NonFiniteOutput(
        f"{where}: the potential returned non-finite pair forces (NaN or inf) on {int(bad.sum())} of {len(forces)} "
        f"pairs, between atoms {_named(atoms, None, np.arange(len(atoms)))}; the step is stopped before LAMMPS "
        "applies them",
        "pair forces",
        [int(a) for a in atoms],
    )

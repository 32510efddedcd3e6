"""Errors of a model's predictions against labels, per head, in physical units; and their table.

One definition for every layer that scores a model: hydra-train's test errors and
``hydragnn-predict`` (``train.evaluate.mae_report``, ``train.cli``) and
hydra-infer's ``hydragnn-evaluate`` compute and print them here, so the same data gives the
same numbers and the same table.

A head's errors are ``{"mae", "rmse", "unit", "count"}``: every component of a vector head
counts as one error (forces: the MAE over the x, y and z components of every atom); ``count``
is the rows (structures for a graph head, atoms for a node head). A head reported per atom (an
interatomic potential's ``energy``) is compared as ``(pred - true) / natoms``; with
``totals`` its total also gets a row ``<head>_total`` in the unit without ``/atom``. Units
are those of the labels: eV, Å, eV/Å, and stress in eV/Å³ (ASE's units, Voigt components
``xx, yy, zz, yz, xz, xy`` when the head has six).

Torch is the only heavy import; nothing here builds or runs a model.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping
from typing import Any

import torch

from .errors import ModelError

__all__ = [
    "ROLE_UNITS",
    "TOTAL_SUFFIX",
    "UNITS",
    "ErrorStats",
    "error_report",
    "format_errors",
    "head_units",
    "jsonable",
    "training_label_keys",
]

UNITS: dict[str, tuple[str, bool]] = {
    "energy": ("eV/atom", True),
    "atomic_energy": ("eV/atom", False),
    "energy_per_atom": ("eV/atom", False),
    "forces": ("eV/Å", False),
    "stress": ("eV/Å³", False),
    "pressure": ("eV/Å³", False),
    "volume_per_atom": ("Å³", False),
}
"""Output name -> (unit of the reported errors, divide by the number of atoms)."""

ROLE_UNITS: dict[str, tuple[str, bool]] = {
    "energy": ("eV/atom", True),
    "atomic_energy": ("eV/atom", False),
    "forces": ("eV/Å", False),
    "stress": ("eV/Å³", False),
}
"""An interatomic potential's role -> (unit, per atom), whatever its output is named."""

TOTAL_SUFFIX = "_total"
"""Suffix of the row holding a per-atom head's total (``energy_total``, eV)."""


def head_units(model: Any) -> dict[str, tuple[str, bool]]:
    """``{output: (unit of its errors, per atom)}`` for every output of ``model``'s schema.

    An interatomic potential's outputs go by role (:data:`ROLE_UNITS`: energy in eV/atom, forces
    eV/Å, stress eV/Å³), other outputs by name (:data:`UNITS`; unknown names have no unit).

    Args:
        model: a :class:`~hydragnn.models.HydraModel` (its ``schema`` and ``special`` roles).
    """
    special = {name: role for role, name in (getattr(model, "special", None) or {}).items()}
    return {
        var.name: ROLE_UNITS[special[var.name]] if var.name in special else UNITS.get(var.name, ("", False))
        for var in model.schema.outputs
    }


class ErrorStats:
    """Running sums of the errors per head, added batch by batch, reported once.

    Holds, per head, ``sum |d|``, ``sum d²`` (float64), the number of components and of rows,
    where ``d`` is ``pred - true`` (divided by the atoms of its structure for a per-atom head),
    so a file of any length is scored in constant memory and the report equals that of all
    rows at once. Heads keep the order in which they were first added.

    Args:
        units: ``{head: (unit, per atom)}`` (default :data:`UNITS` by name; see :func:`head_units`).
        totals: per-atom heads whose totals (not divided) also get a ``<head>_total`` row.
    """

    def __init__(self, units: Mapping[str, tuple[str, bool]] | None = None, *, totals: Collection[str] = ()) -> None:
        self.units = dict(units or UNITS)
        self.totals = frozenset(totals)
        self._sums: dict[str, list[float]] = {}  # head -> [sum |d|, sum d^2, components, rows]
        self._unit: dict[str, str] = {}

    def unit(self, name: str) -> tuple[str, bool]:
        """``(unit, per atom)`` of head ``name`` (:data:`UNITS` by name when ``units`` lacks it)."""
        return self.units.get(name, UNITS.get(name, ("", False)))

    def add(
        self,
        trues: Mapping[str, torch.Tensor],
        preds: Mapping[str, torch.Tensor],
        natoms: torch.Tensor | None = None,
    ) -> None:
        """Add one batch: ``trues[head]`` and ``preds[head]`` ``[rows, ...]`` of equal shapes.

        Args:
            trues: the labels of every head to score.
            preds: the predictions, with at least the heads of ``trues``.
            natoms: ``[B]`` atoms per structure; a per-atom head divides by it when its rows are
                the ``B`` structures (``None``: never).

        Raises:
            ModelError: a head without predictions, or predictions of another shape.
        """
        for name, t in trues.items():
            if name not in preds:
                raise ModelError(f"errors of head {name!r}: no predictions for it (predicted heads {sorted(preds)})")
            p = torch.as_tensor(preds[name])
            t = torch.as_tensor(t)
            if p.shape != t.shape:
                raise ModelError(
                    f"errors of head {name!r}: predictions {tuple(p.shape)} and labels {tuple(t.shape)} differ in shape"
                )
            unit, per_atom = self.unit(name)
            diff = p.detach().double() - t.detach().double()
            rows = int(diff.shape[0]) if diff.dim() else 1
            total = None
            if per_atom and natoms is not None and natoms.numel() == rows:
                total = diff
                diff = diff / torch.as_tensor(natoms).double().reshape(-1, *([1] * (diff.dim() - 1)))
            self._accumulate(name, unit, diff, rows)
            if total is not None and name in self.totals:
                self._accumulate(name + TOTAL_SUFFIX, unit.removesuffix("/atom"), total, rows)

    def _accumulate(self, name: str, unit: str, diff: torch.Tensor, rows: int) -> None:
        sums = self._sums.setdefault(name, [0.0, 0.0, 0, 0])
        self._unit[name] = unit
        sums[0] += float(diff.abs().sum())
        sums[1] += float(diff.pow(2).sum())
        sums[2] += diff.numel()
        sums[3] += rows

    def report(self) -> dict[str, dict[str, Any]]:
        """``{head: {"mae", "rmse", "unit", "count"}}``; a head without components has NaN errors.

        Each ``<head>_total`` row follows its head.
        """
        out: dict[str, dict[str, Any]] = {}
        for name, (abs_sum, sq_sum, k, rows) in self._sums.items():
            out[name] = {
                "mae": abs_sum / k if k else float("nan"),
                "rmse": math.sqrt(sq_sum / k) if k else float("nan"),
                "unit": self._unit[name],
                "count": int(rows),
            }
        return out


def error_report(
    trues: Mapping[str, torch.Tensor],
    preds: Mapping[str, torch.Tensor],
    natoms: torch.Tensor | None,
    units: Mapping[str, tuple[str, bool]] | None = None,
    *,
    totals: Collection[str] = (),
) -> dict[str, dict[str, Any]]:
    """Per-head mean absolute and root-mean-square errors of all rows at once (see :class:`ErrorStats`).

    Args:
        trues: ``{head: [rows, ...]}`` labels.
        preds: ``{head: [rows, ...]}`` predictions of the same shapes.
        natoms: ``[B]`` atoms per structure, or ``None``.
        units: ``{head: (unit, per atom)}`` (default :data:`UNITS`; :func:`head_units` for a model).
        totals: per-atom heads that also get a ``<head>_total`` row.

    Returns:
        ``{head: {"mae", "rmse", "unit", "count"}}`` (``count``: rows, structures or atoms).
    """
    stats = ErrorStats(units, totals=totals)
    stats.add(trues, preds, natoms)
    return stats.report()


def format_errors(errors: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """The errors table: a header, then ``  energy   0.0041   0.0055  eV/atom`` per head (MAE, RMSE)."""
    width = max([len(name) for name in errors] + [4])
    lines = [f"  {'head':{width}s}  {'MAE':>10s}  {'RMSE':>10s}  unit"]
    for name, r in errors.items():
        rmse = r.get("rmse", float("nan"))
        lines.append(f"  {name:{width}s}  {r['mae']:10.5g}  {rmse:10.5g}  {r['unit']}".rstrip())
    return lines


def jsonable(value: Any) -> Any:
    """``value`` with every non-finite float (NaN, inf) replaced by ``None``, mappings and
    sequences converted recursively, so ``json.dumps(..., allow_nan=False)`` accepts it."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    return value


def training_label_keys(model: Any) -> dict[str, Any]:
    """The file labels ``model`` was trained on, as :class:`~hydragnn.data.AseSource` keywords.

    Read from the training config an artifact's manifest carries (``extra.config.Dataset``);
    with several sources (``Dataset.sources``), those of the source whose energy head the model
    serves. Keys the config does not name are left out (the caller's defaults apply).

    Args:
        model: a :class:`~hydragnn.models.HydraModel`, loaded from an artifact or not.

    Returns:
        A subset of ``energy_key``, ``forces_key``, ``stress_key``, ``config_type_key`` (each a
        label or ``None``: left out of training) and ``extra_keys`` (``((head, label), ...)``).
    """
    manifest = getattr(model, "manifest", None) or {}
    trained = ((manifest.get("extra") or {}).get("config") or {}).get("Dataset") or {}
    if trained.get("sources"):
        names = list(getattr(model, "energy_head_names", None) or [])
        head = getattr(getattr(model, "energy_head", None), "default_head", 0)
        served = names[head] if 0 <= head < len(names) else None
        trained = next((s for s in trained["sources"] if s.get("name") == served), trained["sources"][0])
    keys = {k: trained[k] for k in ("energy_key", "forces_key", "stress_key", "config_type_key") if k in trained}
    if trained.get("keys"):
        keys["extra_keys"] = tuple(trained["keys"].items())
    return keys

"""Did the potential learn? The validation energy error against a composition-only fit, the force
error against predicting zero.

A per-element least-squares fit of the training energies (one energy per element, nothing
about structure) predicts every validation energy to within some error: the composition
baseline. A potential whose validation energy error is not below it has learned nothing about
energies beyond the atom counts; with forces weighted far above energies this happens quietly
(the loss falls, the forces improve, the energy error sits at the baseline). The trainer
computes the baseline once the data is loaded and, after training, says so when the first
stage or the final model did not beat it, naming the keys that change it.

Forces alike: predicting zero force on every atom scores the mean absolute force component of
the validation set. A model whose force error is not well below it (:data:`FORCE_RATIO`) has
learned next to nothing about forces; a short first run with an average of the weights that
still held the initial ones did this silently.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, cast

from hydragnn.data import DataError
from hydragnn.data.atomic_references import fit_average

__all__ = ["FORCE_RATIO", "composition_baseline", "energy_warnings", "force_warnings", "zero_force_baseline"]

FORCE_RATIO = 0.8
"""A force error at or above this fraction of the zero-force error is reported as not learned."""


def composition_baseline(train: Sequence[Any], val: Sequence[Any] | None, energy: str) -> float | None:
    """MAE in eV/atom on ``val`` of per-element energies fitted by least squares on ``train``.

    ``None`` without a validation split, or when a sample lacks atomic numbers or ``energy``, or
    a validation sample has an element the training split lacks (no baseline to compare with).
    """
    if not train or not val:
        return None
    try:
        e0 = fit_average(train, energy).energies
    except DataError:
        return None
    errors = []
    for sample in val:
        value = getattr(sample, energy, None)
        z = getattr(sample, "atomic_number", None)
        if value is None or z is None:
            return None
        numbers = z.reshape(-1).long().tolist()
        if any(n not in e0 for n in numbers):
            return None
        errors.append(abs(float(value.reshape(-1)[0]) - sum(e0[n] for n in numbers)) / len(numbers))
    return sum(errors) / len(errors)


def _val_mae(record: Mapping[str, Any], name: str) -> float | None:
    """The validation MAE of output ``name`` in an epoch record, or ``None``."""
    err = (record.get("val_errors") or {}).get(name)
    return None if err is None else float(err["mae"])


def energy_warnings(
    history: Sequence[Mapping[str, Any]],
    best_epoch: int,
    second_stage_epoch: int | None,
    baseline: float | None,
    name: str = "energy",
) -> list[str]:
    """Warnings when the validation energy MAE (``history[k]["val_errors"][name]["mae"]``, eV/atom)
    of the last first-stage epoch or of the best epoch is not below ``baseline``."""
    if baseline is None or not history:
        return []
    by_epoch = {int(r["epoch"]): r for r in history}
    out = []
    last_first = by_epoch.get(second_stage_epoch - 1) if second_stage_epoch else None
    first = _val_mae(last_first, name) if last_first is not None else None
    if first is not None and first >= baseline:
        out.append(
            f"the first stage ended (epoch {cast(int, second_stage_epoch) - 1}) with a validation energy error of {first:.4g} "
            f"eV/atom, no better than composition alone ({baseline:.4g} eV/atom): it did not learn energies. Raise "
            "Architecture.energy_weight (the energy term is then too weak against the forces)"
        )
    best = _val_mae(by_epoch[best_epoch], name) if best_epoch in by_epoch else None
    if best is not None and best >= baseline:
        out.append(
            f"the model's validation energy error ({best:.4g} eV/atom, epoch {best_epoch}) is no better than composition "
            f"alone ({baseline:.4g} eV/atom): its energies are not learned. Raise Architecture.energy_weight, enable "
            "Training.SecondStage or train longer (num_epoch / max_time_s)"
        )
    return out


def zero_force_baseline(val: Sequence[Any] | None, forces: str) -> float | None:
    """MAE in eV/Å per component of predicting zero forces on ``val`` (the mean ``|F|`` component);
    ``None`` without a validation split, with a sample lacking ``forces``, or with no atoms."""
    if not val:
        return None
    total, count = 0.0, 0
    for sample in val:
        value = getattr(sample, forces, None)
        if value is None:
            return None
        total += float(value.abs().sum())
        count += value.numel()
    return total / count if count else None


def force_warnings(
    history: Sequence[Mapping[str, Any]], best_epoch: int, baseline: float | None, name: str = "forces"
) -> list[str]:
    """A warning when the kept model's validation force MAE (eV/Å) is at or above
    :data:`FORCE_RATIO` of ``baseline`` (the zero-force MAE)."""
    if not baseline or not history:
        return []
    by_epoch = {int(r["epoch"]): r for r in history}
    best = _val_mae(by_epoch[best_epoch], name) if best_epoch in by_epoch else None
    if best is None or best < FORCE_RATIO * baseline:
        return []
    return [
        f"the model's validation force error ({best:.4g} eV/Å, epoch {best_epoch}) is {best / baseline:.0%} of what "
        f"predicting zero forces gives ({baseline:.4g} eV/Å): its forces are barely learned. Train longer "
        "(num_epoch / max_time_s) or on more structures"
    ]

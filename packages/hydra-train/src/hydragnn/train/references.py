"""The reference energies (E0s), energy shift and scale of an interatomic potential, settled once
the data is loaded.

``Architecture.reference_energies`` may be values (by symbol or atomic number), ``"average"``
(least squares of the training energies on composition), ``"isolated_atoms"`` (the training
file's ``IsolatedAtom`` frames), null (none) or absent (isolated atoms when every training
species has one, else the average). ``energy_shift`` and ``energy_scale``, when left out, become
the mean interaction energy per atom of the training structures (``(E - sum e0) / N``) and the
RMS of their force components (the spread of the per-atom interaction energies without forces):
MACE's scale-shift, so the network predicts numbers of order one whatever the reference. The
values found are written into the model's ``Architecture`` (so the artifact carries them),
printed, and returned for the metrics.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from ase.data import chemical_symbols

from hydragnn.data import DataError
from hydragnn.data.atomic_references import fit_average, format_reference_energies, from_isolated_atoms
from hydragnn.models import ModelConfig

from .config import FITTED_KEYS, RunConfig
from .config_training import ARCH
from .data import RunData
from .errors import ConfigError

__all__ = ["resolve_reference_energies", "resolve_scale_shift"]


def _references(
    mode: str,
    given: dict[int, float] | None,
    data: RunData,
    energy_name: str,
    where: str,
    log: Callable[[str], None],
    label: str = "",
) -> tuple[dict[int, float], dict[str, Any]]:
    """``({Z: e0}, record)`` of one data set (one energy head) for ``mode`` (see the module docstring)."""
    species = sorted({int(z) for s in data.train for z in s.atomic_number.reshape(-1).tolist()})
    if mode == "given":
        table = dict(given or {})
        missing = [chemical_symbols[z] for z in species if z not in table]
        if missing:
            raise ConfigError(f"{where}: no value for {missing}, present in the training data{label}")
        table = {z: table[z] for z in species}
        log(f"reference energies{label} (given): {format_reference_energies(table)}")
        return table, {"method": "given", "values": {chemical_symbols[z]: e for z, e in table.items()}}
    if mode == "auto":
        have = {z for z, _ in data.isolated_atoms}
        mode = "isolated_atoms" if data.isolated_atoms and set(species) <= have else "average"
    record: dict[str, Any] = {"method": mode}
    try:
        if mode == "isolated_atoms":
            table = from_isolated_atoms(data.isolated_atoms, species, f"the training data{label}")
            table = {z: table[z] for z in species}
            note = f"{len(data.isolated_atoms)} IsolatedAtom frames"
        else:
            fit = fit_average(data.train, energy_name)
            table = fit.energies
            record["residual_rms_ev_per_atom"] = fit.residual_rms
            note = f"least squares on {fit.samples} training structures, residual RMS {fit.residual_rms:.4g} eV/atom"
            if fit.rank_deficient:
                note += "; the compositions do not determine every species (minimum-norm values)"
    except DataError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    record["values"] = {chemical_symbols[z]: e for z, e in table.items()}
    log(f"reference energies{label} ({mode}: {note}): {format_reference_energies(table)}")
    return table, record


def _head_objects(model_config: ModelConfig, heads: list[str]) -> list[dict[str, Any]]:
    """The ``energy_heads`` entries of the raw Architecture as objects (names for a new run)."""
    raw = model_config.raw.get("energy_heads") or heads
    return [dict(h) if isinstance(h, dict) else {"name": h} for h in raw]


def resolve_reference_energies(
    cfg: RunConfig, model_config: ModelConfig, data: RunData, log: Callable[[str], None] = lambda _: None
) -> tuple[ModelConfig, dict[str, Any] | None]:
    """The model config with its reference energies settled, and a record of them.

    With ``Dataset.sources`` every source's energy head gets its own, from that source's data
    (its own ``reference_energies`` in ``energy_heads`` count as given).

    Returns:
        ``(model_config, record)``; ``record`` is ``{"method", "values": {symbol: eV},
        "residual_rms_ev_per_atom"?}`` (``{head: record}`` with sources), or ``None`` for a
        model without reference energies.

    Raises:
        ConfigError: given values that miss a species of the training data, ``isolated_atoms``
            without an ``IsolatedAtom`` frame for every species, or an average with no energies.
    """
    mode = cfg.reference_energies
    if not model_config.mlip.enabled or mode == "none":
        return model_config, None
    where = f"{ARCH}.reference_energies"
    given = dict(model_config.mlip.reference_energies or ())
    if not data.heads:
        table, record = _references(mode, given, data, model_config.mlip.energy_name, where, log)
        if mode == "given":
            return model_config, record
        return ModelConfig.from_dict({**model_config.raw, "reference_energies": _json(table)}), record
    objects = _head_objects(model_config, data.heads)
    records = {}
    for k, (name, part) in enumerate(zip(data.heads, data.parts, strict=True)):
        own = objects[k].get("reference_energies")
        head_mode = "given" if own is not None else mode
        head_given = dict(model_config.mlip.head_specs()[k].reference_energies or ()) if own is not None else given
        table, records[name] = _references(
            head_mode, head_given, part, model_config.mlip.energy_name, where, log, label=f" of head {name!r}"
        )
        objects[k]["reference_energies"] = _json(table)
    return ModelConfig.from_dict({**model_config.raw, "energy_heads": objects}), records


def _json(table: dict[int, float]) -> dict[str, float]:
    return {str(z): e for z, e in table.items()}


def _scale_shift(part: RunData, model_config: ModelConfig, reference: dict[int, float]) -> tuple[dict[str, float], str]:
    per_atom, forces = [], []
    for i, sample in enumerate(part.train):
        z = sample.atomic_number.reshape(-1).long().tolist()
        if not z:
            raise DataError(
                f"training sample {i} has no atoms: an energy per atom is undefined (remove it from the data)"
            )
        energy = float(getattr(sample, model_config.mlip.energy_name).reshape(-1)[0])
        per_atom.append((energy - sum(reference.get(k, 0.0) for k in z)) / len(z))
        f = getattr(sample, model_config.mlip.forces_name, None)
        if f is not None:
            forces.append(f.reshape(-1).double())
    residual = torch.tensor(per_atom, dtype=torch.float64)
    shift = float(residual.mean())
    if forces:
        scale, what = float(torch.cat(forces).pow(2).mean().sqrt()), "RMS force component"
    else:
        scale, what = float(residual.std()) if residual.numel() > 1 else 1.0, "spread of E/N"
    if not scale > 1e-6:
        scale, what = 1.0, "default (the data has no spread)"
    return {"energy_shift": shift, "energy_scale": scale}, what


def resolve_scale_shift(
    cfg: RunConfig, model_config: ModelConfig, data: RunData, log: Callable[[str], None] = lambda _: None
) -> tuple[ModelConfig, dict[str, Any] | None]:
    """The model config with ``energy_shift`` / ``energy_scale`` filled from the training split
    where the Architecture leaves them out (after :func:`resolve_reference_energies`); per
    energy head, from its source's data, with ``Dataset.sources``.

    Returns:
        ``(model_config, {"energy_shift", "energy_scale"})`` (``{head: {...}}`` with sources) or
        ``(model_config, None)`` when nothing was filled (not an MLIP, or both given).
    """
    missing = [key for key in FITTED_KEYS if key not in cfg.architecture]
    if not model_config.mlip.enabled or not missing:
        return model_config, None
    if not data.heads:
        values, what = _scale_shift(data, model_config, dict(model_config.mlip.reference_energies or ()))
        fitted = {key: values[key] for key in missing}
        log(
            "energy scale-shift from the training split: "
            + ", ".join(f"{key} {value:.5g} eV" for key, value in fitted.items())
            + (f" (scale: {what})" if "energy_scale" in fitted else "")
        )
        return ModelConfig.from_dict({**model_config.raw, **fitted}), fitted
    objects = _head_objects(model_config, data.heads)
    specs = model_config.mlip.head_specs()
    records = {}
    for k, (name, part) in enumerate(zip(data.heads, data.parts, strict=True)):
        values, _ = _scale_shift(part, model_config, dict(specs[k].reference_energies or ()))
        fitted = {key: values[key] for key in missing if key not in objects[k]}
        objects[k].update(fitted)
        records[name] = fitted
        log(f"energy scale-shift of head {name!r}: " + ", ".join(f"{k2} {v:.5g} eV" for k2, v in fitted.items()))
    return ModelConfig.from_dict({**model_config.raw, "energy_heads": objects}), records

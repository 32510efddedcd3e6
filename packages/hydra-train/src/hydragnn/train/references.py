"""The reference energies (E0s) of an interatomic potential, settled once the data is loaded.

``Architecture.reference_energies`` may be values (by symbol or atomic number), ``"average"``
(least squares of the training energies on composition), ``"isolated_atoms"`` (the training
file's ``IsolatedAtom`` frames), null (none) or absent (isolated atoms when every training
species has one, else the average). The values found are written into the model's
``Architecture`` (so the artifact carries them), printed, and returned for the metrics.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ase.data import chemical_symbols

from hydragnn.data import DataError
from hydragnn.data.atomic_references import fit_average, format_reference_energies, from_isolated_atoms
from hydragnn.models import ModelConfig

from .config import ARCH, RunConfig
from .data import RunData
from .errors import ConfigError

__all__ = ["resolve_reference_energies"]


def resolve_reference_energies(
    cfg: RunConfig, model_config: ModelConfig, data: RunData, log: Callable[[str], None] = lambda _: None
) -> tuple[ModelConfig, dict[str, Any] | None]:
    """The model config with its reference energies settled, and a record of them.

    Returns:
        ``(model_config, record)``; ``record`` is ``{"method", "values": {symbol: eV},
        "residual_rms_ev_per_atom"?}``, or ``None`` for a model without reference energies.

    Raises:
        ConfigError: given values that miss a species of the training data, ``isolated_atoms``
            without an ``IsolatedAtom`` frame for every species, or an average with no energies.
    """
    mode = cfg.reference_energies
    if not model_config.enable_interatomic_potential or mode == "none":
        return model_config, None
    species = sorted({int(z) for s in data.train for z in s.atomic_number.reshape(-1).tolist()})
    where = f"{ARCH}.reference_energies"
    if mode == "given":
        table = dict(model_config.reference_energies or ())
        missing = [chemical_symbols[z] for z in species if z not in table]
        if missing:
            raise ConfigError(f"{where}: no value for {missing}, present in the training data")
        log(f"reference energies (given): {format_reference_energies({z: table[z] for z in species})}")
        return model_config, {"method": "given", "values": {chemical_symbols[z]: table[z] for z in species}}
    if mode == "auto":
        have = {z for z, _ in data.isolated_atoms}
        mode = "isolated_atoms" if data.isolated_atoms and set(species) <= have else "average"
    record: dict[str, Any] = {"method": mode}
    try:
        if mode == "isolated_atoms":
            table = from_isolated_atoms(data.isolated_atoms, species, "the training data")
            table = {z: table[z] for z in species}
            note = f"{len(data.isolated_atoms)} IsolatedAtom frames"
        else:
            fit = fit_average(data.train, model_config.energy_name)
            table = fit.energies
            record["residual_rms_ev_per_atom"] = fit.residual_rms
            note = f"least squares on {fit.samples} training structures, residual RMS {fit.residual_rms:.4g} eV/atom"
            if fit.rank_deficient:
                note += "; the compositions do not determine every species (minimum-norm values)"
    except DataError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    record["values"] = {chemical_symbols[z]: e for z, e in table.items()}
    log(f"reference energies ({mode}: {note}): {format_reference_energies(table)}")
    settled = ModelConfig.from_dict({**model_config.raw, "reference_energies": {str(z): e for z, e in table.items()}})
    return settled, record

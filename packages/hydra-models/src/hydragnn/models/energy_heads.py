"""Several energy heads on one encoder (``Architecture.energy_heads``), one per data source.

An interatomic potential trained on data sets of different origin (your own DFT data and a
replayed slice of the data a foundation model was trained on, say: different codes, settings
and so reference energies) keeps one encoder and gives each source its own energy readout,
reference energies, shift and scale. Each structure names its head by a graph attribute
``head`` (int64, one per structure; a batch carries ``head [B]``); structures without one use
the model's default head (the first, or the one chosen with
:meth:`~hydragnn.models.HydraModel.select_head`). Forces and stress are derivatives of the
energy of the structure's own head.

JSON::

    "energy_heads": ["mine", "replay"]
    "energy_heads": [{"name": "mine", "reference_energies": {"Cu": -3.71}, "energy_shift": -0.2,
                      "energy_scale": 1.1},
                     {"name": "replay"}]

A head without its own ``reference_energies`` / ``energy_shift`` / ``energy_scale`` takes the
Architecture's.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from hydragnn.data.config_parse import check_keys, parse_value

from .errors import ModelConfigError

__all__ = ["EnergyHeadSpec", "parse_energy_heads"]

_KEYS = {"name", "reference_energies", "energy_shift", "energy_scale"}


@dataclass(frozen=True)
class EnergyHeadSpec:
    """One energy head: its name and, when it has its own, reference energies, shift and scale."""

    name: str
    reference_energies: tuple[tuple[int, float], ...] | None = None
    energy_shift: float | None = None
    energy_scale: float | None = None


def parse_energy_heads(
    values: Any, where: str, parse_references: Callable[[Any, str], tuple[tuple[int, float], ...] | None]
) -> tuple[EnergyHeadSpec, ...]:
    """Parse ``energy_heads`` (names or objects; names unique and non-empty).

    Raises:
        ModelConfigError: naming ``<where>[i].<key>``.
    """
    if not isinstance(values, list) or not values:
        raise ModelConfigError(f"{where}: expected a non-empty list of head names or objects, found {values!r}")
    specs = []
    for i, item in enumerate(values):
        at = f"{where}[{i}]"
        if isinstance(item, str):
            item = {"name": item}
        if not isinstance(item, Mapping):
            raise ModelConfigError(f"{at}: expected a name or an object with 'name', found {type(item).__name__}")
        check_keys(item, at, _KEYS, ModelConfigError)
        name = item.get("name")
        if not isinstance(name, str) or not name:
            raise ModelConfigError(f"{at}.name: expected a non-empty string, found {name!r}")
        numbers = {
            key: parse_value(item.get(key), float | None, f"{at}.{key}", ModelConfigError, meta)
            for key, meta in (("energy_shift", {}), ("energy_scale", {"gt": 0, "noun": "a finite number"}))
        }
        refs = item.get("reference_energies")
        specs.append(
            EnergyHeadSpec(
                name=name,
                reference_energies=parse_references(refs, f"{at}.reference_energies") if refs is not None else None,
                **numbers,
            )
        )
    names = [s.name for s in specs]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ModelConfigError(f"{where}: head names must be unique, found {twice} more than once")
    return tuple(specs)

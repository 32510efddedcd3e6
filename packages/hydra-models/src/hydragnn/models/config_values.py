"""Checks of JSON values for the ``Architecture`` section (errors name the JSON path)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from .errors import ModelConfigError


def check_typed(value: Any, kind: str, where: str, *, optional: bool = False) -> Any:
    """Check a scalar JSON value: kind is int, float (finite: JSON's NaN / Infinity are refused), bool or str
    (ints accepted as floats)."""
    if value is None and optional:
        return None
    ok = {
        "int": isinstance(value, int) and not isinstance(value, bool),
        "float": isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value),
        "bool": isinstance(value, bool),
        "str": isinstance(value, str),
    }[kind]
    if not ok:
        found = "null" if value is None else f"{type(value).__name__} {value!r}"
        expected = "a finite float" if isinstance(value, float) and kind == "float" else kind
        raise ModelConfigError(f"{where}: expected {expected}{' or null' if optional else ''}, found {found}")
    return float(value) if kind == "float" else value


def check_positive(value: int | float | None, where: str, *, allow_zero: bool = False) -> None:
    if value is not None and (value < 0 or (value == 0 and not allow_zero)):
        raise ModelConfigError(f"{where}: expected a value {'>= 0' if allow_zero else '> 0'}, found {value!r}")


def check_choice(value: str, options, where: str) -> str:
    if value not in options:
        raise ModelConfigError(f"{where}: expected one of {sorted(options)}, found {value!r}")
    return value


def check_section(values: Any, where: str, allowed: set[str]) -> dict[str, Any]:
    if not isinstance(values, Mapping):
        raise ModelConfigError(f"{where}: expected an object, found {type(values).__name__}")
    unknown = sorted(set(values) - allowed)
    if unknown:
        raise ModelConfigError(f"{where}: unknown key(s) {unknown}; allowed: {sorted(allowed)}")
    return dict(values)

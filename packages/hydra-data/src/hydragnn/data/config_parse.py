"""One annotation-driven parser for the JSON config sections of every layer (hydra-data's
``Training.Batching``, hydra-models' ``Architecture``, hydra-train's ``Training`` and ``Dataset``).

A section is a frozen dataclass: each field's type annotation says what JSON value it takes and
its ``metadata`` adds the rest. :func:`parse_dataclass` checks a JSON object against it and
returns the instance; the error class is a parameter (``DataError`` in hydra-data,
``ModelConfigError`` in hydra-models, ``ConfigError`` in hydra-train) and every message starts with the JSON path of the value.

Annotations: ``int``, ``float``, ``bool``, ``str``, ``Literal[...]``, ``tuple[X, ...]``,
``list[X]``, ``dict[str, X]``, ``X | Y`` (``X | None``: null allowed), a nested dataclass, ``Any``
(taken as given). Field metadata: ``min`` / ``max`` (inclusive bounds), ``gt`` / ``lt``
(exclusive), ``choices`` (allowed strings when they live in a table such as the activations),
``noun`` (what the range message calls the value, default "a value"), ``json`` (the JSON key
when it differs from the field name), ``parse`` (``parse(value, where, error)`` for a shape no
annotation says, e.g. a list or an object of weights), ``flat`` (on a nested-dataclass field: a
group whose fields' keys sit in the enclosing JSON object itself, so the JSON stays flat while
code reads ``config.group.field``; keys, unknown-key checks and :func:`to_json` see through it).

Rules, the same for every section: an unknown key is refused with the nearest allowed key and
the allowed list (``<path>.<key>: unknown key (did you mean 'x'?); allowed: [...]``, see
:func:`unknown_keys`); a bool is
never an int or a float; an int is a valid float (converted); floats must be finite (JSON's
``NaN`` / ``Infinity``, which Python's json reads, are refused); a JSON list becomes a tuple
for a ``tuple`` field; a value of the wrong kind gets ``<path>: expected <type>, found <value>``.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import types
import typing
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal, cast

from .errors import did_you_mean

Error = type[Exception]


# ----------------------------------------------------------------------------- sections
def check_keys(values: Any, where: str, allowed: Iterable[str], error: Error) -> dict[str, Any]:
    """``values`` as a dict after checking it is a JSON object with only ``allowed`` keys
    (``None`` is an empty object: a section left null takes every default)."""
    if values is None:
        return {}
    if not isinstance(values, Mapping):
        raise error(f"{where}: expected an object, found {type(values).__name__}")
    allowed = sorted(allowed)
    unknown = sorted(set(values) - set(allowed), key=str)
    if unknown:
        raise error(f"{unknown_keys(where, unknown, allowed)}; allowed: {allowed}")
    return dict(values)


def unknown_keys(where: str, unknown: Iterable[Any], allowed: Iterable[Any] = ()) -> str:
    """The start of every unknown-key message: each key's JSON path, then ``unknown key``
    (``unknown keys`` for several) and the nearest ``allowed`` key
    (:func:`~hydragnn.data.errors.did_you_mean`), e.g.
    ``Training.Optimizer.LR: unknown key (did you mean 'lr'?)``."""
    unknown = list(unknown)
    paths = ", ".join(f"{where}.{k}" for k in unknown)
    return f"{paths}: unknown key{'s' if len(unknown) > 1 else ''}{did_you_mean(unknown, allowed)}"


def json_key(f: dataclasses.Field) -> str:
    """The JSON key of a dataclass field (``metadata["json"]``, else its name)."""
    return f.metadata.get("json", f.name)


def is_flat(f: dataclasses.Field) -> bool:
    """Whether ``f`` is a flat group (``metadata["flat"]``): a dataclass whose fields' JSON keys
    sit in the enclosing object."""
    return bool(f.metadata.get("flat"))


def section_keys(cls: type) -> set[str]:
    """The JSON keys of every field of the dataclass ``cls`` (a flat group's keys, not its name)."""
    keys: set[str] = set()
    for f in dataclasses.fields(cls):
        keys |= section_keys(_hints(cls)[f.name]) if is_flat(f) else {json_key(f)}
    return keys


def key_values(obj: Any) -> dict[str, Any]:
    """``{JSON key: attribute value}`` of a dataclass instance, flat groups merged in (values as
    they are, not converted: see :func:`to_json`)."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        out.update(key_values(value) if is_flat(f) else {json_key(f): value})
    return out


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def parse_fields(
    cls: type,
    values: Mapping[str, Any],
    where: str,
    error: Error,
    *,
    skip: Iterable[str] = (),
    annotation_text: bool = False,
) -> dict[str, Any]:
    """Parse each key of ``values`` that is a field of ``cls`` (JSON key, see :func:`json_key`)
    and not in ``skip``: the constructor keyword arguments (field name -> value). Keys that are
    not fields are ignored here (see :func:`check_keys`). A flat group is always built, from the
    keys of ``values`` that are its fields (its defaults for the rest).

    ``annotation_text``: a wrong-kind message spells the expected type as the field's annotation
    (``int|None``) instead of in JSON words (``int or null``); encoder configs always did.
    """
    hints, skip, out = _hints(cls), set(skip), {}
    for f in dataclasses.fields(cls):
        if is_flat(f):
            group = hints[f.name]
            out[f.name] = group(**parse_fields(group, values, where, error, skip=skip, annotation_text=annotation_text))
            continue
        key = json_key(f)
        if key in skip or key not in values:
            continue
        if "parse" in f.metadata:
            out[f.name] = f.metadata["parse"](values[key], f"{where}.{key}", error)
            continue
        text = str(f.type).replace(" ", "") if annotation_text else None
        out[f.name] = parse_value(values[key], hints[f.name], f"{where}.{key}", error, f.metadata, expected=text)
    return out


def parse_dataclass(
    cls: type,
    values: Any,
    where: str,
    error: Error,
    *,
    annotation_text: bool = False,
    **fixed: Any,
) -> Any:
    """The dataclass ``cls`` from the JSON object ``values`` (null: every default): unknown keys
    refused, each given field parsed by its annotation, the rest left to the defaults;
    ``fixed``: keyword arguments passed to the constructor as they are."""
    v = check_keys(values, where, section_keys(cls) - set(fixed), error)
    return cls(**parse_fields(cls, v, where, error, annotation_text=annotation_text), **fixed)


# ----------------------------------------------------------------------------- values
def describe(hint: Any) -> str:
    """The JSON words for an annotation (``int or null``, ``a list of str``, ``one of [...]``)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is type(None):
        return "null"
    if origin is Literal:
        return f"one of {sorted(args, key=str)}"
    if origin in (typing.Union, types.UnionType):
        named = [describe(a) for a in args if a is not type(None)]
        return " or ".join(named + (["null"] if type(None) in args else []))
    if origin in (tuple, list):
        return f"a list of {describe(args[0])}" if args else "a list"
    if origin is dict or dataclasses.is_dataclass(hint):
        return "an object"
    return getattr(hint, "__name__", str(hint))


def _found(value: Any) -> str:
    return "null" if value is None else f"{type(value).__name__} {value!r}"


def _accepts(hint: Any, value: Any) -> bool:
    """Whether ``value``'s JSON kind is the kind of ``hint`` (picks the member of a union)."""
    origin = typing.get_origin(hint)
    if hint is Any:
        return True
    if hint is type(None):
        return value is None
    if isinstance(value, bool):
        return hint is bool
    if origin is Literal:
        return any(type(a) is type(value) for a in typing.get_args(hint))
    if hint is int:
        return isinstance(value, int)
    if hint is float:
        return isinstance(value, (int, float))
    if hint is str:
        return isinstance(value, str)
    if origin in (tuple, list):
        return isinstance(value, (list, tuple))
    if origin is dict or dataclasses.is_dataclass(hint):
        return isinstance(value, Mapping)
    return False


def parse_value(
    value: Any,
    hint: Any,
    where: str,
    error: Error,
    meta: Mapping[str, Any] | None = None,
    *,
    expected: str | None = None,
) -> Any:
    """Check one JSON value against the annotation ``hint`` (and a field's ``meta``: ranges,
    choices) and return it converted (int -> float for a float, list -> tuple for a tuple).

    Raises:
        error: ``<where>: expected <type>, found <type> <value>`` (``expected`` overrides the
            type words), ``expected a finite float`` for NaN / Infinity, ``expected one of
            [...]`` for a choice, ``expected a value >= 1`` (or ``in (0, 1)``) for a range.
    """
    meta = meta or {}
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        member = next((a for a in args if _accepts(a, value)), None)
        if member is None:
            raise error(f"{where}: expected {expected or describe(hint)}, found {_found(value)}")
        hint, origin, args = member, typing.get_origin(member), typing.get_args(member)
    if hint is Any or value is None and hint is type(None):
        return value
    if isinstance(value, float) and not math.isfinite(value) and _accepts(hint, value):
        raise error(f"{where}: expected a finite float, found {_found(value)}")
    if origin is Literal:
        if value not in args or not _accepts(hint, value):
            raise error(f"{where}: expected {describe(hint)}, found {value!r}")
        return value
    if not _accepts(hint, value):
        raise error(f"{where}: expected {expected or describe(hint)}, found {_found(value)}")
    if origin is tuple or origin is list:
        seq = cast(Sequence[Any], value)  # a JSON list (checked by _accepts)
        fixed = origin is tuple and not (len(args) == 2 and args[1] is Ellipsis)
        if fixed and len(seq) != len(args):
            raise error(f"{where}: expected a list of {len(args)} values, found {len(seq)}")
        items = [
            parse_value(v, args[i] if fixed else args[0], f"{where}[{i}]", error) if args else v
            for i, v in enumerate(seq)
        ]
        return tuple(items) if origin is tuple else items
    if origin is dict:
        inner = args[1] if args else Any
        obj = cast(Mapping[Any, Any], value)  # a JSON object (checked by _accepts)
        return {str(k): parse_value(v, inner, f"{where}.{k}", error) for k, v in obj.items()}
    if dataclasses.is_dataclass(hint):
        return parse_dataclass(cast(type, hint), value, where, error)  # an annotation: a class
    if hint is float:
        value = float(cast(float, value))  # an int or a float (checked by _accepts)
    if "choices" in meta and value not in meta["choices"]:
        raise error(f"{where}: expected one of {sorted(meta['choices'])}, found {value!r}")
    check_range(value, meta, where, error)
    return value


def check_range(value: Any, meta: Mapping[str, Any], where: str, error: Error) -> None:
    """Check ``value`` against the bounds ``min`` / ``max`` (inclusive), ``gt`` / ``lt``
    (exclusive) of ``meta``: ``expected a value >= 1`` or, with two bounds, ``in (0, 1]``."""
    low = ("gt", meta["gt"]) if "gt" in meta else ("min", meta["min"]) if "min" in meta else None
    high = ("lt", meta["lt"]) if "lt" in meta else ("max", meta["max"]) if "max" in meta else None
    ok = (low is None or (value > low[1] if low[0] == "gt" else value >= low[1])) and (
        high is None or (value < high[1] if high[0] == "lt" else value <= high[1])
    )
    if ok:
        return
    noun = meta.get("noun", "a value")
    if low and high:
        bounds = f"in {'(' if low[0] == 'gt' else '['}{low[1]}, {high[1]}{')' if high[0] == 'lt' else ']'}"
    elif low:
        bounds = f"{'>' if low[0] == 'gt' else '>='} {low[1]}"
    else:
        high = cast(tuple[str, Any], high)  # not ok: a bound exists, and it is not low
        bounds = f"{'<' if high[0] == 'lt' else '<='} {high[1]}"
    raise error(f"{where}: expected {noun} {bounds}, found {value!r}")


def choice(value: Any, options: Iterable[str], where: str, error: Error) -> str:
    """A string that must be one of ``options`` (a table's keys, a tuple of names)."""
    value = parse_value(value, str, where, error)
    if value not in options:
        raise error(f"{where}: expected one of {sorted(options)}, found {value!r}")
    return value


def to_json(obj: Any) -> Any:
    """A (nested) dataclass as JSON-ready dicts and lists, keyed by the fields' JSON keys (a flat
    group's keys merged into its enclosing object)."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {k: to_json(v) for k, v in key_values(obj).items()}
    if isinstance(obj, (list, tuple)):
        return [to_json(v) for v in obj]
    if isinstance(obj, Mapping):
        return {k: to_json(v) for k, v in obj.items()}
    return obj

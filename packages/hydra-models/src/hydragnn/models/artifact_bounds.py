"""Bounds on the sizes an artifact's manifest declares, from the weights the file stores.

A model cannot need a width, basis or vocabulary larger than its largest stored tensor, nor more
layers than its weights hold: every ``Linear(n, m)`` stores ``n * m`` values, and every layer
with weights stores them under its own index in the state dict (``convs.3.lin.weight``,
``layer3.weight``). :func:`check_declared_sizes` applies these bounds to the raw manifest, before
it is parsed or any module is built, so a lying manifest (``num_radial: 1e9``, 5000 layers around
a few KB of weights) is refused in milliseconds instead of allocating gigabytes.
"""

from __future__ import annotations

import dataclasses
import re
import typing
from collections import defaultdict
from collections.abc import Iterator, Mapping
from typing import Any

import torch

from hydragnn.data.config_parse import is_flat, json_key

from .config import ModelConfig
from .encoder_configs import ENCODER_CONFIGS
from .errors import ArtifactError

NOT_SIZES = frozenset(
    {"max_neighbours", "triplet_capacity", "charge_index", "spin_index", "pna_deg", "elements", "reference_energies"}
)
"""Integer keys that size nothing built from the manifest (runtime caps, indices, degree counts,
atomic numbers); the config parser validates them."""
_LAYER_COUNTS = frozenset({"num_before_skip", "num_after_skip", "correlation", "committee"})
"""Counts of indexed blocks not named ``*layers`` (MACE's ``correlation``: one product per order;
a committee's ``members.0``, ``members.1``, ...)."""
_INDEX = re.compile(r"(\d+)$")


def _fields(cls: type) -> Iterator[tuple[str, str]]:
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if is_flat(f):
            yield from _fields(hints[f.name])
        else:
            yield json_key(f), str(hints[f.name])


def _not_sizes() -> frozenset[str]:
    """:data:`NOT_SIZES` and every key no config (common or any registered encoder's) annotates as
    an integer: weights, tolerances, radii, whether the JSON writes them as integers or not. The
    ``output_heads`` keys are all integers but ``type``."""
    classes = [ModelConfig, *(e.config for e in ENCODER_CONFIGS.values())]
    typed = [kv for cls in classes for kv in _fields(cls)]
    ints = {key for key, hint in typed if "int" in hint} | {"output_heads"}
    return NOT_SIZES | ({key for key, _ in typed} - ints)


def _is_layer_count(key: str) -> bool:
    return (key.endswith("layers") and not key.startswith("dim_")) or key in _LAYER_COUNTS


def weight_bounds(state: Mapping[str, torch.Tensor]) -> tuple[int, int]:
    """``(largest, depth)``: the most values one stored tensor holds, and the most layers of one
    indexed list (``convs.0``, ``convs.1``, ... or ``layer0``, ``layer1``, ...) that hold weights.

    Layers are counted, not read from their index: one tensor named ``convs.4999.w`` does not
    make room for 5000 layers.
    """
    largest = max((t.numel() for t in state.values()), default=0)
    layers: dict[str, set[str]] = defaultdict(set)
    for key in state:
        parts = key.split(".")
        for i, part in enumerate(parts):
            match = _INDEX.search(part)
            if match:
                layers[".".join([*parts[:i], part[: match.start()]])].add(match.group(1))
    return largest, max((len(v) for v in layers.values()), default=0)


def _declared(value: Any, where: str, skip: frozenset[str]) -> Iterator[tuple[str, str, int]]:
    """``(path, key, value)`` for every integer of a JSON tree not under a key in ``skip``, ``key``
    the innermost object key above it (iterative: deep nesting cannot exhaust the stack)."""
    todo = [(value, where, "")]
    while todo:
        node, path, key = todo.pop()
        if isinstance(node, Mapping):
            todo.extend((v, f"{path}.{k}", str(k)) for k, v in node.items() if str(k) not in skip)
        elif isinstance(node, list):
            todo.extend((v, f"{path}[{i}]", key) for i, v in enumerate(node))
        elif isinstance(node, int) and not isinstance(node, bool):
            yield path, key, node


def _show(value: int) -> str:
    return str(value) if abs(value) < 10**24 else f"{str(value)[:12]}... ({len(str(abs(value)))} digits)"


def check_declared_sizes(manifest: Mapping[str, Any], state: Mapping[str, torch.Tensor], path: object) -> None:
    """Refuse a manifest whose architecture or schema declares more than its weights can hold.

    Every integer of ``architecture`` and ``schema`` is a size (but those under :data:`NOT_SIZES`
    and under keys no config types as an integer): a layer count (``*layers``, ``correlation``,
    ...) may not exceed the layers of the longest indexed list in the weights, any other size the values of the
    largest stored tensor. Types and signs are left to the config parser.

    Raises:
        ArtifactError: naming the field, the declared value and what the weights allow.
    """
    largest, depth = weight_bounds(state)
    skip = _not_sizes()
    for section in ("architecture", "schema"):
        for where, key, value in _declared(manifest.get(section), section, skip):
            if _is_layer_count(key) and value > depth:
                allowed = f"the weights hold at most {depth} layers of one indexed list"
            elif value > max(largest, 1):
                allowed = f"no stored tensor holds more than {largest} values"
            else:
                continue
            raise ArtifactError(
                f"{path}: the manifest's architecture does not fit its weights: {where} is {_show(value)}, but {allowed}"
            )

"""Conformance subjects: the tiny MLIP built around an encoder (or a variant), its tolerances.

Test settings (extra ``Architecture`` keys, checks skipped by design) live with the tests that
need them (:func:`set_defaults`, :func:`register_variant`, the mixin's fixtures), never on the
encoder classes.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pytest
import torch

from hydragnn.models import ENCODERS, build_model

from .graphs import SCHEMA

if TYPE_CHECKING:
    from hydragnn.data import Schema

    from ..committee import Committee
    from ..model import HydraModel

CUTOFF = 4.0
REGISTERED_ENCODERS: tuple[str, ...] = tuple(sorted(n for n in ENCODERS if ENCODERS[n].optional_dependency is None))
"""The core registry as ``hydragnn.models`` fills it when this module is first imported (test
modules that import encoder modules directly do not change it). Encoders with an
``optional_dependency`` (UMA, AllScAIP: the ``fairchem`` extra) are tested from their own module."""
EXTRA_MODULES = {"fairchem": "fairchem.core"}
"""A ``hydra-models`` extra (an encoder's ``optional_dependency``) -> the module it provides."""


def missing_extra(mpnn_type: str) -> str | None:
    """Why ``mpnn_type`` cannot be built in this environment (its extra's module cannot be found:
    not installed, or only an empty namespace left by an uninstall), or None when it can. Tests
    over every encoder skip with this reason instead of failing where the extra is absent."""
    extra: str | None = ENCODERS[mpnn_type].optional_dependency
    if extra is None:
        return None
    module: str = EXTRA_MODULES.get(extra) or extra
    try:
        found = importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # the parent package is missing
        found = False
    return None if found else f'{mpnn_type} needs {module}: pip install "hydra-models[{extra}]"'


SCALAR_OUTPUTS = ("energy", "gap", "atomic_energy", "charge")

VARIANTS: dict[str, dict] = {}
"""Conformance subjects beyond the plain encoders: id -> ``Architecture`` keys (with
``mpnn_type``, which may be None for a standalone EquivariantTransformer). Add with
:func:`register_variant`; the checks accept these ids wherever they accept an encoder name."""

_DEFAULTS: dict[str, tuple[dict, dict[str, str]]] = {}


@dataclass(frozen=True)
class Tolerances:
    """``(rtol, atol)`` pairs of the checks (float32 models unless noted).

    Attributes:
        invariance: permutation, rotation / translation, supercell (outputs and forces).
        batching: batch == single, padded == unpadded.
        finite_differences: float64 forces against central differences (stress uses ``atol / 10``).
        checkpointing: outputs with and without activation checkpointing (gradients: x10).
        execution: outputs of an execution profile against the reference (gradients: x10): float32
            rounding of another order of operations (MACE's dense products: a few 1e-7 eV/Å).
        fp64, bf16: relative deviation of float64 / bfloat16 outputs from float32.
    """

    invariance: tuple[float, float] = (1e-4, 1e-5)
    batching: tuple[float, float] = (1e-5, 1e-6)
    finite_differences: tuple[float, float] = (1e-5, 1e-7)
    checkpointing: tuple[float, float] = (1e-6, 1e-7)
    execution: tuple[float, float] = (1e-5, 1e-6)
    fp64: float = 1e-4
    bf16: float = 0.1


@dataclass(frozen=True)
class Subject:
    """What the checks test: a tiny MLIP ``Architecture`` around one encoder (or variant).

    Attributes:
        name: the encoder or variant id (used in messages).
        arch: the complete ``Architecture`` section the model is built from.
        skips: check -> reason, for checks the subject cannot pass by design.
        tol: the tolerances.
    """

    name: str
    arch: Mapping
    skips: Mapping[str, str] = field(default_factory=dict)
    tol: Tolerances = field(default_factory=Tolerances)

    def build(self, seed: int = 0, schema: Schema = SCHEMA, **overrides: Any) -> HydraModel | Committee:
        """A seeded model in eval mode (``overrides``: extra ``Architecture`` keys)."""
        torch.manual_seed(seed)
        return build_model({**self.arch, **overrides}, schema).eval()

    @property
    def equivariant(self) -> bool:
        """Whether the model's encoder returns vector features."""
        if self.arch.get("global_attn_engine") == "EquivariantTransformer":
            return True
        return ENCODERS[self.arch["mpnn_type"]].equivariant

    def skip_by_design(self, check: str) -> None:
        """``pytest.skip`` with the reason when ``check`` is in :attr:`skips`."""
        if self.skips.get(check):
            pytest.skip(f"{self.name}: {self.skips[check]}")


def register_variant(name: str, **arch: Any) -> str:
    """Add a conformance subject ``name`` (e.g. ``"SchNet+GPS-performer"``) and return it."""
    if name in ENCODERS or (name in VARIANTS and VARIANTS[name] != arch):
        raise ValueError(f"conformance variant {name!r} is already taken")
    VARIANTS[name] = dict(arch)
    return name


def set_defaults(encoder: str, arch: Mapping | None = None, skips: Mapping[str, str] | None = None) -> None:
    """Extra ``Architecture`` keys and by-design skips used whenever encoder ``encoder`` is tested
    by name (its variants included): test settings live with the tests, not on the encoder."""
    _DEFAULTS[encoder] = (dict(arch or {}), dict(skips or {}))


def small_arch(name: str, **overrides: Any) -> dict[str, Any]:
    """A tiny MLIP ``Architecture`` for encoder (or variant) ``name``, with its :func:`set_defaults`."""
    variant = VARIANTS.get(name, {"mpnn_type": name})
    mpnn_type = variant["mpnn_type"]
    arch = {
        "mpnn_type": mpnn_type,
        "hidden_dim": 16,
        "num_conv_layers": 2,
        "radius": CUTOFF,
        "num_radial": 8,
        "enable_interatomic_potential": True,
        "output_heads": {"graph": {"num_sharedlayers": 1, "num_headlayers": 1}, "node": {"num_headlayers": 1}},
    }
    arch.update(_DEFAULTS.get(mpnn_type, ({}, {}))[0])
    arch.update(variant)
    arch.update(overrides)
    return arch


def subject(
    name: str, arch: Mapping | None = None, skips: Mapping[str, str] | None = None, tol: Tolerances | None = None
) -> Subject:
    """The :class:`Subject` of encoder or variant ``name``: :func:`small_arch` + ``arch``, the
    :func:`set_defaults` skips + ``skips``."""
    mpnn_type = VARIANTS.get(name, {"mpnn_type": name})["mpnn_type"]
    all_skips = {**_DEFAULTS.get(mpnn_type, ({}, {}))[1], **(skips or {})}
    return Subject(name, small_arch(name, **(arch or {})), all_skips, tol or Tolerances())


def _subject(s: Subject | str) -> Subject:
    return s if isinstance(s, Subject) else subject(s)


def build(name: str, seed: int = 0, schema: Schema = SCHEMA, **overrides: Any) -> HydraModel | Committee:
    """A seeded tiny model of encoder or variant ``name`` in eval mode."""
    return subject(name).build(seed, schema, **overrides)


def is_equivariant(name: str) -> bool:
    """Whether subject ``name`` returns vector features (encoder class or variant)."""
    return subject(name).equivariant

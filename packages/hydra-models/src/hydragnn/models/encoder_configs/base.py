"""The encoder config base class and the config registry (``mpnn_type`` -> keys and capabilities).

Torch-free: a config is parsed and validated (``hydragnn-train`` reports a typo) before any
encoder module, hence torch, is imported. Invariant: every name here is a registered encoder
whose ``Config`` is the registered class and whose class attributes equal the recorded
capabilities (:func:`hydragnn.models.encoders.register_encoder` checks it when the encoder
registers, and registers the config of an encoder defined elsewhere).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from hydragnn.data.config_parse import parse_dataclass
from hydragnn.data.errors import did_you_mean

from ..errors import ModelConfigError

ROOT = "NeuralNetwork.Architecture"

_ConfigT = TypeVar("_ConfigT", bound="EncoderConfig")


@dataclass(frozen=True)
class EncoderConfig:
    """Base of the per-encoder config dataclasses (encoder-specific keys of ``Architecture``).

    Subclasses declare typed fields with defaults; :meth:`from_dict` rejects unknown keys and
    ill-typed values with a :class:`ModelConfigError` naming ``NeuralNetwork.Architecture.<key>``.
    """

    @classmethod
    def from_dict(cls, values: Mapping[str, Any], where: str = ROOT) -> EncoderConfig:
        """Parse the encoder keys with :func:`~hydragnn.data.config_parse.parse_dataclass`
        (messages spell the expected type as the field's annotation, e.g. ``int|None``)."""
        return parse_dataclass(cls, values, where, ModelConfigError, annotation_text=True)


@dataclass(frozen=True)
class EncoderEntry:
    """An encoder as config checks see it, without importing it.

    Attributes:
        name: the ``mpnn_type``.
        config: its :class:`EncoderConfig` subclass (the encoder's ``Config``).
        supports_layer_mixing: the encoder class attribute of that name (GPS needs it).
    """

    name: str
    config: type[EncoderConfig]
    supports_layer_mixing: bool = True


ENCODER_CONFIGS: dict[str, EncoderEntry] = {}
"""The config registry: ``mpnn_type`` -> :class:`EncoderEntry` (the same names as ``ENCODERS``)."""


def register_encoder_config(
    name: str, *, supports_layer_mixing: bool = True
) -> Callable[[type[_ConfigT]], type[_ConfigT]]:
    """Class decorator recording a config class as encoder ``name``'s keys, with its capabilities."""

    def deco(cls: type[_ConfigT]) -> type[_ConfigT]:
        add_encoder_config(EncoderEntry(name, cls, supports_layer_mixing))
        return cls

    return deco


def add_encoder_config(entry: EncoderEntry) -> None:
    """Add ``entry``; a name given twice is a ``ValueError``."""
    if entry.name in ENCODER_CONFIGS:
        raise ValueError(f"encoder config {entry.name!r} registered twice")
    ENCODER_CONFIGS[entry.name] = entry


def unknown_encoder(name: object, known: Mapping[str, Any]) -> ModelConfigError:
    """The error for an ``mpnn_type`` that is not registered, with the nearest name and the known ones."""
    return ModelConfigError(
        f"{ROOT}.mpnn_type: unknown encoder {name!r}{did_you_mean([name], known)}; known: {sorted(known)}"
    )


def check_at_least(key: str, value: int, minimum: int = 1) -> None:
    """Raise :class:`ModelConfigError` naming ``NeuralNetwork.Architecture.<key>`` if ``value < minimum``."""
    if value < minimum:
        raise ModelConfigError(f"{ROOT}.{key}: expected an int >= {minimum}, found {value!r}")


def check_positive(key: str, value: int | float | None, allow_none: bool = True) -> None:
    """Raise :class:`ModelConfigError` naming ``NeuralNetwork.Architecture.<key>`` unless ``value > 0``
    (or ``None`` where ``allow_none``)."""
    if value is None and allow_none:
        return
    if value is None or value <= 0:
        raise ModelConfigError(f"{ROOT}.{key}: expected a positive number, found {value!r}")


def encoder_entry(name: str) -> EncoderEntry:
    """Look up ``mpnn_type``; unknown names give a :class:`ModelConfigError` listing the known ones."""
    try:
        return ENCODER_CONFIGS[name]
    except KeyError:
        raise unknown_encoder(name, ENCODER_CONFIGS) from None

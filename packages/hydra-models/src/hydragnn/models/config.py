"""``ModelConfig``: the JSON ``NeuralNetwork.Architecture`` section, parsed and validated.

Common keys (every encoder) are fields of :class:`ModelConfig` or of its groups
(:mod:`hydragnn.models.config_groups`: ``mlip``, ``attention``, ``conditioning``, ``loss``), whose
keys stay flat in the JSON; every remaining key belongs to the chosen encoder and is validated by
its config class (the encoder's ``Config``, registered in :mod:`hydragnn.models.encoder_configs`).
Parsing imports no torch and no encoder. Errors are :class:`~hydragnn.models.errors.ModelConfigError` naming
``NeuralNetwork.Architecture.<key>``.

Example::

    {"mpnn_type": "SchNet", "hidden_dim": 64, "num_conv_layers": 3, "radius": 5.0,
     "enable_interatomic_potential": true,    # <- config.mlip.enabled
     "output_heads": {"graph": {"num_sharedlayers": 1, "num_headlayers": 2},
                      "node": {"num_headlayers": 2, "dim_headlayers": [64, 32], "type": "mlp"}},
     "task_weights": [1.0, 0.0, 10.0], "loss_function_type": "mse",   # <- config.loss
     "num_filters": 64}                       # <- a SchNet key
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from hydragnn.data.config_parse import parse_fields, parse_value, section_keys, unknown_keys

from .config_groups import (
    CONDITIONING_MODES,
    ENERGY_LOSSES,
    GLOBAL_ATTN_ENGINES,
    GLOBAL_ATTN_TYPES,
    LOSS_TYPES,
    ROLE_WEIGHTS,
    ConditioningConfig,
    GlobalAttentionConfig,
    LossConfig,
    MLIPConfig,
    parse_output_scaling,
)
from .config_names import ACTIVATION_NAMES, POOLING_NAMES, PRECISIONS
from .encoder_configs import EncoderConfig, EncoderEntry, encoder_entry
from .errors import ModelConfigError
from .heads_config import HeadsConfig

if TYPE_CHECKING:
    import torch

__all__ = [
    "COMMON_KEYS",
    "CONDITIONING_MODES",
    "ENERGY_LOSSES",
    "GLOBAL_ATTN_ENGINES",
    "GLOBAL_ATTN_TYPES",
    "LOSS_TYPES",
    "PRECISIONS",
    "ROLE_WEIGHTS",
    "ConditioningConfig",
    "GlobalAttentionConfig",
    "HeadsConfig",
    "LossConfig",
    "MLIPConfig",
    "ModelConfig",
]

ROOT = "NeuralNetwork.Architecture"

# A first node input named like one of hydra-data's SPECIES_INPUT_NAMES makes num_species default to 119.
_ALIASES = {"activation_function": "activation"}


_POSITIVE = {"gt": 0}
_NON_NEGATIVE = {"min": 0}
_CUSTOM = frozenset({"mpnn_type", "encoder", "output_heads", "raw"})
"""Fields parsed by hand (the encoder's class, shapes that depend on other keys); the rest by annotation."""
_FLAT = {"flat": True}


@dataclass(frozen=True)
class ModelConfig:
    """A validated ``Architecture`` section.

    Attributes (JSON keys of the same name, defaults in brackets):
        mpnn_type: registry name of the encoder (required; null only for a standalone
            ``EquivariantTransformer``).
        encoder: the encoder's own config (every non-common key).
        hidden_dim [64], num_conv_layers [3]: width and depth of the encoder.
        radius [5.0]: cutoff in Å; max_neighbours [null]: cap for dynamic graphs.
        num_radial [20]: size of radial bases.
        num_species [auto]: size of the species embedding (0: a Linear on x). Auto is 119 when
            the first node input is an atomic number (``atomic_number``, ``Z``, ...), else 0.
        activation ["silu"], graph_pooling ["mean"]: head activation and pooling.
        precision ["fp32"]: ``fp32``, ``bf16`` or ``fp64``.
        conv_checkpointing [false]: activation checkpointing per conv layer.
        committee [1]: number of independently initialised members trained side by side and
            served as their mean (:class:`~hydragnn.models.committee.Committee`); K members cost
            K times the compute. A hydra-train config may say ``"auto"`` (the MLIP default): the
            trainer picks the count its time budget buys and records it.
        output_heads: :class:`HeadsConfig`.
        mlip: :class:`~hydragnn.models.config_groups.MLIPConfig` (``enable_interatomic_potential``,
            output names, reference energies, scale-shift, ``energy_heads``).
        attention: :class:`~hydragnn.models.config_groups.GlobalAttentionConfig`
            (``global_attn_*``, ``pe_dim``).
        conditioning: :class:`~hydragnn.models.config_groups.ConditioningConfig`
            (``use_graph_attr_conditioning``, ``graph_attr_conditioning_mode``).
        loss: :class:`~hydragnn.models.config_groups.LossConfig` (``loss_function_type``,
            ``huber_delta``, ``task_weights``, the MLIP role weights and ``energy_loss``).
        output_scaling [{}]: ``{output name: {"shift": [...], "scale": [...]}}``: that head predicts
            ``shift + scale * network(h)`` per column and its loss compares ``(prediction -
            target) / scale`` (the target normalised; hydra-train's ``Training.normalize_outputs``
            fills it from the training split). Not for an interatomic potential's energy, forces
            or stress (``energy_shift`` / ``energy_scale`` are theirs).
        raw: the section as given, flat (stored in artifacts).
    """

    mpnn_type: str | None
    encoder: EncoderConfig
    output_heads: HeadsConfig
    hidden_dim: int = field(default=64, metadata=_POSITIVE)
    num_conv_layers: int = field(default=3, metadata=_POSITIVE)
    radius: float = field(default=5.0, metadata=_POSITIVE)
    max_neighbours: int | None = field(default=None, metadata=_POSITIVE)
    num_radial: int = field(default=20, metadata=_POSITIVE)
    num_species: int | None = field(default=None, metadata=_NON_NEGATIVE)
    activation: str = field(default="silu", metadata={"choices": ACTIVATION_NAMES})
    graph_pooling: str = field(default="mean", metadata={"choices": POOLING_NAMES})
    precision: str = field(default="fp32", metadata={"choices": PRECISIONS})
    conv_checkpointing: bool = False
    committee: int = field(default=1, metadata={"min": 1, "max": 64})
    mlip: MLIPConfig = field(default_factory=MLIPConfig, metadata=_FLAT)
    attention: GlobalAttentionConfig = field(default_factory=GlobalAttentionConfig, metadata=_FLAT)
    conditioning: ConditioningConfig = field(default_factory=ConditioningConfig, metadata=_FLAT)
    loss: LossConfig = field(default_factory=LossConfig, metadata=_FLAT)
    output_scaling: tuple[tuple[str, tuple[float, ...], tuple[float, ...]], ...] = field(
        default=(), metadata={"parse": parse_output_scaling}
    )
    raw: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @property
    def dtype(self) -> torch.dtype:
        """The torch dtype of ``precision`` (imports torch: parsing a config does not)."""
        import torch

        return getattr(torch, PRECISIONS[self.precision])

    @classmethod
    def from_dict(cls, arch: Mapping[str, Any]) -> ModelConfig:
        """Parse and validate an ``Architecture`` section.

        Raises:
            ModelConfigError: naming ``NeuralNetwork.Architecture.<key>`` for a missing
                ``mpnn_type``, an unknown key, an ill-typed value or an impossible value.
        """
        if not isinstance(arch, Mapping):
            raise ModelConfigError(f"{ROOT}: expected an object, found {type(arch).__name__}")
        raw = copy.deepcopy(dict(arch))
        values = dict(arch)
        for old, new in _ALIASES.items():
            if old in values:
                if new in values:
                    raise ModelConfigError(f"{ROOT}: give either {old!r} or {new!r}, not both")
                values[new] = values.pop(old)
        kwargs = parse_fields(cls, values, ROOT, ModelConfigError, skip=_CUSTOM)
        standalone = kwargs["attention"].engine == "EquivariantTransformer" and values.get("mpnn_type") is None
        if "mpnn_type" not in values and not standalone:
            raise ModelConfigError(
                f"{ROOT}.mpnn_type: required (the encoder name; it may be null only with "
                'global_attn_engine "EquivariantTransformer")'
            )
        mpnn_type = None if standalone else parse_value(values["mpnn_type"], str, f"{ROOT}.mpnn_type", ModelConfigError)
        entry = None if mpnn_type is None else encoder_entry(mpnn_type)
        hidden = kwargs.get("hidden_dim", cls.hidden_dim)
        _check_groups(kwargs["mlip"], kwargs["attention"], kwargs["loss"], hidden, entry)
        heads = HeadsConfig.from_dict(values.get("output_heads"), hidden)

        rest = {k: v for k, v in values.items() if k not in COMMON_KEYS}
        config_cls = EncoderConfig if entry is None else entry.config
        encoder_fields = {f.name for f in dataclasses.fields(config_cls)}
        unknown = sorted(set(rest) - encoder_fields)
        if unknown:
            raise ModelConfigError(
                f"{unknown_keys(ROOT, unknown, COMMON_KEYS | encoder_fields)}; "
                f"neither a common key ({sorted(COMMON_KEYS)}) "
                f"nor a {mpnn_type or 'standalone EquivariantTransformer'} key ({sorted(encoder_fields)})"
            )
        encoder = config_cls.from_dict(rest, ROOT)
        return cls(mpnn_type=mpnn_type, encoder=encoder, output_heads=heads, raw=raw, **kwargs)


COMMON_KEYS: frozenset[str] = frozenset(section_keys(ModelConfig) - {"encoder", "raw"})
"""Every key of ``Architecture`` that is not encoder-specific (the JSON keys of :class:`ModelConfig`
and of its flat groups)."""


def _check_groups(
    mlip: MLIPConfig, attention: GlobalAttentionConfig, loss: LossConfig, hidden: int, entry: EncoderEntry | None
) -> None:
    """Rules between the groups, ``hidden_dim`` and the encoder's capabilities (errors name the key)."""
    engine, heads = attention.engine, attention.heads
    if engine is not None and heads > 0 and hidden % heads:
        raise ModelConfigError(
            f"{ROOT}.global_attn_heads: hidden_dim ({hidden}) must be a multiple of global_attn_heads ({heads})"
        )
    if engine == "GPS" and entry is not None and not entry.supports_layer_mixing:
        raise ModelConfigError(
            f"{ROOT}.global_attn_engine: GPS mixes attention into every conv layer's node features; "
            f"{entry.name} has no per-layer node state (use EquivariantTransformer instead)"
        )
    if mlip.energy_layer_readout and (entry is None or not entry.supports_layer_mixing):
        raise ModelConfigError(
            f"{ROOT}.energy_layer_readout: reads every conv layer's node features; "
            f"{entry.name if entry is not None else 'a standalone EquivariantTransformer'} has no per-layer node state"
        )
    if attention.pe_dim and mlip.dynamic_graph:
        raise ModelConfigError(
            f"{ROOT}.pe_dim: positional encodings come from the prepared dataset's edges; a dynamic_graph "
            "model builds other edges in forward (set dynamic_graph false or pe_dim 0)"
        )
    for key in ROLE_WEIGHTS:
        if getattr(loss, key) is not None and not mlip.enabled:
            raise ModelConfigError(
                f"{ROOT}.{key}: only for interatomic potentials (enable_interatomic_potential); use task_weights"
            )

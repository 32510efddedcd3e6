"""``ModelConfig``: the JSON ``NeuralNetwork.Architecture`` section, parsed and validated.

Common keys (every encoder) are fields of :class:`ModelConfig`; every remaining key belongs to
the chosen encoder and is validated by its ``Config.from_dict``. Errors are
:class:`~hydragnn.models.errors.ModelConfigError` naming ``NeuralNetwork.Architecture.<path>``.

Example::

    {"mpnn_type": "SchNet", "hidden_dim": 64, "num_conv_layers": 3, "radius": 5.0,
     "enable_interatomic_potential": true,
     "output_heads": {"graph": {"num_sharedlayers": 1, "num_headlayers": 2},
                      "node": {"num_headlayers": 2, "dim_headlayers": [64, 32], "type": "mlp"}},
     "task_weights": [1.0, 0.0, 10.0], "loss_function_type": "mse",
     "num_filters": 64}                       # <- a SchNet key
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from hydragnn.data import DataError
from hydragnn.data.atomic_references import parse_reference_energies

from .config_parse import parse_fields, parse_value
from .encoders import EncoderConfig, get_encoder
from .energy_heads import EnergyHeadSpec, parse_energy_heads
from .errors import ModelConfigError
from .heads_config import HeadsConfig
from .nn.activations import ACTIVATIONS
from .nn.scatter import POOLINGS

ROOT = "NeuralNetwork.Architecture"

PRECISIONS: dict[str, torch.dtype] = {
    "fp32": torch.float32,
    "float32": torch.float32,
    "fp64": torch.float64,
    "float64": torch.float64,
    "bf16": torch.bfloat16,
    "bfloat16": torch.bfloat16,
}
"""``precision`` names and their dtypes."""

LOSS_TYPES: tuple[str, ...] = ("mse", "mae", "huber", "smooth_l1")
ENERGY_LOSSES: tuple[str, ...] = ("per_atom", "total")
ROLE_WEIGHTS: dict[str, str] = {"energy_weight": "energy", "forces_weight": "forces", "stress_weight": "stress"}
"""MLIP loss-weight keys and the role whose output they weigh."""
GLOBAL_ATTN_ENGINES: tuple[str, ...] = ("GPS", "EquivariantTransformer")
GLOBAL_ATTN_TYPES: tuple[str, ...] = ("multihead", "performer")
CONDITIONING_MODES: tuple[str, ...] = ("concat_node", "film", "fuse_pool")
# A first node input named like one of hydra-data's SPECIES_INPUT_NAMES makes num_species default to 119.
_ALIASES = {"activation_function": "activation"}


_POSITIVE = {"gt": 0}
_NON_NEGATIVE = {"min": 0}
_CUSTOM = frozenset({"mpnn_type", "encoder", "output_heads", "task_weights", "reference_energies", "energy_heads", "raw"})
"""Fields parsed by hand (the encoder's class, shapes that depend on other keys); the rest by annotation."""


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
        enable_interatomic_potential [false]: energy as a sum of per-atom energies, forces
            ``-dE/dpos``, stress from a cell strain.
        compute_grad_energy [true]: MLIP forces by autograd (false: forces are a direct head).
        dynamic_graph [false]: MLIP builds its edges from ``pos`` inside ``forward``.
        energy_name ["energy"], forces_name ["forces"], atomic_energy_name ["atomic_energy"],
            stress_name ["stress"]: output names the MLIP fills.
        reference_energies [null]: per-species reference energy (eV) keyed by symbol or atomic
            number (``{"Cu": -3.5, "79": -3.0}``), or a list indexed by atomic number;
            trainable_reference_energies [false]. (hydra-train also takes ``"average"`` and
            ``"isolated_atoms"`` and fits the values from the data.)
        energy_shift [0.0], energy_scale [1.0]: MLIP only, each atom's energy is
            ``reference[Z] + energy_shift + energy_scale * network(h)`` (eV): the shift is the mean
            interaction energy per atom and the scale its natural size, so the network works on
            numbers of order one (MACE's scale-shift; hydra-train fills both from the training
            data when they are left out).
        energy_heads [null: one]: MLIP only, several energy readouts on the one encoder, one
            per data source, each with its own reference energies, shift and scale
            (:mod:`hydragnn.models.energy_heads`); a structure picks its head by its ``head``
            attribute.
        output_heads: :class:`HeadsConfig`.
        task_weights [1 each]: list (schema output order) or ``{name: weight}``.
        energy_weight, forces_weight, stress_weight [null: 1]: MLIP only, the weights of the
            energy, forces and stress outputs (MACE's names); not together with a
            ``task_weights`` entry for the same output.
        energy_loss ["per_atom"]: MLIP only, the energy term compares ``E / N`` (eV/atom, so
            structures of every size weigh alike) or the ``total`` energy.
        loss_function_type ["mse"]: mse, mae, huber, smooth_l1; huber_delta [1.0].
        global_attn_engine [null]: ``GPS`` (global attention mixed into every conv layer of
            the encoder) or ``EquivariantTransformer`` (all-to-all equivariant attention layers
            after the encoder, or alone when ``mpnn_type`` is null).
        global_attn_type ["multihead"]: GPS attention, ``multihead`` (exact softmax, per graph)
            or ``performer`` (random features, linear in the atoms per graph).
        global_attn_heads [4]: attention heads; ``hidden_dim`` must be a multiple of it.
        global_attn_layers [num_conv_layers]: EquivariantTransformer depth.
        global_attn_features [64]: performer random features per head.
        pe_dim [0]: GPS positional encodings: ``pe_dim`` Laplacian eigenvectors and ``pe_dim``
            random-walk return probabilities per node, computed when the data is prepared.
        use_graph_attr_conditioning [false]: condition on the schema's graph inputs, mode
            graph_attr_conditioning_mode ["concat_node"]: ``concat_node``, ``film``, ``fuse_pool``.
        raw: the section as given (stored in artifacts).
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
    activation: str = field(default="silu", metadata={"choices": ACTIVATIONS})
    graph_pooling: str = field(default="mean", metadata={"choices": POOLINGS})
    precision: str = field(default="fp32", metadata={"choices": PRECISIONS})
    conv_checkpointing: bool = False
    enable_interatomic_potential: bool = False
    compute_grad_energy: bool = True
    dynamic_graph: bool = False
    energy_name: str = "energy"
    forces_name: str = "forces"
    atomic_energy_name: str = "atomic_energy"
    stress_name: str = "stress"
    reference_energies: tuple[tuple[int, float], ...] | None = None
    trainable_reference_energies: bool = False
    energy_shift: float = 0.0
    energy_scale: float = field(default=1.0, metadata=_POSITIVE)
    energy_heads: tuple[EnergyHeadSpec, ...] | None = None
    task_weights: tuple[float, ...] | tuple[tuple[str, float], ...] | None = None
    loss_function_type: str = field(default="mse", metadata={"choices": LOSS_TYPES})
    huber_delta: float = field(default=1.0, metadata=_POSITIVE)
    energy_loss: str = field(default="per_atom", metadata={"choices": ENERGY_LOSSES})
    energy_weight: float | None = field(default=None, metadata=_NON_NEGATIVE)
    forces_weight: float | None = field(default=None, metadata=_NON_NEGATIVE)
    stress_weight: float | None = field(default=None, metadata=_NON_NEGATIVE)
    global_attn_engine: str | None = field(default=None, metadata={"choices": GLOBAL_ATTN_ENGINES})
    global_attn_type: str = field(default="multihead", metadata={"choices": GLOBAL_ATTN_TYPES})
    global_attn_heads: int = field(default=4, metadata=_POSITIVE)
    global_attn_layers: int | None = field(default=None, metadata=_POSITIVE)
    global_attn_features: int = field(default=64, metadata=_POSITIVE)
    pe_dim: int = field(default=0, metadata=_NON_NEGATIVE)
    use_graph_attr_conditioning: bool = False
    graph_attr_conditioning_mode: str = field(default="concat_node", metadata={"choices": CONDITIONING_MODES})
    raw: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @property
    def dtype(self) -> torch.dtype:
        """The torch dtype of ``precision``."""
        return PRECISIONS[self.precision]

    def head_specs(self) -> tuple[EnergyHeadSpec, ...]:
        """Every energy head with its reference energies, shift and scale filled from the
        Architecture's where it has none of its own (one unnamed head without ``energy_heads``)."""
        heads = self.energy_heads or (EnergyHeadSpec(name="default"),)
        return tuple(
            EnergyHeadSpec(
                name=h.name,
                reference_energies=h.reference_energies
                if h.reference_energies is not None
                else self.reference_energies,
                energy_shift=h.energy_shift if h.energy_shift is not None else self.energy_shift,
                energy_scale=h.energy_scale if h.energy_scale is not None else self.energy_scale,
            )
            for h in heads
        )

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
        engine = kwargs.get("global_attn_engine")
        standalone = engine == "EquivariantTransformer" and values.get("mpnn_type") is None
        if "mpnn_type" not in values and not standalone:
            raise ModelConfigError(
                f"{ROOT}.mpnn_type: required (the encoder name; it may be null only with "
                'global_attn_engine "EquivariantTransformer")'
            )
        mpnn_type = None if standalone else parse_value(values["mpnn_type"], str, f"{ROOT}.mpnn_type", ModelConfigError)
        encoder_cls = None if mpnn_type is None else get_encoder(mpnn_type)
        _check_global_attention(kwargs, encoder_cls)
        for key in ROLE_WEIGHTS:
            if kwargs.get(key) is not None and not kwargs.get("enable_interatomic_potential", False):
                raise ModelConfigError(
                    f"{ROOT}.{key}: only for interatomic potentials (enable_interatomic_potential); use task_weights"
                )
        hidden = kwargs.get("hidden_dim", cls.hidden_dim)
        heads = HeadsConfig.from_dict(values.get("output_heads"), hidden)
        if "task_weights" in values:
            kwargs["task_weights"] = _task_weights(values["task_weights"])
        if "reference_energies" in values:
            kwargs["reference_energies"] = _reference_energies(values["reference_energies"])
        if values.get("energy_heads") is not None:
            if not kwargs.get("enable_interatomic_potential", False):
                raise ModelConfigError(
                    f"{ROOT}.energy_heads: only for interatomic potentials (enable_interatomic_potential)"
                )
            kwargs["energy_heads"] = parse_energy_heads(
                values["energy_heads"], f"{ROOT}.energy_heads", _reference_energies
            )

        rest = {k: v for k, v in values.items() if k not in COMMON_KEYS}
        config_cls = EncoderConfig if encoder_cls is None else encoder_cls.Config
        encoder_fields = {f.name for f in dataclasses.fields(config_cls)}
        unknown = sorted(set(rest) - encoder_fields)
        if unknown:
            raise ModelConfigError(
                f"{ROOT}: unknown key(s) {unknown}: neither a common key ({sorted(COMMON_KEYS)}) "
                f"nor a {mpnn_type or 'standalone EquivariantTransformer'} key ({sorted(encoder_fields)})"
            )
        encoder = config_cls.from_dict(rest, ROOT)
        return cls(mpnn_type=mpnn_type, encoder=encoder, output_heads=heads, raw=raw, **kwargs)


COMMON_KEYS: frozenset[str] = frozenset(f.name for f in dataclasses.fields(ModelConfig)) - {"encoder", "raw"}
"""Every key of ``Architecture`` that is not encoder-specific (the fields of :class:`ModelConfig`)."""


def _check_global_attention(kwargs: dict[str, Any], encoder_cls: type | None) -> None:
    """Rules between the global-attention and conditioning keys (errors name the key)."""
    engine = kwargs.get("global_attn_engine")
    heads = kwargs.get("global_attn_heads", ModelConfig.global_attn_heads)
    hidden = kwargs.get("hidden_dim", ModelConfig.hidden_dim)
    if engine is not None and heads > 0 and hidden % heads:
        raise ModelConfigError(
            f"{ROOT}.global_attn_heads: hidden_dim ({hidden}) must be a multiple of global_attn_heads ({heads})"
        )
    if engine == "GPS" and encoder_cls is not None and not encoder_cls.supports_layer_mixing:
        raise ModelConfigError(
            f"{ROOT}.global_attn_engine: GPS mixes attention into every conv layer's node features; "
            f"{encoder_cls.__name__} has no per-layer node state (use EquivariantTransformer instead)"
        )
    if engine != "GPS":
        for key, default in (("global_attn_type", "multihead"), ("pe_dim", 0)):
            if kwargs.get(key, default) != default:
                raise ModelConfigError(
                    f'{ROOT}.{key}: only used with global_attn_engine "GPS" (found engine {engine!r})'
                )
    if kwargs.get("pe_dim") and kwargs.get("dynamic_graph"):
        raise ModelConfigError(
            f"{ROOT}.pe_dim: positional encodings come from the prepared dataset's edges; a dynamic_graph "
            "model builds other edges in forward (set dynamic_graph false or pe_dim 0)"
        )
    if engine != "EquivariantTransformer" and kwargs.get("global_attn_layers") is not None:
        raise ModelConfigError(f'{ROOT}.global_attn_layers: only used with global_attn_engine "EquivariantTransformer"')


def _float(value: Any, where: str) -> float:
    return parse_value(value, float, where, ModelConfigError)


def _task_weights(values: Any) -> tuple:
    where = f"{ROOT}.task_weights"
    if isinstance(values, Mapping):
        out = tuple((parse_value(k, str, where, ModelConfigError), _float(v, f"{where}.{k}")) for k, v in values.items())
        weights = [w for _, w in out]
    elif isinstance(values, list):
        out = tuple(_float(v, f"{where}[{i}]") for i, v in enumerate(values))
        weights = list(out)
    else:
        raise ModelConfigError(
            f"{where}: expected a list (one weight per output) or an object {{name: weight}}, found {type(values).__name__}"
        )
    if any(w < 0 for w in weights):
        raise ModelConfigError(f"{where}: weights must be >= 0, found {weights}")
    return out


def _reference_energies(values: Any, where: str = f"{ROOT}.reference_energies") -> tuple[tuple[int, float], ...] | None:
    if values is None:
        return None
    if isinstance(values, list):
        return tuple((z, _float(v, f"{where}[{z}]")) for z, v in enumerate(values))
    if not isinstance(values, Mapping):
        raise ModelConfigError(
            f"{where}: expected an object {{symbol or atomic number: energy}} or a list indexed by atomic number, "
            f"found {type(values).__name__}"
        )
    for key, value in values.items():
        _float(value, f"{where}.{key}")
    try:
        table = parse_reference_energies(values, where)
    except DataError as exc:
        raise ModelConfigError(
            f'{exc} (keys are chemical symbols such as "Cu" or atomic numbers such as "29")'
        ) from None
    return tuple(table.items())

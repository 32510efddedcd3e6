"""The groups of :class:`~hydragnn.models.config.ModelConfig`: MLIP, global attention,
conditioning and loss keys.

Each group is a frozen dataclass held by a ``flat`` field of ``ModelConfig``: its fields name
their keys in the flat ``NeuralNetwork.Architecture`` section (``metadata["json"]`` where the
attribute is shorter, e.g. ``attention.engine`` is ``global_attn_engine``), so the JSON keeps
its form while code reads ``config.mlip.energy_name``. A rule within one group is checked in its
``__post_init__``; rules between groups, or with ``hidden_dim`` or the encoder, in
``ModelConfig.from_dict``. Errors are ``ModelConfigError`` naming
``NeuralNetwork.Architecture.<key>``.

The MLIP loss keys (``energy_weight``, ``forces_weight``, ``stress_weight``, ``energy_loss``)
are in :class:`LossConfig`, with every other key the loss reads; that they are for interatomic
potentials only is a rule between groups.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from hydragnn.data import DataError
from hydragnn.data.atomic_references import parse_reference_energies
from hydragnn.data.config_parse import Error, parse_value

from .energy_heads import EnergyHeadSpec, parse_energy_heads
from .errors import ModelConfigError

ROOT = "NeuralNetwork.Architecture"
LOSS_TYPES: tuple[str, ...] = ("mse", "mae", "huber", "smooth_l1")
ENERGY_LOSSES: tuple[str, ...] = ("per_atom", "total")
ROLE_WEIGHTS: dict[str, str] = {"energy_weight": "energy", "forces_weight": "forces", "stress_weight": "stress"}
"""MLIP loss-weight keys (fields of :class:`LossConfig`) and the role whose output they weigh."""
GLOBAL_ATTN_ENGINES: tuple[str, ...] = ("GPS", "EquivariantTransformer")
GLOBAL_ATTN_TYPES: tuple[str, ...] = ("multihead", "performer")
CONDITIONING_MODES: tuple[str, ...] = ("concat_node", "film", "fuse_pool")

_POSITIVE = {"gt": 0}
_NON_NEGATIVE = {"min": 0}


# ----------------------------------------------------------------------------- shapes by hand
def _float(value: Any, where: str, error: Error) -> float:
    return parse_value(value, float, where, error)


def parse_task_weights(values: Any, where: str, error: Error = ModelConfigError) -> tuple:
    """``task_weights``: a list of weights (schema output order) or ``{name: weight}`` (pairs)."""
    if isinstance(values, Mapping):
        out = tuple((parse_value(k, str, where, error), _float(v, f"{where}.{k}", error)) for k, v in values.items())
        weights = [w for _, w in out]
    elif isinstance(values, list):
        out = tuple(_float(v, f"{where}[{i}]", error) for i, v in enumerate(values))
        weights = list(out)
    else:
        raise error(
            f"{where}: expected a list (one weight per output) or an object {{name: weight}}, found {type(values).__name__}"
        )
    if any(w < 0 for w in weights):
        raise error(f"{where}: weights must be >= 0, found {weights}")
    return out


def parse_output_scaling(
    values: Any, where: str = f"{ROOT}.output_scaling", error: Error = ModelConfigError
) -> tuple[tuple[str, tuple[float, ...], tuple[float, ...]], ...]:
    """``output_scaling``: ``{output name: {"shift": [...], "scale": [...]}}`` (one number per
    column, scales > 0) as ``((name, shift, scale), ...)``; null is ``()``."""
    if values is None:
        return ()
    if not isinstance(values, Mapping):
        raise error(f"{where}: expected {{output name: {{'shift': [...], 'scale': [...]}}}}, found {values!r}")
    out = []
    for name, spec in values.items():
        at = f"{where}.{name}"
        if not isinstance(spec, Mapping) or set(spec) != {"shift", "scale"}:
            raise error(f"{at}: expected {{'shift': [numbers], 'scale': [numbers]}}, found {spec!r}")
        columns = []
        for key in ("shift", "scale"):
            if not isinstance(spec[key], list) or not spec[key]:
                raise error(f"{at}.{key}: expected a non-empty list of numbers, found {spec[key]!r}")
            columns.append(tuple(_float(v, f"{at}.{key}[{i}]", error) for i, v in enumerate(spec[key])))
        shift, scale = columns
        if len(shift) != len(scale):
            raise error(f"{at}: shift has {len(shift)} values, scale {len(scale)}")
        if not all(0 < c < float("inf") for c in scale) or not all(abs(v) < float("inf") for v in shift):
            raise error(f"{at}: expected finite shifts and scales > 0, found shift {list(shift)}, scale {list(scale)}")
        out.append((str(name), shift, scale))
    return tuple(out)


def parse_references(
    values: Any, where: str = f"{ROOT}.reference_energies", error: Error = ModelConfigError
) -> tuple[tuple[int, float], ...] | None:
    """``reference_energies``: ``{symbol or atomic number: eV}`` or a list indexed by atomic
    number, as ``((Z, eV), ...)``; null stays ``None``."""
    if values is None:
        return None
    if isinstance(values, list):
        return tuple((z, _float(v, f"{where}[{z}]", error)) for z, v in enumerate(values))
    if not isinstance(values, Mapping):
        raise error(
            f"{where}: expected an object {{symbol or atomic number: energy}} or a list indexed by atomic number, "
            f"found {type(values).__name__}"
        )
    for key, value in values.items():
        _float(value, f"{where}.{key}", error)
    try:
        table = parse_reference_energies(values, where)
    except DataError as exc:
        raise error(f'{exc} (keys are chemical symbols such as "Cu" or atomic numbers such as "29")') from None
    return tuple(table.items())


def _energy_heads(values: Any, where: str, error: Error) -> tuple[EnergyHeadSpec, ...] | None:
    return None if values is None else parse_energy_heads(values, where, parse_references)


# ----------------------------------------------------------------------------- groups
@dataclass(frozen=True)
class MLIPConfig:
    """The interatomic-potential keys (``config.mlip``; JSON keys of the same name unless noted,
    defaults in brackets).

    Attributes:
        enabled (``enable_interatomic_potential``) [false]: energy as a sum of per-atom
            energies, forces ``-dE/dpos``, stress from a cell strain.
        compute_grad_energy [true]: forces by autograd (false: forces are a direct head).
        dynamic_graph [false]: build the edges from ``pos`` inside ``forward``.
        energy_name ["energy"], forces_name ["forces"], atomic_energy_name ["atomic_energy"],
            stress_name ["stress"]: output names the MLIP fills.
        reference_energies [null]: per-species reference energy (eV) keyed by symbol or atomic
            number (``{"Cu": -3.5, "79": -3.0}``), or a list indexed by atomic number; stored as
            ``((Z, eV), ...)``; trainable_reference_energies [false]. (hydra-train also takes
            ``"average"`` and ``"isolated_atoms"`` and fits the values from the data.)
        energy_shift [0.0], energy_scale [1.0]: each atom's energy is
            ``reference[Z] + energy_shift + energy_scale * network(h)`` (eV): the mean
            interaction energy per atom and its natural size, so the network works on numbers
            of order one (MACE's scale-shift; hydra-train fills both from the training data
            when they are left out).
        energy_heads [null: one]: several energy readouts on the one encoder, one per data
            source, each with its own reference energies, shift and scale
            (:mod:`hydragnn.models.energy_heads`); only with ``enabled``.
        energy_layer_readout [false]: every conv layer but the last also adds a linear per-atom
            energy of its invariant node features (MACE's per-interaction readouts), so part of
            the energy stays a low-body-order function of the near neighbourhood; only with
            ``enabled`` and an encoder that supports layer mixing (not DimeNet).
        zbl [false]: add the ZBL screened nuclear repulsion of close contacts to each atom's
            energy (:mod:`hydragnn.models.nn.zbl`: switched off at the sum of the two covalent
            radii, no parameters, no extra range), so that atoms pushed closer than any
            training structure had them repel as nuclei do; any encoder carries it. Only with
            ``enabled``; the energy is then in eV and lengths in Å.
    """

    enabled: bool = field(default=False, metadata={"json": "enable_interatomic_potential"})
    compute_grad_energy: bool = True
    dynamic_graph: bool = False
    energy_name: str = "energy"
    forces_name: str = "forces"
    atomic_energy_name: str = "atomic_energy"
    stress_name: str = "stress"
    reference_energies: tuple[tuple[int, float], ...] | None = field(default=None, metadata={"parse": parse_references})
    trainable_reference_energies: bool = False
    energy_shift: float = 0.0
    energy_scale: float = field(default=1.0, metadata=_POSITIVE)
    energy_heads: tuple[EnergyHeadSpec, ...] | None = field(default=None, metadata={"parse": _energy_heads})
    energy_layer_readout: bool = False
    zbl: bool = False

    def __post_init__(self) -> None:
        if self.energy_heads is not None and not self.enabled:
            raise ModelConfigError(
                f"{ROOT}.energy_heads: only for interatomic potentials (enable_interatomic_potential)"
            )
        for key in ("energy_layer_readout", "zbl"):
            if getattr(self, key) and not self.enabled:
                raise ModelConfigError(f"{ROOT}.{key}: only for interatomic potentials (enable_interatomic_potential)")

    def head_specs(self) -> tuple[EnergyHeadSpec, ...]:
        """Every energy head with its reference energies, shift and scale filled from these
        where it has none of its own (one head named ``default`` without ``energy_heads``)."""
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


def parse_attn_engine(value: Any, where: str, error: Error = ModelConfigError) -> str | None:
    """``global_attn_engine``: ``"GPS"``, ``"EquivariantTransformer"``, or no global attention
    written as JSON null or as the string ``"None"`` (the seed's spelling), both giving ``None``."""
    if value is None or value == "None":
        return None
    value = parse_value(value, str, where, error)
    if value not in GLOBAL_ATTN_ENGINES:
        raise error(f'{where}: expected one of {sorted(GLOBAL_ATTN_ENGINES)} or "None" (or null), found {value!r}')
    return value


@dataclass(frozen=True)
class GlobalAttentionConfig:
    """The global-attention keys (``config.attention``; JSON keys in brackets, then defaults).

    Attributes:
        engine (``global_attn_engine``) [null]: ``GPS`` (global attention mixed into every conv
            layer of the encoder) or ``EquivariantTransformer`` (all-to-all equivariant
            attention layers after the encoder, or alone when ``mpnn_type`` is null); null or
            the string ``"None"`` for none (stored as ``None``).
        attn_type (``global_attn_type``) ["multihead"]: GPS attention, ``multihead`` (exact
            softmax, per graph) or ``performer`` (random features, linear in the atoms).
        heads (``global_attn_heads``) [4]: attention heads; ``hidden_dim`` must be a multiple.
        layers (``global_attn_layers``) [num_conv_layers]: EquivariantTransformer depth.
        features (``global_attn_features``) [64]: performer random features per head.
        pe_dim (``pe_dim``) [0]: GPS positional encodings: ``pe_dim`` Laplacian eigenvectors and
            ``pe_dim`` random-walk return probabilities per node, computed with the data.
    """

    engine: str | None = field(default=None, metadata={"json": "global_attn_engine", "parse": parse_attn_engine})
    attn_type: str = field(default="multihead", metadata={"json": "global_attn_type", "choices": GLOBAL_ATTN_TYPES})
    heads: int = field(default=4, metadata={"json": "global_attn_heads", **_POSITIVE})
    layers: int | None = field(default=None, metadata={"json": "global_attn_layers", **_POSITIVE})
    features: int = field(default=64, metadata={"json": "global_attn_features", **_POSITIVE})
    pe_dim: int = field(default=0, metadata=_NON_NEGATIVE)

    def __post_init__(self) -> None:
        if self.engine != "GPS":
            for key, value, default in (("global_attn_type", self.attn_type, "multihead"), ("pe_dim", self.pe_dim, 0)):
                if value != default:
                    raise ModelConfigError(
                        f'{ROOT}.{key}: only used with global_attn_engine "GPS" (found engine {self.engine!r})'
                    )
        if self.engine != "EquivariantTransformer" and self.layers is not None:
            raise ModelConfigError(
                f'{ROOT}.global_attn_layers: only used with global_attn_engine "EquivariantTransformer"'
            )


@dataclass(frozen=True)
class ConditioningConfig:
    """Conditioning on the schema's graph inputs (``config.conditioning``).

    Attributes:
        enabled (``use_graph_attr_conditioning``) [false]: condition on the graph inputs.
        mode (``graph_attr_conditioning_mode``) ["concat_node"]: ``concat_node``, ``film`` or
            ``fuse_pool``.
    """

    enabled: bool = field(default=False, metadata={"json": "use_graph_attr_conditioning"})
    mode: str = field(
        default="concat_node", metadata={"json": "graph_attr_conditioning_mode", "choices": CONDITIONING_MODES}
    )


@dataclass(frozen=True)
class LossConfig:
    """The loss keys (``config.loss``; JSON keys in brackets, then defaults).

    Attributes:
        function (``loss_function_type``) ["mse"]: mse, mae, huber, smooth_l1;
            huber_delta [1.0].
        task_weights [1 each]: a list (schema output order) or ``{name: weight}``, stored as
            a tuple of weights or of ``(name, weight)`` pairs.
        energy_weight, forces_weight, stress_weight [null: 1]: MLIP only, the weights of the
            energy, forces and stress outputs (MACE's names); not together with a
            ``task_weights`` entry for the same output.
        energy_loss ["per_atom"]: MLIP only, the energy term compares ``E / N`` (eV/atom, so
            structures of every size weigh alike) or the ``total`` energy.
    """

    function: str = field(default="mse", metadata={"json": "loss_function_type", "choices": LOSS_TYPES})
    huber_delta: float = field(default=1.0, metadata=_POSITIVE)
    task_weights: tuple[float, ...] | tuple[tuple[str, float], ...] | None = field(
        default=None, metadata={"parse": parse_task_weights}
    )
    energy_loss: str = field(default="per_atom", metadata={"choices": ENERGY_LOSSES})
    energy_weight: float | None = field(default=None, metadata=_NON_NEGATIVE)
    forces_weight: float | None = field(default=None, metadata=_NON_NEGATIVE)
    stress_weight: float | None = field(default=None, metadata=_NON_NEGATIVE)

"""Keys of the encoders with their own geometry blocks (SchNet, DimeNet, PAINN, EGNN, PNAEq, MACE).

Torch-free; each encoder (:mod:`hydragnn.models.encoders.<name>`) has the class registered here
under its name as its ``Config``. Rules within one config are checked in ``__post_init__``; rules
that need the model's sizes are checked when the encoder is built.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal

from ..errors import ModelConfigError
from .base import ROOT, EncoderConfig, check_at_least, check_positive, register_encoder_config

PNAEQ_AGGREGATORS = ("mean", "min", "max", "std", "sum")
PNAEQ_SCALERS = ("identity", "amplification", "attenuation", "linear", "inverse_linear")


@register_encoder_config("SchNet")
@dataclass(frozen=True)
class SchNetConfig(EncoderConfig):
    """SchNet keys of ``Architecture``.

    Attributes:
        num_filters: width of the continuous filters (default: ``hidden_dim``).
        num_gaussians: number of Gaussians (default: ``num_radial``).
    """

    num_filters: int | None = None
    num_gaussians: int | None = None


@register_encoder_config("DimeNet", supports_layer_mixing=False)
@dataclass(frozen=True)
class DimeNetConfig(EncoderConfig):
    """DimeNet++ keys of ``NeuralNetwork.Architecture`` (hidden size, depth, radius and
    ``num_radial`` come from the encoder's dims).

    Attributes:
        int_emb_size: width of the down-projected triplet interaction.
        basis_emb_size: width of the basis projections.
        out_emb_size: width of the output blocks' MLP.
        num_spherical: number of Legendre orders ``l`` in the spherical basis.
        envelope_exponent: DimeNet envelope exponent (polynomial cutoff of order ``+1``).
        num_before_skip: residual layers before the skip connection in each interaction.
        num_after_skip: residual layers after it.
        num_output_layers: dense layers in each output block.
        triplet_capacity: ``None`` for the exact (data-dependent) triplet list, or slots per
            edge for the fixed, capture-safe layout (must be >= the largest in-degree).
    """

    int_emb_size: int = 64
    basis_emb_size: int = 8
    out_emb_size: int = 256
    num_spherical: int = 7
    envelope_exponent: int = 5
    num_before_skip: int = 1
    num_after_skip: int = 2
    num_output_layers: int = 3
    triplet_capacity: int | None = None

    def __post_init__(self) -> None:
        for key in ("int_emb_size", "basis_emb_size", "out_emb_size", "num_spherical", "envelope_exponent"):
            check_at_least(key, getattr(self, key), 1)
        for key in ("num_before_skip", "num_after_skip", "num_output_layers"):
            check_at_least(key, getattr(self, key), 0)
        if self.triplet_capacity is not None and self.triplet_capacity < 1:
            raise ModelConfigError(
                f"{ROOT}.triplet_capacity: expected null or an int >= 1, found {self.triplet_capacity}"
            )


@register_encoder_config("PAINN")
@dataclass(frozen=True)
class PAINNConfig(EncoderConfig):
    """PAINN-specific keys of ``NeuralNetwork.Architecture``.

    Attributes:
        num_vector_channels: channels C of the returned vectors ``[N, 3, C]``; ``None`` keeps
            ``hidden_dim`` (no projection), another value adds a bias-free channel projection.
        trainable_rbf: learn the Bessel frequencies.
        norm_eps: ``eps`` in the smooth vector norm ``sqrt(|V v|^2 + eps)`` of the update block.
            Vectors vanish at inversion-symmetric sites (most crystal sites), where the norm is
            a smoothed ``|x|`` of width ``sqrt(eps)``: PaiNN's 1e-8 puts a near-cusp in the
            energy there (forces jump over ~1e-4 Å, huge Hessians); 1e-2 keeps it smooth.
        radial_mlp: width of a radial MLP in every layer (MACE's radial MLP): the filter becomes
            ``Linear(R, m) -> SiLU -> Linear(m, m) -> SiLU -> Linear(m, 3H)`` of the radial basis
            (edge inputs appended), where ``None`` keeps PaiNN's filter, linear in the basis.
        avg_num_neighbors: ``None`` (default) sums the messages as PaiNN does; a number divides
            the message sums by it (NequIP's and MACE's normalisation); ``"auto"`` has
            hydra-train fill in the training set's mean in-degree (a model built without it
            sums plainly).
    """

    num_vector_channels: int | None = None
    trainable_rbf: bool = False
    norm_eps: float = 1e-2
    radial_mlp: int | None = None
    avg_num_neighbors: float | Literal["auto"] | None = None

    def __post_init__(self) -> None:
        check_positive("num_vector_channels", self.num_vector_channels)
        check_positive("norm_eps", self.norm_eps, allow_none=False)
        check_positive("radial_mlp", self.radial_mlp)
        if self.avg_num_neighbors != "auto":
            check_positive("avg_num_neighbors", self.avg_num_neighbors)


EGNN_DEFAULT_AVG_NUM_NEIGHBORS = 10.0
"""EGNN's sum divisor when neither the config nor the training data gave one."""


@register_encoder_config("EGNN")
@dataclass(frozen=True)
class EGNNConfig(EncoderConfig):
    """EGNN-specific keys of ``NeuralNetwork.Architecture``.

    Attributes:
        num_vector_channels: channels C of the returned vectors ``[N, 3, C]`` (channel 0 is
            the accumulated coordinate displacement); ``None`` means ``hidden_dim``.
        update_coords: feed the displaced coordinates' distances to the next layer (the
            paper's coordinate update); False keeps every layer on the input distances.
        attention: gate each message with ``sigmoid(Linear(m_ij))`` (the paper's edge inference).
        avg_num_neighbors: constant divisor of the message and displacement sums; unset,
            hydra-train fills in the training set's mean in-degree, and a model built without
            one uses :data:`EGNN_DEFAULT_AVG_NUM_NEIGHBORS`.
    """

    num_vector_channels: int | None = None
    update_coords: bool = True
    attention: bool = False
    avg_num_neighbors: float | None = None

    def __post_init__(self) -> None:
        check_positive("num_vector_channels", self.num_vector_channels)
        check_positive("avg_num_neighbors", self.avg_num_neighbors)


@register_encoder_config("PNAEq")
@dataclass(frozen=True)
class PNAEqConfig(EncoderConfig):
    """PNAEq-specific keys of ``NeuralNetwork.Architecture``.

    Attributes:
        aggregators: scalar aggregators, any of ``mean, min, max, std, sum``.
        scalers: degree scalers, any of ``identity, amplification, attenuation, linear,
            inverse_linear``.
        avg_deg_lin: average cutoff-weighted degree (``linear`` / ``inverse_linear`` scalers).
            With the cosine cutoff a neighbour counts about 0.2 on average, so 8 suits
            ~40 neighbours in the radius (dense solids at 5-6 Å).
        avg_deg_log: average ``log(deg + 1)`` (``amplification`` / ``attenuation``).
        num_vector_channels: channels C of the returned vectors ``[N, 3, C]``; ``None`` keeps
            ``hidden_dim``.
        trainable_rbf: learn the Bessel frequencies.
        smooth_minmax: soft (cutoff-weighted softmax) min and max instead of hard ones.
        minmax_beta: inverse temperature of the soft min / max (larger: closer to hard).
        std_eps: ``eps`` in ``std = sqrt(var + eps)``. ``sqrt`` is a smoothed ``|x|`` of width
            ``sqrt(eps)``, and the variance vanishes at every site whose neighbours are all
            equivalent (fcc, bcc, ...): a tiny ``eps`` puts a near-cusp in the energy there
            (force jumps over ~1e-3 Å, huge Hessians); 1e-2 keeps it smooth.
        norm_eps: ``eps`` in the smooth vector norm ``sqrt(|V v|^2 + eps)`` of the update block
            (vectors vanish at inversion-symmetric sites; same reasoning as ``std_eps``).
    """

    aggregators: tuple[str, ...] = ("mean", "min", "max", "std")
    scalers: tuple[str, ...] = PNAEQ_SCALERS
    avg_deg_lin: float = 8.0
    avg_deg_log: float = math.log(9.0)
    num_vector_channels: int | None = None
    trainable_rbf: bool = False
    smooth_minmax: bool = True
    minmax_beta: float = 2.0
    std_eps: float = 1e-2
    norm_eps: float = 1e-2

    def __post_init__(self) -> None:
        for key, allowed in (("aggregators", PNAEQ_AGGREGATORS), ("scalers", PNAEQ_SCALERS)):
            values = tuple(getattr(self, key))
            bad = [name for name in values if name not in allowed]
            if not values or bad or len(set(values)) != len(values):
                raise ModelConfigError(
                    f"{ROOT}.{key}: expected a non-empty list of distinct names from {list(allowed)}, found {list(values)}"
                )
        for key in ("avg_deg_lin", "avg_deg_log", "minmax_beta", "std_eps", "norm_eps"):
            check_positive(key, getattr(self, key), allow_none=False)
        check_positive("num_vector_channels", self.num_vector_channels)


def parse_elements(values: Any, where: str, error: type[Exception] = ModelConfigError) -> tuple[int, ...] | None:
    """``elements``: chemical symbols or atomic numbers, distinct, as sorted atomic numbers."""
    from ase.data import atomic_numbers

    if values is None:
        return None
    if not isinstance(values, (list, tuple)) or not values:
        raise error(f"{where}: expected a non-empty list of chemical symbols or atomic numbers, found {values!r}")
    out = []
    for k, value in enumerate(values):
        z = atomic_numbers.get(value) if isinstance(value, str) else value
        if isinstance(z, bool) or not isinstance(z, int) or not 1 <= z <= 118:
            raise error(f"{where}[{k}]: expected a chemical symbol or an atomic number in 1..118, found {value!r}")
        out.append(z)
    if len(set(out)) != len(out):
        raise error(f"{where}: an element is listed twice in {list(values)}")
    return tuple(sorted(out))


MACE_DEFAULT_AVG_NUM_NEIGHBORS = 10.0
"""MACE's neighbour-sum divisor when neither the config nor the training data gave one."""


@register_encoder_config("MACE")
@dataclass(frozen=True)
class MACEConfig(EncoderConfig):
    """MACE keys of ``NeuralNetwork.Architecture`` (hidden size, depth, radius, ``num_radial``
    and ``num_species`` come from the encoder's dims).

    Attributes:
        max_ell: highest order of the edge spherical harmonics (and of ``A``).
        node_max_ell: highest order of the node features; 0 is mace-torch's ``max_L=0`` (scalar
            node features only: the encoder then returns no vectors), >= 1 returns the ``1o``
            channels as vectors.
        correlation: body order of the product basis minus one (number of ``A`` factors).
        avg_num_neighbors: constant dividing the neighbour sum; unset, hydra-train fills in the
            training set's mean in-degree (as mace-torch does), and a model built without one
            uses :data:`MACE_DEFAULT_AVG_NUM_NEIGHBORS`.
        radial_mlp_dim: width of the radial MLP.
        radial_mlp_layers: hidden layers of the radial MLP.
        envelope_exponent: order ``p`` of the polynomial cutoff (MACE uses 5).
        elements: chemical symbols (or atomic numbers) that get their own per-species weights
            (mace-torch's ``atomic_numbers`` / z table): the element-dependent residual and
            product weights then have one row per listed element instead of one per atomic
            number below ``num_species`` (at 32 channels, 4 elements instead of 119 make the
            model about 7x smaller). An atom of another element gets no per-species weights;
            hydra-infer refuses elements the model was not trained on. Unset: every atomic number.
        scales: the constant scales of the layers' inputs. ``"unit"`` (the default) scales the
            Bessel basis ``sqrt(2/rc) sin(n pi d/rc) / d`` by ``rc sqrt(rc/2)`` and the species
            one-hot by ``sqrt(rows)`` to unit variance, and starts the species embedding at
            variance 1. ``"mace-torch"`` uses mace-torch's: the radial MLP reads the basis as it
            is (values below about 1), the one-hot enters the element-dependent residual
            unscaled, and the embedding starts at variance ``1 / rows`` (the one-hot times an
            e3nn-normalised linear). With ``residual_first_layer`` and mace-torch's training
            recipe it transfers better to unseen molecules, and it learns metals' forces more
            slowly, hence not the default (docs/notes/organic_benchmark.md).
        residual_first_layer: the element-dependent residual also in the first layer (mace-torch
            0.3's default ``--interaction_first RealAgnosticResidualInteractionBlock``): a learned
            per-element offset of the first layer's features, from the species embedding. Off,
            the residual starts at the second layer (the MACE paper's layout).
    """

    max_ell: int = 2
    node_max_ell: int = 1
    correlation: int = 3
    avg_num_neighbors: float | None = None
    radial_mlp_dim: int = 64
    radial_mlp_layers: int = 3
    envelope_exponent: int = 5
    elements: tuple[int, ...] | None = field(default=None, metadata={"parse": parse_elements})
    scales: Literal["unit", "mace-torch"] = "unit"
    residual_first_layer: bool = False

    def __post_init__(self) -> None:
        check_at_least("max_ell", self.max_ell)
        if not 0 <= self.node_max_ell <= self.max_ell:
            raise ModelConfigError(
                f"{ROOT}.node_max_ell: expected an int in [0, max_ell={self.max_ell}], found {self.node_max_ell}"
            )
        check_at_least("correlation", self.correlation)
        if self.avg_num_neighbors is not None and not self.avg_num_neighbors > 0:
            raise ModelConfigError(f"{ROOT}.avg_num_neighbors: expected a float > 0, found {self.avg_num_neighbors}")
        for key in ("radial_mlp_dim", "radial_mlp_layers", "envelope_exponent"):
            check_at_least(key, getattr(self, key), 1)

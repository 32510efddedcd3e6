"""Keys of the invariant encoders built on PyG convolutions (GIN, GAT, SAGE, MFC, CGCNN, PNA, PNAPlus).

Torch-free; the encoders are in :mod:`hydragnn.models.encoders` (:mod:`~.encoders.invariant_utils`
and one module each), whose ``Config`` is the class registered here under the same name.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import ModelConfigError
from .base import ROOT, EncoderConfig, register_encoder_config

WHERE = ROOT

RADIAL_BASES = ("gaussian", "bessel")
CUTOFF_FUNCTIONS = ("cosine", "polynomial")
PNA_AGGREGATORS = ("sum", "mean", "min", "max", "var", "std", "softmax", "softmin")
PNA_SCALERS = ("identity", "amplification", "attenuation", "linear", "inverse_linear")
DEFAULT_PNA_DEG: tuple[int, ...] = (0,) + (1,) * 32
"""Default in-degree histogram: uniform over 1..32 neighbours (average 16.5)."""


def check_choice(key: str, value: str, allowed: tuple[str, ...] | list[str] | set[str]) -> None:
    """Raise a :class:`ModelConfigError` naming ``key`` if ``value`` is not in ``allowed``."""
    if value not in allowed:
        raise ModelConfigError(f"{WHERE}.{key}: expected one of {sorted(allowed)}, found {value!r}")


@dataclass(frozen=True)
class InvariantConfig(EncoderConfig):
    """Keys common to the invariant encoders.

    Attributes:
        activation: nonlinearity after each convolution (a smooth one keeps forces smooth).
        residual: add each convolution's activated output to its input.
        radial_basis: ``"gaussian"`` or ``"bessel"`` expansion of the edge length.
        cutoff_function: ``"cosine"`` or ``"polynomial"`` envelope, zero at ``radius``.
        envelope_exponent: order p of the polynomial envelope.
    """

    activation: str = "silu"
    residual: bool = True
    radial_basis: str = "gaussian"
    cutoff_function: str = "cosine"
    envelope_exponent: int = 6


@register_encoder_config("CGCNN")
@dataclass(frozen=True)
class CGCNNConfig(InvariantConfig):
    """The common invariant keys; CGCNN's defaults: no extra residual, the Bessel radial basis."""

    residual: bool = False
    radial_basis: str = "bessel"


@register_encoder_config("GAT")
@dataclass(frozen=True)
class GATConfig(InvariantConfig):
    """GAT keys.

    Attributes:
        heads: attention heads.
        concat: concatenate heads of width ``hidden_dim // heads`` (needs ``hidden_dim``
            divisible by ``heads``); else average heads of width ``hidden_dim``.
        negative_slope: LeakyReLU slope inside the attention logits.
        attention_dropout: dropout on the attention weights (training only).
    """

    heads: int = 4
    concat: bool = False
    negative_slope: float = 0.2
    attention_dropout: float = 0.0


@register_encoder_config("GIN")
@dataclass(frozen=True)
class GINConfig(InvariantConfig):
    """GIN keys: ``eps`` (initial self weight offset), ``train_eps`` (learn it)."""

    eps: float = 0.0
    train_eps: bool = True


@register_encoder_config("MFC")
@dataclass(frozen=True)
class MFCConfig(InvariantConfig):
    """MFC keys: ``max_degree`` (number of degree-specific weight sets minus one)."""

    max_degree: int = 10


@register_encoder_config("SAGE")
@dataclass(frozen=True)
class SAGEConfig(InvariantConfig):
    """SAGE has only the common invariant keys."""


@register_encoder_config("PNA")
@dataclass(frozen=True)
class PNAConfig(InvariantConfig):
    """PNA keys.

    Attributes:
        aggregators: PNA aggregators (``sum``, ``mean``, ``min``, ``max``, ``var``, ``std``,
            ``softmax``, ``softmin``; see :mod:`hydragnn.models.encoders.pna`).
        scalers: degree scalers (``identity``, ``amplification``, ``attenuation``, ``linear``,
            ``inverse_linear``).
        pna_deg: in-degree histogram of the training set (``pna_deg[k]`` = number of nodes with
            k neighbours); None: :data:`DEFAULT_PNA_DEG`.
        towers: PNA towers (``hidden_dim`` must be divisible by it).
        pre_layers: linear layers before aggregation.
        post_layers: linear layers after aggregation.
    """

    aggregators: tuple[str, ...] = ("mean", "softmin", "softmax", "std")
    scalers: tuple[str, ...] = ("identity", "amplification", "attenuation", "linear")
    pna_deg: tuple[int, ...] | None = None
    towers: int = 1
    pre_layers: int = 1
    post_layers: int = 1


@register_encoder_config("PNAPlus")
@dataclass(frozen=True)
class PNAPlusConfig(PNAConfig):
    """The PNA keys (HydraGNN's PNA+ used ``radial_basis="bessel"``, ``cutoff_function="polynomial"``)."""

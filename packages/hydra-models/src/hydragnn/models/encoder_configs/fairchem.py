"""Keys of the fairchem-backed encoders (UMA, AllScAIP; extra ``hydra-models[fairchem]``).

Torch-free and fairchem-free: a config names a fairchem encoder and is validated without the
extra installed; :mod:`hydragnn.models.encoders.uma` / ``.allscaip`` (``Config`` = the class
registered here) import fairchem when the encoder is built. Neither supports layer mixing (their
per-layer state lives inside fairchem's backbone).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import ModelConfigError
from .base import ROOT, EncoderConfig, register_encoder_config


@register_encoder_config("UMA", supports_layer_mixing=False)
@dataclass(frozen=True)
class UMAConfig(EncoderConfig):
    """UMA keys of ``NeuralNetwork.Architecture``.

    ``hidden_dim`` is fairchem's ``sphere_channels``, ``num_conv_layers`` its ``num_layers``,
    ``radius`` its ``cutoff`` and ``num_radial`` its ``num_distance_basis``.

    Attributes:
        lmax: highest degree of the node features (>= 1: the vector output is ``l = 1``).
        mmax: highest order kept in the SO(2) convolutions (1 <= mmax <= lmax).
        ffn_hidden_channels: ``hidden_channels`` of the blocks' feed-forward (None: hidden_dim).
        edge_channels: width of the radial embeddings (None: hidden_dim).
        num_experts: > 0 uses ``eSCNMDMoeBackbone`` with this many linear experts per SO(2) layer,
            mixed per system by a routing MLP on the charge/spin (and composition) embedding.
        use_composition_embedding: MoLE routing also sees the mean element embedding of each system.
        norm_type / act_type / ff_type: fairchem's choices (``rms_norm_sh``, ``gate``, ``grid``).
        grid_resolution: S2 grid resolution (None: fairchem's default for lmax).
        chg_spin_emb_type: ``rand_emb`` (lookup table; capture-safe), ``pos_emb`` or ``lin_emb``.
        charge_index / spin_index: column of the graph inputs holding the total charge / spin
            multiplicity of each system (None: 0).
        max_num_elements: size of the element embeddings (atomic numbers must be smaller).
        random_roll: in training, rotate each edge frame by a random roll about the edge axis
            (fairchem's default; draws from torch's RNG). False: roll 0 always, so outputs are
            bitwise reproducible.
    """

    lmax: int = 2
    mmax: int = 2
    ffn_hidden_channels: int | None = None
    edge_channels: int | None = None
    num_experts: int = 0
    use_composition_embedding: bool = False
    norm_type: str = "rms_norm_sh"
    act_type: str = "gate"
    ff_type: str = "grid"
    grid_resolution: int | None = None
    chg_spin_emb_type: str = "rand_emb"
    charge_index: int | None = None
    spin_index: int | None = None
    max_num_elements: int = 100
    random_roll: bool = False

    def __post_init__(self) -> None:
        if self.lmax < 1:
            raise ModelConfigError(f"{ROOT}.lmax: expected an int >= 1, found {self.lmax}")
        if not 1 <= self.mmax <= self.lmax:
            raise ModelConfigError(f"{ROOT}.mmax: expected an int in [1, lmax={self.lmax}], found {self.mmax}")
        if self.num_experts < 0:
            raise ModelConfigError(f"{ROOT}.num_experts: expected an int >= 0, found {self.num_experts}")
        if self.chg_spin_emb_type not in ("rand_emb", "pos_emb", "lin_emb"):
            raise ModelConfigError(
                f"{ROOT}.chg_spin_emb_type: expected 'rand_emb', 'pos_emb' or 'lin_emb', found {self.chg_spin_emb_type!r}"
            )
        for key in ("ffn_hidden_channels", "edge_channels", "grid_resolution"):
            value = getattr(self, key)
            if value is not None and value < 1:
                raise ModelConfigError(f"{ROOT}.{key}: expected an int >= 1 or null, found {value}")
        if self.max_num_elements < 1:
            raise ModelConfigError(f"{ROOT}.max_num_elements: expected an int >= 1, found {self.max_num_elements}")


@register_encoder_config("AllScAIP", supports_layer_mixing=False)
@dataclass(frozen=True)
class AllScAIPConfig(EncoderConfig):
    """AllScAIP keys of ``NeuralNetwork.Architecture``.

    ``hidden_dim`` is fairchem's ``hidden_size``, ``num_conv_layers`` its ``num_layers``,
    ``radius`` its ``max_radius`` and ``num_radial`` its ``edge_distance_expansion_size``.

    Attributes:
        num_heads: attention heads (``hidden_dim`` must be divisible by it).
        frequency_list: per-degree repeats of the frequency features of neighbourhood attention
            (fairchem's ``freequency_list``); must sum to ``hidden_dim / num_heads``. None: half
            of the head width for ``l = 0`` and a quarter each for ``l = 1, 2``.
        max_neighbor_slots: neighbour slots per atom, its self-loop included (nearest kept; the
            rest are dropped). ``max_neighbours`` + 1 when that common key is set.
        node_direction_expansion_size / edge_direction_expansion_size: ``lmax + 1`` of the
            bond-orientational and edge spherical-harmonic features. Edge harmonics beyond l = 0
            (``edge_direction_expansion_size > 1``, fairchem's default 6) make the energy depend
            on the orientation; 1 (the default here) keeps it rotation-invariant.
        use_node_path: all-to-all node attention within each graph after every block.
        use_freq_mask: frequency features in neighbourhood attention.
        use_sincx_mask: fairchem's sinc distance kernel in node attention (needs ``use_node_path``):
            a learned bias from ``sin(w r_ij) / (w r_ij)`` of every pairwise distance in the graph
            (minimum image in periodic cells), 32 frequencies ``w`` log-spaced over
            ``[pi / 120, pi / 0.25]`` 1/Å. Costs ``[N, N, 32]`` per batch.
        activation: fairchem's activation name (``gelu``, ``squared_relu``, ...).
        normalization: ``rmsnorm``, ``layernorm`` or ``skip``.
        ffn_hidden_layer_multiplier: width multiplier of the feed-forward blocks.
        charge_index / spin_index: columns of the graph inputs (None: 0), as for UMA.
        max_num_elements: size of the element embedding.
    """

    num_heads: int = 2
    frequency_list: tuple[int, ...] | None = None
    max_neighbor_slots: int = 48
    node_direction_expansion_size: int = 4
    edge_direction_expansion_size: int = 1
    use_node_path: bool = True
    use_freq_mask: bool = True
    use_sincx_mask: bool = False
    activation: str = "gelu"
    normalization: str = "rmsnorm"
    ffn_hidden_layer_multiplier: int = 2
    charge_index: int | None = None
    spin_index: int | None = None
    max_num_elements: int = 100

    def __post_init__(self) -> None:
        for key in ("num_heads", "max_neighbor_slots", "node_direction_expansion_size", "max_num_elements"):
            if getattr(self, key) < 1:
                raise ModelConfigError(f"{ROOT}.{key}: expected an int >= 1, found {getattr(self, key)}")
        if self.edge_direction_expansion_size < 1:
            raise ModelConfigError(
                f"{ROOT}.edge_direction_expansion_size: expected an int >= 1, found {self.edge_direction_expansion_size}"
            )
        if self.use_sincx_mask and not self.use_node_path:
            raise ModelConfigError(
                f"{ROOT}.use_sincx_mask: the sinc kernel biases node attention; it needs use_node_path true"
            )
        if self.normalization not in ("rmsnorm", "layernorm", "skip"):
            raise ModelConfigError(
                f"{ROOT}.normalization: expected 'rmsnorm', 'layernorm' or 'skip', found {self.normalization!r}"
            )

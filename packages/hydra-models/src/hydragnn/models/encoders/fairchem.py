"""UMA and AllScAIP: FAIR Chemistry's backbones (``fairchem-core``) as HydraGNN encoders.

Both run fairchem's own layers on HydraGNN's graph; install them with
``pip install "hydra-models[fairchem]"`` (fairchem-core 2.24). This module imports without
fairchem: the package is imported when an encoder is constructed.

**UMA** (``mpnn_type: "UMA"``): ``eSCNMDBackbone`` (eSEN-style SO(2) equivariant convolutions),
or ``eSCNMDMoeBackbone`` (its mixture of linear experts, MoLE) when ``num_experts > 0``. The
backbone does not build edges: a subclass replaces its ``_generate_graph`` with HydraGNN's
``edge_index`` and ``edge_vec`` (same convention: ``pos[src] - pos[dst] + shift``), so forces
(``-dE/dpos``) and stress (the strain applied to ``pos`` and ``edge_shift``) reach every edge.
Output: ``scalar`` = the ``l = 0`` coefficients ``[N, hidden_dim]``, ``vector`` = the ``l = 1``
block ``[N, 3, hidden_dim]`` (fairchem's ``l = 1`` components are already ``(x, y, z)``).

System-level inputs (select the experts and add a per-system embedding to every atom): charge and
spin from columns ``charge_index`` / ``spin_index`` of the schema's graph inputs (rounded to
integers), else 0. fairchem's dataset embedding is off (HydraGNN batches carry no dataset names).

**AllScAIP** (``mpnn_type: "AllScAIP"``): ``AllScAIPBackbone``'s input block and graph-attention
blocks (neighbourhood self-attention over each atom's neighbours, in both edge directions, and
all-to-all node attention within each graph). fairchem's preprocessing (its own bi-kNN radius
graph from ``pos`` and ``cell``) is replaced by a capture-safe conversion of HydraGNN's edges to
its dense neighbour layout ``[N, max_neighbor_slots]``: a self-loop first (slot 0 is the node),
then the neighbours nearest first; the envelope is ``envelope(d / radius)`` (no soft-kNN rank
term) and the sinc distance kernel of node attention is off (it needs every pairwise
minimum-image distance, which a radius graph does not carry). It is invariant to translations
and permutations but NOT to rotations (by design: its direction features are raw spherical
harmonics). It computes in float32 whatever the model precision (fairchem's frequency features
are float32).

Capture safety: UMA with ``num_experts = 0`` and ``chg_spin_emb_type = "rand_emb"`` has no host
synchronisation (the conformance check passes). With experts it is not capture-safe: fairchem's
``MOLE.forward`` splits the edges per system with ``mole_sizes.cpu()`` and ``.tolist()`` (a
device synchronisation on CUDA that the CPU check cannot see), and needs the edges grouped by
system in batch order (as collated batches and the sink padding have them). AllScAIP's layers
and this module's neighbour layout have no host synchronisation (the conformance check passes).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from ..errors import ModelConfigError, ModelError
from .base import Encoder, EncoderConfig, EncoderDims, GraphInputs, NodeEmbedding, register_encoder

ROOT = "NeuralNetwork.Architecture"
INSTALL = 'pip install "hydra-models[fairchem]"'


def _import(module: str, mpnn_type: str) -> Any:
    """Import a fairchem module or raise a :class:`ModelConfigError` naming the extra."""
    try:
        return importlib.import_module(module)
    except ImportError as err:
        raise ModelConfigError(
            f"{ROOT}.mpnn_type: {mpnn_type} needs fairchem-core ({module} could not be imported: {err}); "
            f"install it with: {INSTALL}"
        ) from err


class _SystemDict(dict):
    """The fields fairchem's backbones read from ``AtomicData``, as a dict.

    ``AtomicData`` validates itself with ``.item()`` calls (host synchronisation); the backbones
    only index it and call ``get(key, default=...)``, which this class adds.
    """

    def get(self, key: str, default: Any = None) -> Any:  # noqa: D102 - dict.get with a keyword default
        return super().get(key, default)


def _system_ints(inputs: GraphInputs, index: int | None) -> torch.Tensor:
    """Per-system integer input ``[B]`` (int64): column ``index`` of ``graph_attr`` rounded, or zeros."""
    if index is None or inputs.graph_attr is None:
        return torch.zeros(inputs.num_graphs, dtype=torch.long, device=inputs.x.device)
    return inputs.graph_attr[:, index].round().long()


class _Method(nn.Module):
    """Calls ``module.<method>`` (so :func:`torch.func.functional_call` can run any method)."""

    def __init__(self, module: nn.Module, method: str) -> None:
        super().__init__()
        self.module = module
        self.method = method

    def forward(self, *args: Any) -> Any:
        return getattr(self.module, self.method)(*args)


def _compute_dtype(module: nn.Module, allow_fp64: bool) -> torch.dtype:
    """float64 for a float64 module when ``allow_fp64``, else float32 (also for bf16 / fp16)."""
    dtype = next(module.parameters()).dtype
    return torch.float64 if (dtype == torch.float64 and allow_fp64) else torch.float32


def _call_in(dtype: torch.dtype, module: nn.Module, method: str, *args: Any) -> Any:
    """``module.<method>(*args)`` with its floating parameters and buffers cast to ``dtype``.

    The parameters keep the model's dtype (and receive gradients through the cast): fairchem's
    layers deviate by ~20 % in forces in pure bf16 (fairchem uses bf16 only through autocast), and
    AllScAIP computes some features in float32 only.
    """
    tensors = dict(module.named_parameters())
    tensors.update(module.named_buffers())
    if all(t.dtype == dtype for t in tensors.values() if t.is_floating_point()):
        return getattr(module, method)(*args)
    cast = {f"module.{k}": (t.to(dtype) if t.is_floating_point() else t) for k, t in tensors.items()}
    return torch.func.functional_call(_Method(module, method), cast, args)


def _check_common(config: Any, dims: EncoderDims, mpnn_type: str) -> None:
    for key in ("charge_index", "spin_index"):
        index = getattr(config, key)
        if index is not None and not 0 <= index < dims.graph_in:
            raise ModelConfigError(
                f"{ROOT}.{key}: {mpnn_type} reads column {index} of the graph inputs; the schema has "
                f"{dims.graph_in} graph input column(s)"
            )


# ============================================================================================ UMA
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


_UMA_CLASSES: dict[type, type] = {}


def _uma_class(moe: bool) -> type[nn.Module]:
    """fairchem's UMA backbone with its graph generation replaced by HydraGNN's edges."""
    escn_md = _import("fairchem.core.models.uma.escn_md", "UMA")
    base = _import("fairchem.core.models.uma.escn_moe", "UMA").eSCNMDMoeBackbone if moe else escn_md.eSCNMDBackbone
    if base not in _UMA_CLASSES:
        add_n_empty_edges = escn_md.add_n_empty_edges
        wigner_hybrid = escn_md.axis_angle_wigner_hybrid

        class HydraGraphUMA(base):  # type: ignore[misc, valid-type]
            """UMA reading ``edge_index``, ``edge_distance_vec`` and ``edge_distance`` from its input."""

            def _generate_graph(self, data_dict: dict) -> dict:
                graph = {
                    "edge_index": data_dict["edge_index"],
                    "edge_distance": data_dict["edge_distance"],
                    "edge_distance_vec": data_dict["edge_distance_vec"],
                }
                if graph["edge_index"].shape[1] == 0:  # fairchem's fix-up for graphs without edges
                    add_n_empty_edges(graph, 1, self.cutoff)
                data_dict["scatter_target"] = graph["edge_index"][1]
                return graph

            def _get_rotmat_and_wigner(self, edge_distance_vecs: torch.Tensor):
                # fairchem draws a random roll about every edge axis in each forward (a gauge the
                # SO(2) convolutions are invariant to, up to rounding); roll 0 makes outputs
                # reproducible and leaves torch's RNG alone
                if not self.use_quaternion_wigner or (self.random_roll and self.training):
                    return super()._get_rotmat_and_wigner(edge_distance_vecs)
                return wigner_hybrid(
                    edge_distance_vecs,
                    self.lmax,
                    gamma=edge_distance_vecs.new_zeros(edge_distance_vecs.shape[0]),
                    coeffs=self.wigner_data.coeffs,
                    U_blocks=self.wigner_data.U_blocks,
                    custom_kernels=self.wigner_data.custom_kernels,
                    compact_l2=getattr(self.backend, "supports_fused_edgewise", False),
                )

        HydraGraphUMA.__name__ = f"HydraGraph{base.__name__}"
        _UMA_CLASSES[base] = HydraGraphUMA
    return _UMA_CLASSES[base]


@register_encoder("UMA")
class UMAEncoder(Encoder):
    """UMA (fairchem ``eSCNMDBackbone`` / ``eSCNMDMoeBackbone``) on HydraGNN's edges (equivariant)."""

    Config = UMAConfig
    equivariant = True
    needs_pos = True
    supports_layer_mixing = False
    optional_dependency = "fairchem"
    #: Extra ``Architecture`` keys for the shared conformance suite (tiny: l <= 1).
    conformance_config: ClassVar[dict] = {"lmax": 1, "mmax": 1}
    #: ``Architecture`` overrides for tests/test_learning.py (with lr 5e-3: hidden 16 or lr 1e-2
    #: under-fit the energy).
    learning_config: ClassVar[dict] = {"lmax": 1, "mmax": 1, "hidden_dim": 32}

    def __init__(self, dims: EncoderDims, config: UMAConfig) -> None:
        super().__init__(dims, config)
        _check_common(config, dims, "UMA")
        if dims.hidden_dim % 2:
            raise ModelConfigError(f"{ROOT}.hidden_dim: UMA needs an even hidden_dim, found {dims.hidden_dim}")
        cls = _uma_class(config.num_experts > 0)
        # fairchem's mixture-of-experts layer reads per-system edge counts on the host
        self.capture_safe = config.num_experts == 0
        hidden = dims.hidden_dim
        kwargs: dict[str, Any] = {
            "max_num_elements": config.max_num_elements,
            "sphere_channels": hidden,
            "lmax": config.lmax,
            "mmax": config.mmax,
            "grid_resolution": config.grid_resolution,
            "otf_graph": False,
            "cutoff": float(dims.radius),
            "edge_channels": config.edge_channels or hidden,
            "num_distance_basis": dims.num_radial,
            "direct_forces": False,
            "regress_forces": False,
            "regress_stress": False,
            "num_layers": dims.num_conv_layers,
            "hidden_channels": config.ffn_hidden_channels or hidden,
            "norm_type": config.norm_type,
            "act_type": config.act_type,
            "ff_type": config.ff_type,
            "activation_checkpointing": dims.conv_checkpointing,
            "chg_spin_emb_type": config.chg_spin_emb_type,
            "use_dataset_embedding": False,
        }
        if config.num_experts > 0:
            kwargs.update(num_experts=config.num_experts, use_composition_embedding=config.use_composition_embedding)
        try:
            self.backbone = cls(**kwargs)
        except (ValueError, AssertionError, KeyError) as err:
            raise ModelConfigError(f"{ROOT}: fairchem rejected the UMA configuration {kwargs}: {err}") from err
        self.backbone.random_roll = config.random_roll

    def forward(self, inputs: GraphInputs) -> NodeEmbedding:
        """``x[:, 0]`` atomic numbers, ``edge_vec [E, 3]`` -> ``scalar [N, H]``, ``vector [N, 3, H]``
        (in the dtype of ``inputs.x``)."""
        if inputs.edge_vec is None or inputs.pos is None:
            raise ModelError("UMA needs positions: GraphInputs.edge_vec is None")
        device = inputs.x.device
        dtype = _compute_dtype(self.backbone, allow_fp64=True)
        ones = torch.ones(inputs.num_nodes, dtype=torch.long, device=device)
        natoms = torch.zeros(inputs.num_graphs, dtype=torch.long, device=device).index_add(0, inputs.batch, ones)
        # zero-length (sink padding) edges have no direction: give them a fixed one, so fairchem's
        # edge rotations stay finite; they only ever touch the sink graph
        vec = inputs.edge_vec.to(dtype)
        len2 = vec.square().sum(-1, keepdim=True)
        real = len2 > 1e-20
        edge_vec = torch.where(real, vec, torch.ones_like(vec))
        edge_len = torch.where(real, len2.clamp_min(1e-20).sqrt(), torch.zeros_like(len2)).squeeze(-1)
        data = _SystemDict(
            atomic_numbers=inputs.x[:, 0].long(),
            batch=inputs.batch,
            natoms=natoms,
            charge=_system_ints(inputs, self.config.charge_index),
            spin=_system_ints(inputs, self.config.spin_index),
            pos=inputs.pos.to(dtype),
            edge_index=inputs.edge_index,
            edge_distance_vec=edge_vec,
            edge_distance=edge_len,
        )
        emb = _call_in(dtype, self.backbone, "forward", data)["node_embedding"]  # [N, (lmax + 1)^2, H]
        emb = emb.to(inputs.x.dtype)
        return NodeEmbedding(scalar=emb[:, 0, :], vector=emb[:, 1:4, :])


# ======================================================================================= AllScAIP
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
            bond-orientational and edge spherical-harmonic features.
        use_node_path: all-to-all node attention within each graph after every block.
        use_freq_mask: frequency features in neighbourhood attention.
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
    edge_direction_expansion_size: int = 3
    use_node_path: bool = True
    use_freq_mask: bool = True
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
        if self.normalization not in ("rmsnorm", "layernorm", "skip"):
            raise ModelConfigError(
                f"{ROOT}.normalization: expected 'rmsnorm', 'layernorm' or 'skip', found {self.normalization!r}"
            )


def _frequency_list(config: AllScAIPConfig, head_dim: int) -> list[int]:
    if config.frequency_list is not None:
        if sum(config.frequency_list) != head_dim or min(config.frequency_list) < 0:
            raise ModelConfigError(
                f"{ROOT}.frequency_list: expected non-negative repeats summing to hidden_dim / num_heads = {head_dim}, "
                f"found {list(config.frequency_list)}"
            )
        return list(config.frequency_list)
    quarter = head_dim // 4
    return [head_dim - 2 * quarter, quarter, quarter]


def _rank_in_group(group: torch.Tensor, key: torch.Tensor, num_groups: int) -> torch.Tensor:
    """Rank ``[M]`` of each item within its ``group`` (ascending ``key``, ties in input order)."""
    order = torch.sort(key, stable=True).indices
    order = order[torch.sort(group[order], stable=True).indices]
    ones = torch.ones_like(group)
    count = torch.zeros(num_groups, dtype=group.dtype, device=group.device).index_add(0, group, ones)
    first = torch.cumsum(count, 0) - count
    sorted_rank = torch.arange(group.shape[0], device=group.device) - first[group[order]]
    return torch.empty_like(group).index_put((order,), sorted_rank)


@register_encoder("AllScAIP")
class AllScAIPEncoder(Encoder):
    """AllScAIP (fairchem ``AllScAIPBackbone``) on HydraGNN's edges (invariant output, float32)."""

    Config = AllScAIPConfig
    equivariant = False
    needs_pos = True
    supports_layer_mixing = False
    optional_dependency = "fairchem"
    conformance_config: ClassVar[dict] = {}
    learning_config: ClassVar[dict] = {}
    #: Shared conformance checks this encoder cannot pass by design (check -> reason).
    conformance_skips: ClassVar[dict[str, str]] = {
        "rotation_translation": "not rotation-invariant by design (raw spherical-harmonic direction features); "
        "translation invariance is tested instead",
        "finite_differences": "computes in float32 (fairchem's frequency features are float32): the float64 check "
        "cannot hold; a float32 finite-difference check replaces it",
    }

    def __init__(self, dims: EncoderDims, config: AllScAIPConfig) -> None:
        super().__init__(dims, config)
        _check_common(config, dims, "AllScAIP")
        hidden = dims.hidden_dim
        if hidden % config.num_heads or hidden % 2:
            raise ModelConfigError(
                f"{ROOT}.num_heads: AllScAIP needs an even hidden_dim divisible by num_heads; found hidden_dim "
                f"{hidden}, num_heads {config.num_heads}"
            )
        frequencies = _frequency_list(config, hidden // config.num_heads)
        allscaip = _import("fairchem.core.models.allscaip.AllScAIP", "AllScAIP")
        self._prep = _import("fairchem.core.models.allscaip.utils.data_preprocess", "AllScAIP")
        self._types = _import("fairchem.core.models.allscaip.custom_types", "AllScAIP")
        self._graph = _import("fairchem.core.models.escaip.utils.radius_graph", "AllScAIP")
        self.slots = dims.max_neighbours + 1 if dims.max_neighbours is not None else config.max_neighbor_slots
        try:
            self.backbone = allscaip.AllScAIPBackbone(
                regress_forces=False,
                direct_forces=False,
                hidden_size=hidden,
                num_layers=dims.num_conv_layers,
                activation=config.activation,
                use_compile=False,
                use_padding=False,
                use_node_path=config.use_node_path,
                max_num_elements=config.max_num_elements,
                max_atoms=1,  # only read by fairchem's padding, which is off
                max_batch_size=1,
                max_radius=float(dims.radius),
                knn_k=self.slots,
                knn_pad_size=self.slots,
                atten_name="math",
                atten_num_heads=config.num_heads,
                node_direction_expansion_size=config.node_direction_expansion_size,
                edge_direction_expansion_size=config.edge_direction_expansion_size,
                edge_distance_expansion_size=dims.num_radial,
                freequency_list=frequencies,
                use_freq_mask=config.use_freq_mask,
                use_sincx_mask=False,
                normalization=config.normalization,
                ffn_hidden_layer_multiplier=config.ffn_hidden_layer_multiplier,
            )
        except (ValueError, AssertionError, KeyError) as err:
            raise ModelConfigError(f"{ROOT}: fairchem rejected the AllScAIP configuration: {err}") from err
        if dims.num_radial < 2:
            raise ModelConfigError(
                f"{ROOT}.num_radial: AllScAIP needs at least 2 radial functions, found {dims.num_radial}"
            )
        smearing = _import("fairchem.core.models.escaip.utils.smearing", "AllScAIP")
        # fairchem builds this per call (with a .item()); built once here, as in its preprocessing
        self.distance_expansion = smearing.GaussianSmearing(0.0, float(dims.radius), dims.num_radial, 2.0)
        lmax = config.node_direction_expansion_size - 1
        degree = [ell for ell in range(lmax + 1) for _ in range(2 * ell + 1)]
        self.register_buffer("sh_degree", torch.tensor(degree, dtype=torch.long), persistent=False)

    def _bond_order(self, direction: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Bond-orientational order ``[N, lmax + 1]`` of each atom's neighbour directions ``[N, K, 3]``
        (fairchem's ``get_node_direction_expansion_neighbor`` without its host synchronisation)."""
        lmax = self.config.node_direction_expansion_size - 1
        sh = self._prep._spherical_harmonics(lmax, direction[..., 0], direction[..., 1], direction[..., 2])
        sh = sh / torch.sqrt(2.0 * self.sh_degree + 1.0).to(sh.dtype)
        weight = mask.to(sh.dtype).unsqueeze(-1)
        mean = (sh * weight).sum(1) / weight.sum(1).clamp(min=1)
        boo = mean.new_zeros(mean.shape[0], lmax + 1).index_add(1, self.sh_degree, mean.square())
        return boo.clamp(min=1e-6).sqrt()

    def _neighbor_layout(self, inputs: GraphInputs) -> Any:
        """HydraGNN edges -> fairchem's ``GraphAttentionData`` (dense ``[N, K]`` neighbour slots).

        AllScAIP's edge (a, b) runs from centre a = ``edge_index[1]`` to neighbour b =
        ``edge_index[0]`` with displacement ``edge_vec``; every atom gets a self-loop in slot 0.
        """
        prep, graph = self._prep, self._graph
        cfg = self.backbone
        n, k, device = inputs.num_nodes, self.slots, inputs.x.device
        nodes = torch.arange(n, device=device)
        centre = torch.cat([nodes, inputs.edge_index[1]])
        neigh = torch.cat([nodes, inputs.edge_index[0]])
        vec = inputs.edge_vec.float()
        disp = torch.cat([vec.new_zeros(n, 3), vec])
        dist = disp.square().sum(-1).clamp_min(1e-24).sqrt().detach()  # ranking only
        rank1 = _rank_in_group(centre, dist, n)  # slot in the centre's (source) layout
        rank2 = _rank_in_group(neigh, dist, n)  # slot in the neighbour's (destination) layout
        keep = (rank1 < k) & (rank2 < k)
        r1, r2 = rank1.clamp(max=k), rank2.clamp(max=k)  # slot k collects the overflow, then is cut
        env = torch.where(keep, graph.safe_norm(disp) / float(self.dims.radius), torch.full_like(dist, torch.inf))

        slot_node = nodes[:, None].expand(n, k + 1)
        slot_rank = torch.arange(k + 1, device=device)[None, :].expand(n, k + 1)
        padded_disp = vec.new_zeros(n, k + 1, 3).index_put((centre, r1), disp)
        src_env = vec.new_full((n, k + 1), torch.inf).index_put((centre, r1), env)
        dst_env = vec.new_full((n, k + 1), torch.inf).index_put((neigh, r2), env)
        src_index = torch.stack(
            [
                slot_node.index_put((centre, r1), torch.where(keep, neigh, centre)),
                slot_rank.index_put((centre, r1), torch.where(keep, r2, r1)),
            ]
        )[:, :, :k]
        dst_index = torch.stack(
            [
                slot_node.index_put((neigh, r2), torch.where(keep, centre, neigh)),
                slot_rank.index_put((neigh, r2), torch.where(keep, r1, r2)),
            ]
        )[:, :, :k]
        padded_disp, src_env, dst_env = padded_disp[:, :k], src_env[:, :k], dst_env[:, :k]
        neighbor_index = torch.stack([slot_node[:, :k], slot_node[:, :k]])  # only row 0 (the centre) is read

        gnn, mg, glob = cfg.gnn_cfg, cfg.molecular_graph_cfg, cfg.global_cfg
        direction = graph.safe_normalize(padded_disp)
        distance = graph.safe_norm(padded_disp)
        src_mask = graph.envelope_fn(src_env, mg.use_envelope)
        dst_mask = graph.envelope_fn(dst_env, mg.use_envelope)
        harmonics = prep._spherical_harmonics(
            gnn.edge_direction_expansion_size - 1, direction[..., 0], direction[..., 1], direction[..., 2]
        )
        _, base_mask, _ = prep.get_node_attention_mask(inputs.batch, None, use_sincx_mask=False)
        return self._types.GraphAttentionData(
            atomic_numbers=inputs.x[:, 0].long(),
            charge=_system_ints(inputs, self.config.charge_index),
            spin=_system_ints(inputs, self.config.spin_index),
            node_direction_expansion=self._bond_order(direction, src_mask != -torch.inf),
            edge_distance_expansion=_call_in(torch.float32, self.distance_expansion, "forward", distance).view(
                n, k, gnn.edge_distance_expansion_size
            ),
            edge_direction_expansion=harmonics,
            edge_direction=direction,
            src_neighbor_attn_mask=src_mask,
            dst_neighbor_attn_mask=dst_mask,
            src_index=src_index,
            dst_index=dst_index,
            frequency_vectors=prep.get_frequency_vectors(glob, gnn, direction) if gnn.use_freq_mask else None,
            node_base_attn_mask=base_mask if glob.use_node_path else None,
            node_sincx_matrix=None,
            node_valid_mask=None,
            neighbor_index=neighbor_index,
            node_batch=inputs.batch,
            node_padding_mask=torch.ones(n, device=device),
            max_batch_size=inputs.num_graphs,
            num_graphs=inputs.num_graphs,
            max_num_nodes=n,
            num_nodes=n,
        )

    def forward(self, inputs: GraphInputs) -> NodeEmbedding:
        """``x[:, 0]`` atomic numbers, ``edge_vec [E, 3]`` -> ``scalar [N, hidden_dim]`` (input dtype)."""
        if inputs.edge_vec is None:
            raise ModelError("AllScAIP needs positions: GraphInputs.edge_vec is None")
        data = self._neighbor_layout(inputs)
        # the math attention kernel: the CPU flash kernel has no double backward (training on forces)
        with torch.autocast(device_type=inputs.x.device.type, enabled=False), sdpa_kernel(SDPBackend.MATH):
            node_reps = _call_in(torch.float32, self.backbone, "compiled_forward", data)["node_reps"]
        return NodeEmbedding(scalar=node_reps.to(inputs.x.dtype))

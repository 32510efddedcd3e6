"""UMA (``mpnn_type: "UMA"``, extra ``hydra-models[fairchem]``): FAIR Chemistry's backbone run as a
HydraGNN encoder: ``eSCNMDBackbone`` (eSEN-style SO(2) equivariant convolutions),
or ``eSCNMDMoeBackbone`` (its mixture of linear experts, MoLE) when ``num_experts > 0``. The
backbone does not build edges: a subclass replaces its ``_generate_graph`` with HydraGNN's
``edge_index`` and ``edge_vec`` (same convention: ``pos[src] - pos[dst] + shift``), so forces
(``-dE/dpos``) and stress (the strain applied to ``pos`` and ``edge_shift``) reach every edge.
Output: ``scalar`` = the ``l = 0`` coefficients ``[N, hidden_dim]``, ``vector`` = the ``l = 1``
block ``[N, 3, hidden_dim]`` (fairchem's ``l = 1`` components are already ``(x, y, z)``).

System-level inputs (select the experts and add a per-system embedding to every atom): charge and
spin from columns ``charge_index`` / ``spin_index`` of the schema's graph inputs (rounded to
integers), else 0. fairchem's dataset embedding is off (HydraGNN batches carry no dataset names).

Capture safety: UMA with ``num_experts = 0`` and ``chg_spin_emb_type = "rand_emb"`` has no host
synchronisation (the conformance check passes). With experts it is not capture-safe: fairchem's
``MOLE.forward`` splits the edges per system with ``mole_sizes.cpu()`` and ``.tolist()`` (a
device synchronisation on CUDA that the CPU check cannot see), and needs the edges grouped by
system in batch order (as collated batches and the sink padding have them).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ..encoder_configs.fairchem import UMAConfig
from ..errors import ModelConfigError, ModelError
from ._fairchem import ROOT, _call_in, _check_common, _compute_dtype, _import, _system_ints, _SystemDict
from .base import Encoder, EncoderDims, GraphInputs, NodeEmbedding, register_encoder

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

    hops_beyond_layers = None  # fairchem's backbone, not checked for locality

    Config = UMAConfig
    config: UMAConfig
    equivariant = True
    needs_pos = True
    supports_layer_mixing = False
    optional_dependency = "fairchem"

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
        self.backbone.random_roll = config.random_roll  # pyright: ignore[reportArgumentType]  # nn.Module.__setattr__ is typed Tensor | Module; it stores any value

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

"""AllScAIP (``mpnn_type: "AllScAIP"``, extra ``hydra-models[fairchem]``): ``AllScAIPBackbone``'s input block and graph-attention
blocks (neighbourhood self-attention over each atom's neighbours, in both edge directions, and
all-to-all node attention within each graph). fairchem's preprocessing (its own bi-kNN radius
graph from ``pos`` and ``cell``) is replaced by a capture-safe conversion of HydraGNN's edges to
its dense neighbour layout ``[N, max_neighbor_slots]``: a self-loop first (slot 0 is the node),
then the neighbours nearest first; the envelope is ``envelope(d / radius)`` (no soft-kNN rank
term), the bond-orientational order weights neighbours by that envelope (fairchem counts every
neighbour inside the radius, so its energy jumps when an atom crosses the cutoff; here it is
continuous). The sinc distance kernel of node
attention (``use_sincx_mask``) reads every pairwise distance within a graph, at the minimum image
in periodic cells, computed here from ``pos`` / ``cell`` (a radius graph does not carry them). It
is rotation-, translation- and permutation-invariant with the default
``edge_direction_expansion_size: 1``: the raw edge harmonics then carry only l = 0, and direction
enters through the frequency-masked attention (``q . k`` sums over m) and the bond-orientational
order. Larger values (fairchem's choice: 6, with rotation augmentation in training) add raw
l >= 1 harmonics to the edge features and break rotation invariance. It computes in float32
whatever the model precision (fairchem's frequency features are float32).

Capture safety: its layers and this module's neighbour layout have no host synchronisation
(the conformance check passes).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from ..encoder_configs.fairchem import AllScAIPConfig
from ..errors import ModelConfigError, ModelError
from ..nn.geometry import pair_geometry
from ..nn.scatter import rank_in_group
from ._fairchem import ROOT, _call_in, _check_common, _import, _system_ints
from .base import Encoder, EncoderDims, GraphInputs, NodeEmbedding, register_encoder

BOND_ORDER_EPS = 1e-3
"""``q_l = sqrt(s_l + eps^2) - eps``: smooth where fairchem's ``sqrt(max(s_l, eps^2))`` has a kink."""


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


@register_encoder("AllScAIP")
class AllScAIPEncoder(Encoder):
    """AllScAIP (fairchem ``AllScAIPBackbone``) on HydraGNN's edges (invariant output, float32)."""

    hops_beyond_layers = None  # all-pairs attention

    Config = AllScAIPConfig
    config: AllScAIPConfig
    sh_degree: torch.Tensor
    sinc_omega: torch.Tensor
    equivariant = False
    needs_pos = True
    supports_layer_mixing = False
    optional_dependency = "fairchem"

    # fairchem's helper modules, looked up on use (a module attribute would make the model
    # impossible to deepcopy or pickle: EMA copies, exports)
    @property
    def _prep(self) -> Any:
        return _import("fairchem.core.models.allscaip.utils.data_preprocess", "AllScAIP")

    @property
    def _types(self) -> Any:
        return _import("fairchem.core.models.allscaip.custom_types", "AllScAIP")

    @property
    def _graph(self) -> Any:
        return _import("fairchem.core.models.escaip.utils.radius_graph", "AllScAIP")

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
                use_sincx_mask=config.use_sincx_mask,
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
        # fairchem's get_node_attention_mask frequencies (n_freq 32, r_min 0.25 Å, r_max 30 Å)
        omega = torch.logspace(math.log10(math.pi / 120.0), math.log10(math.pi / 0.25), 32, dtype=torch.float32)
        self.register_buffer("sinc_omega", omega, persistent=False)

    def _bond_order(self, direction: torch.Tensor, log_envelope: torch.Tensor) -> torch.Tensor:
        """Bond-orientational order ``[N, lmax + 1]`` of each atom's neighbour directions ``[N, K, 3]``.

        fairchem's ``get_node_direction_expansion_neighbor`` (Steinhardt ``q_l``) made smooth:
        neighbours are weighted by their envelope ``exp(log_envelope)`` (1 for the self-loop, 0
        at the cutoff) instead of counted, so ``q_l`` does not jump when an atom crosses the
        radius, and ``q_l = sqrt(s_l + 1e-6) - 1e-3`` instead of ``sqrt(max(s_l, 1e-6))``, which
        has a kink. No host synchronisation.
        """
        lmax = self.config.node_direction_expansion_size - 1
        sh = self._prep._spherical_harmonics(lmax, direction[..., 0], direction[..., 1], direction[..., 2])
        sh = sh / torch.sqrt(2.0 * self.sh_degree + 1.0).to(sh.dtype)
        weight = torch.exp(log_envelope).to(sh.dtype).unsqueeze(-1)  # [N, K, 1], exp(-inf) = 0
        mean = (sh * weight).sum(1) / weight.sum(1)  # the self-loop has weight 1
        squared = mean.new_zeros(mean.shape[0], lmax + 1).index_add(1, self.sh_degree, mean.square())
        return torch.sqrt(squared + BOND_ORDER_EPS**2) - BOND_ORDER_EPS

    def _sinc_kernel(self, inputs: GraphInputs) -> tuple[torch.Tensor, torch.Tensor]:
        """fairchem's node-attention sinc kernel ``[N, N, 32]`` and the same-graph mask ``[N, N]``.

        Pairwise distances are taken at the minimum image of periodic cells (as fairchem's
        ``min`` over images); ``sin(x) / x`` uses its Taylor series below ``x = 1e-4`` through
        ``torch.where`` (fairchem indexes with a boolean mask, a host synchronisation).
        """
        assert inputs.pos is not None  # forward checked edge_vec, computed from the positions
        dist, _, same = pair_geometry(inputs.pos, inputs.batch, torch.float32, inputs.cell, inputs.pbc)
        x = dist.unsqueeze(-1) * self.sinc_omega.to(dist.dtype)  # [N, N, K] (the buffer follows the model dtype)
        small = x.abs() < 1e-4
        safe = torch.where(small, torch.ones_like(x), x)
        x2 = x * x
        return torch.where(small, 1.0 - x2 / 6.0 + x2 * x2 / 120.0, torch.sin(safe) / safe), same

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
        assert inputs.edge_vec is not None  # forward checked it
        vec = inputs.edge_vec.float()
        disp = torch.cat([vec.new_zeros(n, 3), vec])
        dist = disp.square().sum(-1).clamp_min(1e-24).sqrt().detach()  # ranking only
        rank1 = rank_in_group(centre, dist, n)  # slot in the centre's (source) layout
        rank2 = rank_in_group(neigh, dist, n)  # slot in the neighbour's (destination) layout
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
        sincx, valid = self._sinc_kernel(inputs) if self.backbone.gnn_cfg.use_sincx_mask else (None, None)
        return self._types.GraphAttentionData(
            atomic_numbers=inputs.x[:, 0].long(),
            charge=_system_ints(inputs, self.config.charge_index),
            spin=_system_ints(inputs, self.config.spin_index),
            node_direction_expansion=self._bond_order(direction, src_mask),
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
            node_sincx_matrix=sincx,
            node_valid_mask=valid,
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

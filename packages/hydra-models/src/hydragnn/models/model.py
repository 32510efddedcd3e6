"""``HydraModel`` and ``build_model``: one shared encoder, one head per output variable.

``HydraModel.forward(batch)`` reads the prepared-batch contract (``x``, ``pos``,
``edge_index``, ``edge_shift``, ``cell``, ``pbc``, ``edge_attr``, ``graph_attr``, ``batch``),
computes the edge geometry from ``pos`` (so autograd reaches every edge), runs the encoder and
the heads, and returns ``{output name: tensor}``: graph outputs ``[B, dim]``, node outputs
``[N, dim]``, edge outputs ``[E, dim]``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import cast

import hydragnn.data.pyg_import  # noqa: F401 (PyG as HydraGNN needs it)

import torch
from torch import nn
from torch_geometric.data import Batch, Data

from hydragnn.data import Schema

from .config import ModelConfig
from .derivatives import DERIVATIVES, EnergyDerivatives, set_derivatives
from .encoders import EncoderDims, GraphInputs, NodeEmbedding, get_encoder
from .errors import ModelConfigError, ModelError
from .heads import GRAPH_HEAD_INPUT, EdgeHeads, GraphHeads, NodeHeads
from .loss import compute_loss
from .mlip import EnergyHead, dynamic_edges, strain, stress_from_virial
from .nn.geometry import safe_norm
from .output_scaling import OutputScaling
from .schema_checks import check_conditioning, mlip_roles, num_species, task_weights

ROOT = "NeuralNetwork.Architecture"


def _num_graphs(batch: Data) -> int:
    """B as a Python int (from ``_num_graphs`` or ``ptr``: no device sync for a collated Batch)."""
    if isinstance(batch, Batch):
        return int(batch.num_graphs)
    return 1


def _node_batch(batch: Data, like: torch.Tensor) -> torch.Tensor:
    """``batch.batch [N]``, or zeros for a single graph."""
    node_batch = getattr(batch, "batch", None)
    if node_batch is None:
        node_batch = torch.zeros(like.shape[0], dtype=torch.long, device=like.device)
    return node_batch


class HydraModel(nn.Module):
    """A multi-headed model: encoder + graph / node / edge heads (+ MLIP energy and forces).

    Build it with :func:`build_model`. Attributes: ``config`` (:class:`ModelConfig`),
    ``schema``, ``encoder``, ``task_weights`` (``{output: weight}``), ``derivatives`` (the
    :class:`~.derivatives.EnergyDerivatives` module that takes a potential's forces and stress:
    its engine, :attr:`derivatives_by`, is an execution choice, set with :func:`set_derivatives`).
    """

    def __init__(self, config: ModelConfig, schema: Schema) -> None:
        super().__init__()
        self.derivatives = EnergyDerivatives()
        if not schema.has_outputs:
            raise ModelConfigError(
                "Variables.outputs: a model needs at least one output to predict and train on; the schema "
                "declares none (a schema without outputs only prepares samples for prediction)"
            )
        if config.committee != 1:
            raise ModelConfigError(
                f"{ROOT}.committee: a HydraModel is one member; build a committee of {config.committee} with build_model"
            )
        self.config = config
        self.schema = schema
        self.mlip = config.mlip.enabled
        self.geometric = schema.position is not None
        encoder_cls = get_encoder(config.mpnn_type) if config.mpnn_type is not None else None
        if encoder_cls is not None and encoder_cls.needs_pos and not self.geometric:
            raise ModelConfigError(
                f"{ROOT}.mpnn_type: {config.mpnn_type} needs positions; the schema has no 'pos' input"
            )
        special = mlip_roles(config, schema) if self.mlip else {}
        if schema.outputs_at("edge") and self.mlip and config.mlip.dynamic_graph:
            raise ModelConfigError(f"{ROOT}.dynamic_graph: edge outputs need the dataset's edges, not dynamic ones")
        if schema.feature_inputs("edge") and self.mlip and config.mlip.dynamic_graph:
            raise ModelConfigError(f"{ROOT}.dynamic_graph: edge inputs need the dataset's edges, not dynamic ones")
        self.special = special  # role -> output name for the MLIP outputs
        self.output_scaling = OutputScaling(config, schema, special)
        self.dims = EncoderDims(
            node_in=schema.input_dim("node"),
            edge_in=schema.input_dim("edge"),
            graph_in=schema.input_dim("graph"),
            hidden_dim=config.hidden_dim,
            num_conv_layers=config.num_conv_layers,
            radius=config.radius,
            max_neighbours=config.max_neighbours,
            num_radial=config.num_radial,
            num_species=num_species(config, schema),
            conv_checkpointing=config.conv_checkpointing,
            vector_output=config.attention.engine == "EquivariantTransformer",
        )
        check_conditioning(config, schema, self.dims.graph_in, special)
        self.global_stage: nn.Module | None = None
        if config.attention.engine == "EquivariantTransformer":
            if not self.geometric:
                raise ModelConfigError(f"{ROOT}.global_attn_engine: EquivariantTransformer needs positions")
            from .attention.equivariant_transformer import EquivariantTransformer

            if encoder_cls is None:  # standalone: the transformer is the encoder
                self.encoder = EquivariantTransformer(self.dims, config, local=None)
            else:
                self.encoder = encoder_cls(self.dims, config.encoder)
                self.global_stage = EquivariantTransformer(self.dims, config, local=self.encoder)
        else:
            assert encoder_cls is not None  # mpnn_type is null only for a standalone EquivariantTransformer
            self.encoder = encoder_cls(self.dims, config.encoder)
        if config.attention.engine == "GPS":
            from .attention.gps import build_gps_mixers

            self.encoder.mixers = build_gps_mixers(config, self.dims)
        self.conditioning: nn.Module | None = None
        if config.conditioning.enabled and config.conditioning.mode != "fuse_pool":
            from .conditioning import NodeConditioning

            self.conditioning = NodeConditioning(
                config.conditioning.mode, config.hidden_dim, self.dims.graph_in, config.activation
            )
        self._build_heads(config, schema, special)
        self.task_weights = task_weights(config, schema, special)
        self.head_weights: torch.Tensor | None = None  # [K] loss weight of each energy head's structures

    def _build_heads(self, config: ModelConfig, schema: Schema, special: dict[str, str]) -> None:
        """The graph, node and edge heads of the schema's outputs (those not played by an MLIP
        role) and the MLIP energy head, built in that order (their weights draw from the RNG)."""
        cutoff = config.radius if self.geometric else None
        heads, act = config.output_heads, config.activation
        taken = set(special.values())
        graph_outs = [(v.name, v.dim) for v in schema.outputs_at("graph") if v.name not in taken]
        node_outs = [(v.name, v.dim) for v in schema.outputs_at("node") if v.name not in taken]
        edge_outs = [(v.name, v.dim) for v in schema.outputs_at("edge")]
        H = config.hidden_dim
        self.graph_heads = (
            GraphHeads(
                H,
                self.dims.graph_in,
                graph_outs,
                heads.graph,
                config.graph_pooling,
                act,
                fuse_graph_attr=config.conditioning.enabled and config.conditioning.mode == "fuse_pool",
            )
            if graph_outs
            else None
        )
        self.node_heads = NodeHeads(H, node_outs, heads.node, act, cutoff) if node_outs else None
        self.edge_heads = (
            EdgeHeads(H, self.dims.edge_in, self.geometric, edge_outs, heads.edge, act) if edge_outs else None
        )
        self.energy_head = (
            EnergyHead(
                H,
                heads.node,
                act,
                cutoff,
                config.mlip.head_specs(),
                config.mlip.trainable_reference_energies,
                layer_readouts=config.num_conv_layers - 1 if config.mlip.energy_layer_readout else 0,
                zbl=config.mlip.zbl,
            )
            if self.mlip
            else None
        )

    # ------------------------------------------------------------------ properties
    @property
    def dtype(self) -> torch.dtype:
        """The parameter dtype: ``precision``, or whatever ``model.to(dtype)`` set since."""
        for param in self.parameters():
            if param.is_floating_point():
                return param.dtype
        return self.config.dtype

    @property
    def geometry_dtype(self) -> torch.dtype:
        """Positions and edge vectors: float32 for a bf16 model, else the model dtype."""
        return torch.float32 if self.dtype == torch.bfloat16 else self.dtype

    @property
    def cutoff(self) -> float:
        return self.config.radius

    # ------------------------------------------------------------------ forward
    def graph_inputs(
        self,
        batch: Data,
        pos: torch.Tensor | None,
        edge_index: torch.Tensor,
        edge_shift: torch.Tensor | None,
        cell: torch.Tensor | None = None,
    ) -> GraphInputs:
        """The encoder inputs: edge geometry ``edge_vec = pos[src] - pos[dst] + edge_shift``.

        Args:
            batch: the prepared batch (``x``, ``batch``, ``edge_attr``, ``graph_attr`` are read).
            pos: ``[N, 3]`` positions in :attr:`geometry_dtype`, or ``None``.
            edge_index: ``[2, E]``.
            edge_shift: ``[E, 3]`` or ``None``.
            cell: ``[B, 3, 3]`` (the strained cell when computing stress); default ``batch.cell``.
        """
        dtype = self.dtype
        x = cast(torch.Tensor, batch.x).to(dtype)  # the prepared-batch contract: x is always there
        edge_vec = edge_len = None
        if pos is not None:
            edge_vec = pos.index_select(0, edge_index[0]) - pos.index_select(0, edge_index[1])
            if edge_shift is not None:
                edge_vec = edge_vec + edge_shift.to(edge_vec.dtype)
            edge_len = safe_norm(edge_vec).to(dtype)
            edge_vec = edge_vec.to(dtype)
        node_batch = _node_batch(batch, x)
        edge_attr = cast(torch.Tensor, batch.edge_attr).to(dtype) if self.dims.edge_in else None  # edge inputs
        graph_attr = batch.graph_attr.to(dtype) if self.dims.graph_in else None
        if cell is None:
            cell = getattr(batch, "cell", None)
        pbc = getattr(batch, "pbc", None)
        if cell is not None:
            cell = cell.reshape(-1, 3, 3)
            pbc = torch.ones(cell.shape[0], 3, dtype=torch.bool, device=cell.device) if pbc is None else pbc
            pbc = pbc.reshape(-1, 3).to(torch.bool)
        pe = None
        if self.config.attention.pe_dim:
            lap, rw = getattr(batch, "lap_pe", None), getattr(batch, "rw_pe", None)
            k = self.config.attention.pe_dim
            if lap is None or rw is None or lap.shape[-1] != k or rw.shape[-1] != k:
                raise ModelError(
                    f"{ROOT}.pe_dim is {k}: the batch needs 'lap_pe' and 'rw_pe' [N, {k}] "
                    "(prepare the data with hydragnn.data.add_positional_encodings(data, pe_dim))"
                )
            pe = torch.cat([lap, rw], dim=-1).to(dtype)
        return GraphInputs(
            x=x,
            pos=pos.to(dtype) if pos is not None else None,
            edge_index=edge_index,
            edge_vec=edge_vec,
            edge_len=edge_len,
            edge_attr=edge_attr,
            batch=node_batch,
            num_graphs=_num_graphs(batch),
            graph_attr=graph_attr,
            pe=pe,
            cell=cell.to(dtype) if cell is not None else None,
            pbc=pbc,
        )

    def encode(self, inputs: GraphInputs) -> NodeEmbedding:
        """Node embeddings: the encoder (with GPS mixers), the equivariant transformer stage
        and graph-attribute conditioning, in that order."""
        emb = self.encoder(inputs)
        if self.global_stage is not None:
            emb = self.global_stage(inputs, emb)
        if self.conditioning is not None:
            emb = NodeEmbedding(scalar=self.conditioning(emb.scalar, inputs), vector=emb.vector)
        return emb

    def heads(self, emb: NodeEmbedding, inputs: GraphInputs) -> dict[str, torch.Tensor]:
        """Every non-MLIP head: ``{name: prediction}``."""
        out: dict[str, torch.Tensor] = {}
        for heads in (self.graph_heads, self.node_heads, self.edge_heads):
            if heads is not None:
                out.update(heads(emb.scalar, inputs))
        return out

    def forward(
        self,
        batch: Data,
        *,
        compute_forces: bool | None = None,
        compute_stress: bool | None = None,
    ) -> dict[str, torch.Tensor]:
        """Predict every output variable.

        Args:
            batch: a prepared PyG ``Batch`` (or one ``Data``).
            compute_forces: MLIP only: return forces (default: when the schema has them).
            compute_stress: MLIP only: return stress ``[B, 6]`` Voigt (default: when the schema
                has a stress output and the batch has a ``cell``); needs ``cell``.

        Returns:
            ``{name: tensor}`` for every output of the schema (plus forces / stress when asked).
            Called under ``torch.no_grad()``, the outputs are detached. Forces and stress are
            differentiable (``create_graph``) only in training mode.
        """
        out = self._predict(batch, compute_forces, compute_stress)
        rows = out.pop(GRAPH_HEAD_INPUT, None)
        if rows is not None and self.graph_heads is not None:  # training: after every derivative
            self.graph_heads.update_statistics(rows)
        return out

    def _predict(
        self, batch: Data, compute_forces: bool | None, compute_stress: bool | None
    ) -> dict[str, torch.Tensor]:
        """:meth:`forward`'s outputs, with :data:`~.heads.GRAPH_HEAD_INPUT` in training mode."""
        outer_grad = torch.is_grad_enabled()
        pos = cast(torch.Tensor, batch.pos).to(self.geometry_dtype) if self.geometric else None  # (a 'pos' input)
        edge_index = getattr(batch, "edge_index", None)
        edge_shift = getattr(batch, "edge_shift", None)
        if self.mlip and (self.config.mlip.dynamic_graph or edge_index is None):
            assert pos is not None  # an interatomic potential has positions (mlip_roles checks)
            edge_index, edge_shift = dynamic_edges(
                pos,
                self.config.radius,
                getattr(batch, "batch", None),
                getattr(batch, "cell", None),
                getattr(batch, "pbc", None),
                self.config.max_neighbours,
            )
        if edge_index is None:
            raise ModelError("the batch has no 'edge_index' (build edges with hydragnn.data.neighbors.add_edges)")
        if not self.mlip:
            inputs = self.graph_inputs(batch, pos, edge_index, edge_shift)
            return self.output_scaling(self.heads(self.encode(inputs), inputs))

        assert pos is not None and self.energy_head is not None  # an interatomic potential (mlip_roles checks)
        special = self.special
        want_forces = self.config.mlip.compute_grad_energy and (
            compute_forces if compute_forces is not None else "forces" in special
        )
        has_cell = getattr(batch, "cell", None) is not None
        want_stress = self.config.mlip.compute_grad_energy and (
            compute_stress if compute_stress is not None else ("stress" in special and has_cell)
        )
        want_derivatives = want_forces or want_stress
        with torch.set_grad_enabled(outer_grad or want_derivatives):
            cell = getattr(batch, "cell", None)
            if want_stress:
                if cell is None:
                    raise ModelError("stress needs a periodic batch with 'cell' [B, 3, 3]")
                cell = cell.to(pos.dtype)
                edge_shift = edge_shift.to(pos.dtype) if edge_shift is not None else None
            node_batch = _node_batch(batch, pos)

            def potential(pos: torch.Tensor, displacement: torch.Tensor | None):
                return self._potential(batch, pos, displacement, node_batch, cell, edge_index, edge_shift)

            displacement = None
            if want_stress:
                displacement = torch.zeros(_num_graphs(batch), 3, 3, dtype=pos.dtype, device=pos.device)
            (out, atomic, energy), forces, virial = self.derivatives(
                potential,
                pos,
                displacement,
                wanted=want_derivatives,
                create_graph=self.training,
                retain_graph=outer_grad,
            )
            out[special["energy"]] = energy
            if "atomic_energy" in special:
                out[special["atomic_energy"]] = atomic
            if want_forces:
                assert forces is not None
                out[special.get("forces", self.config.mlip.forces_name)] = forces
            if want_stress:
                assert virial is not None and cell is not None  # strained, periodic
                name = special.get("stress", self.config.mlip.stress_name)
                dim = self.schema[name].dim if name in self.schema else 6
                out[name] = stress_from_virial(virial, cell, dim)
        if not outer_grad:
            out = {k: v.detach() for k, v in out.items()}
        return out

    def _potential(
        self,
        batch: Data,
        pos: torch.Tensor,
        displacement: torch.Tensor | None,
        node_batch: torch.Tensor,
        cell: torch.Tensor | None,
        edge_index: torch.Tensor,
        edge_shift: torch.Tensor | None,
    ) -> tuple[torch.Tensor, tuple[dict[str, torch.Tensor], torch.Tensor, torch.Tensor]]:
        """``(sum of energies, (outputs, atomic energies [N, 1], energies [B, 1]))`` of a potential
        at ``pos [N, 3]`` under the strain ``displacement [B, 3, 3]`` (``None``: unstrained), the
        function both ways of taking derivatives differentiate."""
        assert self.energy_head is not None  # (a potential)
        pos_in, strained_cell, shift = pos, None, edge_shift
        if displacement is not None:
            pos_in, strained_cell, shift = strain(pos, node_batch, cell, edge_index, edge_shift, displacement)
        inputs = self.graph_inputs(batch, pos_in, edge_index, shift, strained_cell)
        if self.energy_head.layers is not None:
            inputs.layer_features = []
        emb = self.encode(inputs)
        out = self.output_scaling(self.heads(emb, inputs))
        layers = inputs.layer_features[:-1] if inputs.layer_features else ()
        atomic, energy = self.energy_head(emb.scalar, inputs, getattr(batch, "head", None), layers)
        return energy.sum(), (out, atomic, energy)

    @property
    def derivatives_by(self) -> str:
        """The derivative engine of forces and stress (``"autograd"`` or ``"func"``, :mod:`.derivatives`)."""
        return self.derivatives.engine

    @property
    def energy_head_names(self) -> list[str]:
        """Names of the energy heads (``["default"]`` for a single one; empty without MLIP)."""
        return list(self.energy_head.names) if self.energy_head is not None else []

    def select_head(self, name: str) -> None:
        """Use energy head ``name`` for structures without a ``head`` attribute (serving).

        Raises:
            ModelError: an unknown head name.
        """
        names = self.energy_head_names
        if self.energy_head is None or name not in names:  # (names is empty without an energy head)
            raise ModelError(f"energy head {name!r}: this model has {names}")
        self.energy_head.default_head = names.index(name)

    def loss(self, outputs: Mapping[str, torch.Tensor], batch: Data) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Weighted loss of ``outputs`` against the batch targets (see :func:`compute_loss`); an
        interatomic potential's energy term is per atom unless ``energy_loss`` is ``"total"``;
        with :attr:`head_weights` set, each structure weighs as its energy head's weight."""
        per_atom = (self.special["energy"],) if self.mlip and self.config.loss.energy_loss == "per_atom" else ()
        weights = None
        head = getattr(batch, "head", None)
        if self.head_weights is not None and head is not None:
            weights = self.head_weights.to(head.device)[head.reshape(-1).long()]
        return compute_loss(
            outputs,
            batch,
            self.schema,
            task_weights=self.task_weights,
            loss_type=self.config.loss.function,
            huber_delta=self.config.loss.huber_delta,
            per_atom=per_atom,
            graph_weights=weights,
            scales=self.output_scaling.scales(),
        )


__all__ = ["DERIVATIVES", "HydraModel", "set_derivatives"]

"""The encoder contract: what every message-passing stack receives and returns.

An encoder turns a prepared graph into per-node embeddings. It never sees targets, and it
never builds edges itself: :class:`GraphInputs` hands it edges with their geometry already
computed (``edge_vec = pos[src] - pos[dst] + edge_shift``), so that forces by autograd see
every edge through ``pos``.

Capture-safe forward (DESIGN.md, Contract 2): no ``.item()``, ``.cpu()``, data-dependent
shapes, boolean-mask indexing or ``torch.unique`` inside ``forward``; reductions use explicit
sizes (``num_nodes``, ``num_graphs``) taken from Python ints carried by :class:`GraphInputs`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Generic, TypeVar

import torch
from torch import nn

from ..encoder_configs import ENCODER_CONFIGS, EncoderConfig, EncoderEntry, add_encoder_config, unknown_encoder


@dataclass
class GraphInputs:
    """Everything an encoder may read, for a batch of B graphs with N nodes and E edges.

    Attributes:
        x: node features ``[N, F]`` (the schema's node inputs, e.g. atomic number).
        pos: positions ``[N, 3]`` or ``None`` for non-geometric data.
        edge_index: ``[2, E]`` int64, ``edge_index[0]`` = source j, ``edge_index[1]`` = target i.
        edge_vec: ``[E, 3]`` vector from target to source image, or ``None`` without ``pos``.
        edge_len: ``[E]`` length of ``edge_vec``, or ``None`` without ``pos``.
        edge_attr: ``[E, Fe]`` edge inputs from the schema, or ``None``.
        batch: ``[N]`` int64 graph index of each node.
        num_graphs: B (a Python int: no device sync).
        graph_attr: ``[B, G]`` graph inputs from the schema, or ``None``.
        cell: ``[B, 3, 3]`` lattice vectors as rows (strained with the positions when the model
            computes stress), or ``None`` for non-periodic batches. Encoders that work on edges
            never need it (``edge_vec`` already contains the image offsets); an all-to-all stage
            uses it for minimum-image pair vectors.
        pbc: ``[B, 3]`` bool periodic directions, or ``None``.
        pe: ``[N, 2 * pe_dim]`` positional encodings (Laplacian eigenvectors, then random-walk
            return probabilities) when the model has ``pe_dim > 0``, else ``None``.
        layer_features: a list the model passes when it reads every layer (the MLIP's
            ``energy_layer_readout``): :meth:`Encoder.mix` appends each conv layer's invariant
            output ``[N, H]`` to it, in layer order; ``None`` otherwise.
    """

    x: torch.Tensor
    pos: torch.Tensor | None
    edge_index: torch.Tensor
    edge_vec: torch.Tensor | None
    edge_len: torch.Tensor | None
    edge_attr: torch.Tensor | None
    batch: torch.Tensor
    num_graphs: int
    graph_attr: torch.Tensor | None = None
    pe: torch.Tensor | None = None
    cell: torch.Tensor | None = None
    pbc: torch.Tensor | None = None
    layer_features: list[torch.Tensor] | None = None

    @property
    def num_nodes(self) -> int:
        return self.x.shape[0]


@dataclass
class NodeEmbedding:
    """The output of an encoder.

    Attributes:
        scalar: rotation-invariant node features ``[N, hidden_dim]``.
        vector: rotation-equivariant l=1 features ``[N, 3, C]`` of equivariant encoders, else None.
    """

    scalar: torch.Tensor
    vector: torch.Tensor | None = None


@dataclass(frozen=True)
class EncoderDims:
    """Sizes the model hands to every encoder (from the schema and the common config)."""

    node_in: int
    edge_in: int
    graph_in: int
    hidden_dim: int
    num_conv_layers: int
    radius: float
    max_neighbours: int | None
    num_radial: int
    num_species: int
    conv_checkpointing: bool = False
    vector_output: bool = True
    """Whether a later stage reads ``NodeEmbedding.vector`` (the model: only the
    EquivariantTransformer; no head does). An encoder may skip vectors nothing else needs."""


ConfigT = TypeVar("ConfigT", bound=EncoderConfig)
"""An encoder's own config class (``Encoder[SchNetConfig]``): what its hooks receive."""


class Encoder(nn.Module, Generic[ConfigT]):
    """Base class of message-passing stacks, generic in their config class.

    Subclasses set ``Config`` (their :class:`EncoderConfig` subclass, defined and registered
    torch-free in :mod:`hydragnn.models.encoder_configs` for the built-in encoders), ``equivariant``
    (True when they return ``NodeEmbedding.vector``), ``needs_pos`` (True when they use geometry)
    and implement ``__init__(dims, config)`` and :meth:`forward`.
    """

    Config: ClassVar[type[EncoderConfig]] = EncoderConfig
    equivariant: ClassVar[bool] = False
    needs_pos: ClassVar[bool] = True
    optional_dependency: ClassVar[str | None] = None
    """The ``hydra-models`` extra providing this encoder's backend (e.g. ``"fairchem"``), or None."""
    hops_beyond_layers: ClassVar[int | None] = 0
    """Neighbour shells an atom's embedding depends on beyond ``num_conv_layers`` (DimeNet's
    embedding block reads one: 1), or ``None`` when no finite number bounds it (a backbone that
    attends to every atom). :func:`hydragnn.models.locality.receptive_field` reads it; the
    locality check (:func:`hydragnn.models.testing.check_locality`) proves it per encoder."""
    capture_safe: bool = True
    """False when ``forward`` synchronises with the host or has data-dependent shapes (e.g. a
    third-party backbone): hydra-infer then serves the model without CUDA-graph capture."""
    supports_layer_mixing: ClassVar[bool] = True
    """False when the per-layer state is not a node embedding (DimeNet's live on edges): a
    global attention engine that mixes every layer (GPS) refuses such an encoder. The config
    registry records it too (config checks read it without torch); registration checks they agree."""

    @classmethod
    def data_statistics(cls, config: ConfigT, trainset: Sequence[Any]) -> dict[str, Any]:
        """``Architecture`` keys to fill from the training set before the model is built.

        ``trainset``: prepared samples (``edge_index [2, E]``, ``num_nodes``, ...). Returns
        ``{key: JSON value}`` for the statistics ``config`` leaves unset (``{}`` when it sets
        them all); the trainer merges them into the section, so the artifact stores them and
        rebuilds the same model. Computed once from the whole training split, the same on every
        rank, never in ``forward``. Default: no statistics. PNA / PNAPlus return their degree
        histogram (``pna_deg``); an average neighbour count (MACE's ``avg_num_neighbors``) is
        the kind of value this hook is for.
        """
        return {}

    def __init__(self, dims: EncoderDims, config: ConfigT) -> None:
        super().__init__()
        self.dims = dims
        self.config: ConfigT = config
        self.mixers: nn.ModuleList | None = None
        """One module per conv layer, set by the model when a global attention engine (GPS)
        wraps this encoder; see :meth:`mix`."""

    @property
    def vector_channels(self) -> int:
        """C of ``NodeEmbedding.vector [N, 3, C]``: 0 for an invariant encoder, else the config's
        ``num_vector_channels`` when it has one, else ``hidden_dim`` (override otherwise)."""
        if not self.equivariant:
            return 0
        return getattr(self.config, "num_vector_channels", None) or self.dims.hidden_dim

    def mix(self, layer: int, h_in: torch.Tensor, h_local: torch.Tensor, inputs: GraphInputs) -> torch.Tensor:
        """Combine conv layer ``layer``'s invariant input ``h_in [N, H]`` with its local update
        ``h_local [N, H]``: identity without :attr:`mixers`, else ``mixers[layer](h_in, h_local, inputs)``.

        Every encoder calls this after each conv layer, outside activation checkpointing, with
        its rotation-invariant node channels only (equivariant channels stay with the encoder).
        The result is also appended to ``inputs.layer_features`` when that is a list.
        """
        h = h_local if self.mixers is None else self.mixers[layer](h_in, h_local, inputs)
        if inputs.layer_features is not None:
            inputs.layer_features.append(h)
        return h

    def forward(self, inputs: GraphInputs) -> NodeEmbedding:  # pragma: no cover - abstract
        raise NotImplementedError


_EncoderT = TypeVar("_EncoderT", bound=Encoder)

ENCODERS: dict[str, type[Encoder]] = {}
"""The registry: ``mpnn_type`` -> encoder class."""


def register_encoder(name: str) -> Callable[[type[_EncoderT]], type[_EncoderT]]:
    """Class decorator adding an encoder to :data:`ENCODERS` under ``name``.

    Its ``Config`` and capabilities must be those of the config registry's entry
    (:data:`hydragnn.models.encoder_configs.ENCODER_CONFIGS`, torch-free) of the same name; an
    encoder without an entry (one defined outside hydra-models) gets one from its class.
    """

    def deco(cls: type[_EncoderT]) -> type[_EncoderT]:
        if name in ENCODERS:
            raise ValueError(f"encoder {name!r} registered twice ({ENCODERS[name].__name__}, {cls.__name__})")
        entry = EncoderEntry(name, cls.Config, cls.supports_layer_mixing)
        if name not in ENCODER_CONFIGS:
            add_encoder_config(entry)
        elif ENCODER_CONFIGS[name] != entry:
            raise ValueError(
                f"encoder {name!r}: {cls.__name__} (Config {cls.Config.__name__}, supports_layer_mixing "
                f"{cls.supports_layer_mixing}) disagrees with its config registry entry {ENCODER_CONFIGS[name]}"
            )
        ENCODERS[name] = cls
        return cls

    return deco


def get_encoder(name: str) -> type[Encoder]:
    """Look up ``mpnn_type``; unknown names give a :class:`ModelConfigError` listing the known ones."""
    try:
        return ENCODERS[name]
    except KeyError:
        raise unknown_encoder(name, ENCODERS) from None

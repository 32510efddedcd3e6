"""What every static-buffer engine shares: the capture-safe forward and the output extraction.

An engine owns static input buffers sized for one layout, a callable that runs the model on
them without host synchronisation, and the :class:`~.backends.Captured` graph of that callable.
Padding follows Contract 2: every padded node and edge lives in a sink graph (index ``B`` of a
``B + 1`` graph batch); padded edges point sink -> sink, so the real outputs do not change.
"""

from __future__ import annotations

from typing import Any, cast

import torch

from hydragnn.models.committee import SPREAD_SUFFIX

from ..batching import model_batch
from ..inputs import CallInputs
from .backends import Captured, Outputs, tensor_bytes
from .host import EngineHost


def with_sink(
    pos: torch.Tensor, numbers: torch.Tensor, batch: torch.Tensor, sink_graph: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``pos [M + 1, 3]``, ``numbers [M + 1]``, ``batch [M + 1]``: the static nodes and one sink node
    (at the origin, atomic number 0) in graph ``sink_graph``, the target of every padded edge."""
    return (
        torch.cat([pos, pos.new_zeros(1, 3)]),
        torch.cat([numbers, numbers.new_zeros(1)]),
        torch.cat([batch, batch.new_full((1,), sink_graph)]),
    )


def static_forward(model: Any, *, forces: bool, **fields: Any) -> Outputs:
    """The eager model on static tensors (energy, forces by ``autograd.grad``, every head).

    ``fields`` are :func:`~..batching.model_batch`'s, as on the regular path (without ``ptr``):
    ``pos [M, 3]``, ``numbers [M]`` (0 on padding) and ``batch [M]`` including the sink node(s),
    ``edge_index [2, E]`` including sink -> sink padding, ``num_graphs`` B + 1 (the last is the
    sink graph), ``graph_attr [B + 1, G]`` or ``None``, and for a periodic batch ``edge_shift
    [E, 3]`` (zeros on padding), ``cell [B + 1, 3, 3]`` (the sink graph's any invertible cell) and
    ``pbc [B + 1, 3]``. ``model`` is the eager model, never the compiled forward.
    """
    with torch.no_grad():
        return dict(model(model_batch(model, **fields), compute_forces=forces, compute_stress=False))


class StaticEngine:
    """Base of the dense, sparse and periodic engines.

    Attributes:
        key: the cache key of the layout the engine was built for.
        graph: the captured graph (``None`` before :meth:`capture`).
        buffers: static inputs and constant index tensors (``{name: tensor}``).
    """

    kind = "static"

    def __init__(self, host: EngineHost, key: tuple, forces: bool) -> None:
        self.key = key
        self.model = host.eager_model  # the kernel-patched copy when inference kernels are on
        self.info = host.info
        self.device = host.device
        self.dtype = host.dtype
        self.cutoff = float(host.info.cutoff)
        self.graph_inputs = host.info.graph_inputs
        self.forces = forces
        self.buffers: dict[str, torch.Tensor] = {}
        self.graph: Captured | None = None

    def add_graph_attr_buffer(self) -> None:
        """For a model with graph inputs: a ``graph_attr [num_graphs + 1, G]`` buffer (the sink graph's row stays 0)."""
        if self.graph_inputs:
            shape = (self.num_graphs + 1, len(self.graph_inputs))
            self.buffers["graph_attr"] = torch.zeros(shape, dtype=self.dtype, device=self.device)

    def forward(
        self, pos: torch.Tensor, numbers: torch.Tensor, batch: torch.Tensor, edge_index: torch.Tensor, **periodic: Any
    ) -> Outputs:
        """:func:`static_forward` of the engine's model on its ``num_graphs + 1`` graphs (sink included),
        with its graph-input buffer and force request; ``periodic``: ``edge_shift``, ``cell``, ``pbc``."""
        return static_forward(
            self.model,
            pos=pos,
            numbers=numbers,
            batch=batch,
            edge_index=edge_index,
            num_graphs=self.num_graphs + 1,
            graph_attr=self.buffers.get("graph_attr"),
            forces=self.forces,
            **periodic,
        )

    def load_graph_attr(self, call: CallInputs) -> None:
        """Copy the call's graph inputs into the buffer (rows beyond the call's ``B`` are zeroed)."""
        if "graph_attr" in self.buffers:
            self.buffers["graph_attr"].zero_()
            # a graph_attr buffer means the model has graph inputs, so the call gives a tensor
            graph_attr = cast(torch.Tensor, call.graph_attr(self.graph_inputs, self.dtype))
            self.buffers["graph_attr"][: call.num_graphs].copy_(graph_attr)

    # subclasses: allocate buffers in __init__, implement fn(), load(call), node_index(call)
    def fn(self) -> Outputs:  # pragma: no cover - abstract
        raise NotImplementedError

    def load(self, call: CallInputs) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    @property
    def static_bytes(self) -> int:
        return tensor_bytes(self.buffers)

    def capture(self, backend: Any) -> None:
        self.graph = backend.capture(self.fn, self.device)

    def release(self) -> None:
        if self.graph is not None:
            self.graph.release()
        self.graph = None
        self.buffers = {}

    def replay(self, call: CallInputs) -> Outputs:
        """Load ``call``, replay, and return copies of the real rows (the call's flat layout)."""
        self.load(call)
        return self.extract(cast(Captured, self.graph).replay(), call)  # captured before any replay

    def extract(self, outputs: Outputs, call: CallInputs) -> Outputs:
        info = self.info
        node_names = {info.forces, info.atomic_energy, *info.node_outputs} - {None}
        graph_names = {info.energy, *info.graph_outputs} - {None}
        # a committee's spreads (served with uncertainty) have their output's rows
        node_names |= {name + SPREAD_SUFFIX for name in node_names}
        graph_names |= {name + SPREAD_SUFFIX for name in graph_names}
        nodes = self.node_index(call)
        raw: Outputs = {}
        for name, value in outputs.items():
            if name in node_names:
                raw[name] = value.index_select(0, nodes).clone()
            elif name in graph_names:
                raw[name] = value[: call.num_graphs].clone()
            # per-edge and private (``_``) outputs are dropped: the caller never sees the engine's edges
        return raw

    # the sizes of the static node / graph dimensions (without the sink)
    num_nodes: int = 0
    num_graphs: int = 0

    def node_index(self, call: CallInputs) -> torch.Tensor:  # pragma: no cover - abstract
        raise NotImplementedError

    def overflowed(self) -> int | None:
        """After a replay: ``None`` when the engine's buffers held the call, else the size it needed."""
        return None

"""What every static-buffer engine shares: the capture-safe forward and the output extraction.

An engine owns static input buffers sized for one layout, a callable that runs the model on
them without host synchronisation, and the :class:`~.backends.Captured` graph of that callable.
Padding follows Contract 2: every padded node and edge lives in a sink graph (index ``B`` of a
``B + 1`` graph batch); padded edges point sink -> sink, so the real outputs do not change.
"""

from __future__ import annotations

from typing import Any

import torch
from torch_geometric.data import Batch

from ..inputs import CallInputs
from .backends import Captured, Outputs, tensor_bytes


def static_forward(
    model: Any,
    *,
    pos: torch.Tensor,
    numbers: torch.Tensor,
    batch: torch.Tensor,
    edge_index: torch.Tensor,
    num_graphs: int,
    graph_attr: torch.Tensor | None,
    forces: bool,
    edge_shift: torch.Tensor | None = None,
    cell: torch.Tensor | None = None,
    pbc: torch.Tensor | None = None,
) -> Outputs:
    """The eager model on static tensors (energy, forces by ``autograd.grad``, every head).

    Args:
        model: the :class:`~hydragnn.models.HydraModel` (eager; never the compiled forward).
        pos: ``[M, 3]`` positions including sink nodes.
        numbers: ``[M]`` atomic numbers (0 on padding).
        batch: ``[M]`` graph of each node (``num_graphs - 1`` is the sink graph).
        edge_index: ``[2, E]`` including sink -> sink padding.
        num_graphs: B + 1.
        graph_attr: ``[B + 1, G]`` graph inputs (total charge, spin) of a model with any, else ``None``.
        forces: compute forces.
        edge_shift: ``[E, 3]`` Cartesian image offsets of a periodic batch (zeros on padding).
        cell: ``[B + 1, 3, 3]`` cells of a periodic batch (the sink graph's is any invertible cell).
        pbc: ``[B + 1, 3]`` periodic flags of a periodic batch.
    """
    b = Batch()
    b.x = numbers.to(model.dtype).unsqueeze(-1)
    b.pos = pos
    b.batch = batch
    b.edge_index = edge_index
    b._num_graphs = num_graphs
    if graph_attr is not None:
        b.graph_attr = graph_attr.to(model.dtype)
    if edge_shift is not None:
        b.edge_shift, b.cell, b.pbc = edge_shift, cell, pbc
    with torch.no_grad():
        return dict(model(b, compute_forces=forces, compute_stress=False))


class StaticEngine:
    """Base of the dense and sparse engines.

    Attributes:
        key: the cache key of the layout the engine was built for.
        graph: the captured graph (``None`` before :meth:`capture`).
        buffers: static inputs and constant index tensors (``{name: tensor}``).
    """

    kind = "static"

    def __init__(self, calc: Any, key: tuple, forces: bool) -> None:
        self.key = key
        self.model = calc.eager_model  # the kernel-patched copy when inference kernels are on
        self.info = calc.info
        self.device = calc.device
        self.dtype = calc.model.geometry_dtype
        self.cutoff = float(calc.info.cutoff)
        self.forces = forces
        self.buffers: dict[str, torch.Tensor] = {}
        self.graph: Captured | None = None

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
        return self.extract(self.graph.replay(), call)

    def extract(self, outputs: Outputs, call: CallInputs) -> Outputs:
        info = self.info
        node_names = {info.forces, info.atomic_energy, *info.node_outputs} - {None}
        graph_names = {info.energy, *info.graph_outputs} - {None}
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

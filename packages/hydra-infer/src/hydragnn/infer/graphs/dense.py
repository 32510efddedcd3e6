"""Dense engine: ``rows`` structures of ``N`` atom slots, species and padding as graph inputs.

Key ``("dense", rows, N, forces)``. Static inputs: ``coords [rows, N, 3]``, ``numbers
[rows, N]`` (0 = padding) and ``graph_attr [rows, G]`` for a model with graph inputs. The candidate edges are every
ordered pair of slots of one row (a constant ``[2, rows * N * (N - 1)]``); inside the graph a pair
that involves padding or is not within the cutoff (``|r_ij| < cutoff``, the regular neighbour
list's rule) is redirected sink -> sink, and padded slots join the sink graph. Rows beyond the
call's ``B`` (a smaller batch reusing a larger graph) are all padding.
"""

from __future__ import annotations

import torch

from ..inputs import CallInputs
from .backends import Outputs
from .base import StaticEngine, with_sink
from .host import EngineHost


class DenseEngine(StaticEngine):
    """Static-buffer engine for a padded batch (see the module docstring)."""

    kind = "dense"

    def __init__(self, host: EngineHost, rows: int, width: int, forces: bool) -> None:
        super().__init__(host, ("dense", rows, width, forces), forces)
        self.rows, self.width = rows, width
        self.num_nodes, self.num_graphs = rows * width, rows
        dev = self.device
        slot = torch.arange(width, device=dev)
        i, j = torch.meshgrid(slot, slot, indexing="ij")
        off = i != j
        i, j = i[off], j[off]
        base = (torch.arange(rows, device=dev) * width).unsqueeze(1)
        self.buffers = {
            "coords": torch.zeros(rows, width, 3, dtype=self.dtype, device=dev),
            "numbers": torch.zeros(rows, width, dtype=torch.long, device=dev),
            "src": (base + j.unsqueeze(0)).reshape(-1),
            "dst": (base + i.unsqueeze(0)).reshape(-1),
            "row": torch.arange(rows, device=dev).repeat_interleave(width),
        }
        self.add_graph_attr_buffer()

    def fn(self) -> Outputs:
        buf = self.buffers
        sink = self.num_nodes
        z = buf["numbers"].reshape(-1)
        real = z != 0
        coords = buf["coords"].reshape(-1, 3)
        pos = torch.where(real.unsqueeze(-1), coords, torch.zeros_like(coords))
        batch = torch.where(real, buf["row"], torch.full_like(buf["row"], self.rows))
        src, dst = buf["src"], buf["dst"]
        dist = (pos[src] - pos[dst]).norm(dim=-1)
        valid = real[src] & real[dst] & (dist < self.cutoff)
        edge_index = torch.stack([torch.where(valid, src, sink), torch.where(valid, dst, sink)])
        return self.forward(*with_sink(pos, z, batch, self.rows), edge_index)

    def load(self, call: CallInputs) -> None:
        buf = self.buffers
        nodes = self.node_index(call)
        buf["coords"].zero_()
        buf["numbers"].zero_()
        buf["coords"].view(-1, 3).index_copy_(0, nodes, call.pos.to(self.dtype))
        buf["numbers"].view(-1).index_copy_(0, nodes, call.numbers)
        self.load_graph_attr(call)

    def node_index(self, call: CallInputs) -> torch.Tensor:
        """Slot of each real atom of ``call`` (the call's flat order)."""
        if call.mask is None:  # single structure: slots 0..N-1 of row 0
            return torch.arange(call.pos.shape[0], device=self.device)
        return call.mask.reshape(-1).nonzero().flatten().to(self.device)

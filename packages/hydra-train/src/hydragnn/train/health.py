"""``DeadHeadUnits``: say while training when a head layer can no longer learn.

A ReLU unit whose pre-activation is negative for every input outputs zero and gets no gradient:
it stays dead. When every unit of one layer of an output head is dead, the head's output is a
constant (what the bias after it says), the loss of that output sits at what predicting a constant
gives, and the layer gets no gradient to recover by (only a change of the layers before it could). Upstream HydraGNN's ci.json (ReLU heads with shared
layers of width 4) does this to PAINN and EGNN here: the pooled embedding carries an offset
common to every graph, larger than its spread between graphs, which fixes each unit's sign for the
whole data set (docs/notes/upstream_configs_dead_heads.md).

The callback watches the ReLU-family activations inside the model's output heads during each
validation pass (forward hooks, registered only inside :meth:`~DeadHeadUnits.evaluating`) and
records, per unit, whether it was ever non-zero. At the end of the epoch a layer with every unit
dead is reported once, naming the layer, the outputs it feeds and the fixes. Nothing about the
training changes.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from .callbacks import Callback

if TYPE_CHECKING:
    from .callbacks import LoopView

__all__ = ["DEAD_ACTIVATIONS", "DeadHeadUnits", "head_activations"]

DEAD_ACTIVATIONS: tuple[type[nn.Module], ...] = (nn.ReLU, nn.ReLU6)
"""Activations whose units can die (exactly zero output and gradient for negative inputs)."""

HEAD_PREFIXES = ("graph_heads", "node_heads", "edge_heads")
"""Submodule names of a ``HydraModel`` that hold output heads (a committee's members' too)."""


def head_activations(model: nn.Module) -> dict[str, nn.Module]:
    """``{module path: activation}`` of the :data:`DEAD_ACTIVATIONS` inside ``model``'s output heads."""
    found = {}
    for path, module in model.named_modules():
        parts = path.split(".")
        if isinstance(module, DEAD_ACTIVATIONS) and any(p in HEAD_PREFIXES for p in parts):
            found[path] = module
    return found


class DeadHeadUnits(Callback):
    """Report a head layer whose units are all zero on every validation sample (see the module
    docstring). ``reported``: the layers reported so far (module paths), also in :meth:`summary`."""

    key = "dead_head_units"

    def __init__(self) -> None:
        self.alive: dict[str, torch.Tensor] = {}
        self.reported: list[str] = []

    @contextlib.contextmanager
    def _watching(self, model: nn.Module) -> Iterator[None]:
        handles = []
        self.alive = {}

        def hook(path: str):
            def record(module: nn.Module, args: Any, out: torch.Tensor) -> None:
                seen = (out.detach() != 0).reshape(-1, out.shape[-1]).any(0)
                self.alive[path] = seen if path not in self.alive else self.alive[path] | seen

            return record

        for path, module in head_activations(model).items():
            if path not in self.reported:
                handles.append(module.register_forward_hook(hook(path)))
        try:
            yield
        finally:
            for handle in handles:
                handle.remove()

    def evaluating(self, loop: LoopView) -> contextlib.AbstractContextManager[None]:
        return self._watching(loop.module)

    def on_epoch_end(self, loop: LoopView, record: dict[str, Any]) -> None:
        dead = [path for path, alive in self.alive.items() if not bool(alive.any())]
        for path in dead:
            self.reported.append(path)
            units = int(self.alive[path].numel())
            loop.log(
                f"warning: epoch {record['epoch']}: all {units} units of {path} ({type(loop.module.get_submodule(path)).__name__}) "
                "were zero on every validation sample: the outputs this layer feeds are a constant (a dead ReLU "
                "layer gets no gradient and rarely recovers; the loss of those outputs stays at a constant "
                'prediction\'s). Use a smooth activation (Architecture.activation: "silu"), wider head layers, or '
                "a lower learning rate"
            )
        if dead:
            record["dead_head_layers"] = dead

    def summary(self) -> Mapping[str, Any]:
        return {"dead_head_layers": list(self.reported)}

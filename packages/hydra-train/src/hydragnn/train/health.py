"""``DeadHeadUnits``: say while training when an output head can no longer learn.

A ReLU unit whose pre-activation is negative for every input outputs zero and gets no gradient:
it stays dead. When every unit of one layer of an output head is dead, the head's output is a
constant (what the bias after it says), the loss of that output sits at what predicting a constant
gives, and the layer gets no gradient to recover by (only a change of the layers before it could).
Upstream HydraGNN's ci.json (ReLU heads with shared layers of width 4) did this to PAINN and EGNN
before the graph heads standardised their input (``output_heads.graph.input_norm``): the pooled
embedding carries an offset common to every graph, larger than its spread between graphs, which
fixes each unit's sign for the whole data set (docs/notes/upstream_configs_dead_heads.md).

The callback watches, during each validation pass (forward hooks registered only inside
:meth:`~DeadHeadUnits.evaluating`), the ReLU-family activations inside the model's output heads
(per unit: was it ever non-zero?) and the heads' outputs (per output: the smallest and largest
value of each column). At the end of the epoch a layer with every unit dead, and an output that
was the same for every validation sample, whatever the cause, are each reported when it happens, naming the
layer or output and the fixes, and again if they recover (a change of the layers before a dead
layer can revive it). Nothing about the training changes.

``HeadInputScale``: the standardisation that keeps those units alive hides the scale of the
pooled embedding from the loss, so an encoder's output can drift up by many orders of magnitude
(PNAEq at ci.json's learning rate: 1e15 in 40 epochs); the callback reports each thousandfold
growth of the standardisation's scale over the first epoch's.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from hydragnn.models.nn.standardise import RunningStandardise

from .callbacks import Callback

if TYPE_CHECKING:
    from .callbacks import LoopView

__all__ = ["DEAD_ACTIVATIONS", "SCALE_STEP", "DeadHeadUnits", "HeadInputScale", "head_activations", "output_heads"]

DEAD_ACTIVATIONS: tuple[type[nn.Module], ...] = (nn.ReLU, nn.ReLU6)
"""Activations whose units can die (exactly zero output and gradient for negative inputs)."""

HEAD_PREFIXES = ("graph_heads", "node_heads", "edge_heads")
"""Submodule names of a ``HydraModel`` that hold output heads (a committee's members' too)."""

FIXES = (
    'Use a smooth activation (Architecture.activation: "silu"), keep the graph heads\' input standardisation '
    '(output_heads.graph.input_norm: "running"), wider head layers, or a lower learning rate'
)


def output_heads(model: nn.Module) -> dict[str, nn.Module]:
    """``{module path: heads}`` of the graph / node / edge head modules of ``model`` (each returns
    ``{output name: tensor}``)."""
    return {path: m for path, m in model.named_modules() if path.split(".")[-1] in HEAD_PREFIXES}


def head_activations(model: nn.Module) -> dict[str, nn.Module]:
    """``{module path: activation}`` of the :data:`DEAD_ACTIVATIONS` inside ``model``'s output heads."""
    found = {}
    for path, module in model.named_modules():
        parts = path.split(".")
        if isinstance(module, DEAD_ACTIVATIONS) and any(p in HEAD_PREFIXES for p in parts):
            found[path] = module
    return found


class DeadHeadUnits(Callback):
    """Report a head layer whose units are all zero, and an output that is the same, on every
    validation sample (see the module docstring), once when it happens and once when it recovers.
    ``reported``: the layers dead at the last validation (module paths); ``constant``: the outputs
    constant there (``<heads path>.<output name>``); both in :meth:`summary`."""

    key = "dead_head_units"

    def __init__(self) -> None:
        self.alive: dict[str, torch.Tensor] = {}
        self.reported: list[str] = []
        self.ranges: dict[str, tuple[torch.Tensor, torch.Tensor, int]] = {}
        self.constant: list[str] = []

    @contextlib.contextmanager
    def _watching(self, model: nn.Module) -> Iterator[None]:
        handles = []
        self.alive = {}

        def hook(path: str):
            def record(module: nn.Module, args: Any, out: torch.Tensor) -> None:
                seen = (out.detach() != 0).reshape(-1, out.shape[-1]).any(0)
                self.alive[path] = seen if path not in self.alive else self.alive[path] | seen

            return record

        def outputs(path: str):
            def record(module: nn.Module, args: Any, out: Mapping[str, torch.Tensor]) -> None:
                for name, value in out.items():
                    key = f"{path}.{name}"
                    rows = value.detach().reshape(-1, value.shape[-1]) if value.ndim else value.detach().reshape(1, 1)
                    if rows.shape[0] == 0:
                        continue
                    lo, hi = rows.amin(0), rows.amax(0)
                    if key in self.ranges:
                        old_lo, old_hi, n = self.ranges[key]
                        lo, hi, rows_seen = torch.minimum(lo, old_lo), torch.maximum(hi, old_hi), n + rows.shape[0]
                    else:
                        rows_seen = rows.shape[0]
                    self.ranges[key] = (lo, hi, rows_seen)

            return record

        self.ranges = {}
        for path, module in head_activations(model).items():
            handles.append(module.register_forward_hook(hook(path)))
        for path, module in output_heads(model).items():
            handles.append(module.register_forward_hook(outputs(path)))
        try:
            yield
        finally:
            for handle in handles:
                handle.remove()

    def evaluating(self, loop: LoopView) -> contextlib.AbstractContextManager[None]:
        return self._watching(loop.module)

    def on_epoch_end(self, loop: LoopView, record: dict[str, Any]) -> None:
        epoch = record["epoch"]
        dead = [path for path, alive in self.alive.items() if not bool(alive.any())]
        died, revived = _transitions(self.reported, dead, self.alive)
        for path in died:
            units = int(self.alive[path].numel())
            loop.log(
                f"warning: epoch {epoch}: all {units} units of {path} ({type(loop.module.get_submodule(path)).__name__}) "
                "were zero on every validation sample: the outputs this layer feeds are a constant (a dead ReLU "
                "layer gets no gradient of its own; only a change of the layers before it can revive it, and "
                f"until then the loss of those outputs stays at a constant prediction's). {FIXES}"
            )
        for path in revived:
            loop.log(f"epoch {epoch}: {path} is alive again (some of its units are non-zero on validation samples)")
        if dead:
            record["dead_head_layers"] = dead
        constant = [key for key, (lo, hi, rows) in self.ranges.items() if rows > 1 and bool(torch.equal(lo, hi))]
        fixed, varying = _transitions(self.constant, constant, self.ranges)
        for key in fixed:
            lo, _, rows = self.ranges[key]
            shown = f"{lo.item():.6g}" if lo.numel() == 1 else f"{lo.numel()} columns"
            loop.log(
                f"warning: epoch {epoch}: output {key} was the same ({shown}) for all {rows} validation rows: the "
                f"model predicts a constant for it, and its loss is a constant prediction's. {FIXES}"
            )
        for key in varying:
            loop.log(f"epoch {epoch}: output {key} varies again")
        if constant:
            record["constant_outputs"] = constant

    def summary(self) -> Mapping[str, Any]:
        return {"dead_head_layers": list(self.reported), "constant_outputs": list(self.constant)}


SCALE_STEP = 1e3
""":class:`HeadInputScale` reports each time the growth passes another factor of this."""


class HeadInputScale(Callback):
    """Report when the scale a graph heads' input standardisation divides by (its running standard
    deviation, per feature) has grown by :data:`SCALE_STEP`, then each further :data:`SCALE_STEP`,
    over its value at the end of the first epoch watched. ``growth``: ``{module path: largest
    growth of a feature}``; its largest value is ``head_input_growth`` in :meth:`summary` (1.0
    without standardised heads). A resumed run keeps the reference (:meth:`state_dict`)."""

    key = "head_input_scale"

    def __init__(self) -> None:
        self.reference: dict[str, torch.Tensor] = {}  # path -> std [F] at the first epoch's end
        self.growth: dict[str, float] = {}
        self.reported: dict[str, float] = {}  # path -> growth last reported

    def on_epoch_end(self, loop: LoopView, record: dict[str, Any]) -> None:
        for path, module in loop.module.named_modules():
            if not isinstance(module, RunningStandardise) or int(module.num_batches_tracked) == 0:
                continue
            std = module.running_std.detach().to("cpu", torch.float64)
            reference = self.reference.setdefault(path, std.clone())
            tiny = torch.finfo(module.running_std.dtype).tiny
            growth = float((std / reference.clamp_min(tiny)).max())
            self.growth[path] = growth
            if growth >= SCALE_STEP * self.reported.get(path, 1.0):
                self.reported[path] = growth
                loop.log(
                    f"warning: epoch {record['epoch']}: the scale of {path}'s input (the pooled embedding, standardised "
                    f"per feature) is {growth:.1e} times what it was after the first epoch: the heads do not see that "
                    "scale, so nothing in the loss holds the encoder's output back, and values this large lose "
                    "precision and can overflow. Lower the learning rate, or set "
                    'NeuralNetwork.Architecture.output_heads.graph.input_norm to "none"'
                )

    def summary(self) -> Mapping[str, Any]:
        return {"head_input_growth": max(self.growth.values(), default=1.0)}

    def state_dict(self) -> Mapping[str, Any] | None:
        return {"reference": dict(self.reference), "reported": dict(self.reported)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.reference = {k: torch.as_tensor(v, dtype=torch.float64) for k, v in state["reference"].items()}
        self.reported = {k: float(v) for k, v in state["reported"].items()}


def _transitions(held: list[str], now: list[str], watched: Mapping[str, Any]) -> tuple[list[str], list[str]]:
    """Update ``held`` (the names reported as in a state) to ``now`` (those in it this epoch, among
    ``watched``): returns the names that entered the state and those that left it."""
    entered = [name for name in now if name not in held]
    left = [name for name in held if name in watched and name not in now]
    held[:] = [name for name in held if name not in left] + entered
    return entered, left

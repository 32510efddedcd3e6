"""Runners: how a calculator evaluates a validated call, one class per way.

The calculator checks a call (:mod:`.inputs`), hands it to its runner and converts the raw
outputs (:mod:`.outputs`); it never branches on a mode. A runner owns the fields, fallbacks and
warnings of its way of running:

* :class:`EagerRunner`: neighbours (:class:`~.neighbors.NeighborCache`), then the model under the
  execution profile's backends (the regular path).
* :class:`CompiledRunner` (``compile_model``): the same with the stock model's forward through
  ``torch.compile(dynamic=True)`` (the profile's compile options); a compile failure warns once
  and runs eager from then on.
* :class:`KernelRunner` (``inference_kernels``): eager on a kernel-patched copy of the model,
  rebuilt when the model's weights change; where the kernels cannot run it warns once per reason
  and runs eager.
* :class:`GraphRunner` (``cuda_graph``): CUDA-graph capture and replay (:mod:`.graphs`) in front of
  a regular runner, which answers every call it cannot replay and is the reference a capture is
  admitted against. It is the engines' :class:`~.graphs.host.EngineHost`. Its backend is an
  argument (the CPU replay backend runs the same static-buffer path without a GPU, for tests).

Every runner answers ``run(call, forces=, stress=) -> {output name: tensor}`` in the call's flat
layout, and has an ``eager_model`` (what a CUDA graph would capture). :class:`Serving` is what the
runners of one calculator share.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import hydragnn.data.pyg_import  # noqa: F401 (PyG as HydraGNN needs it)

import torch
from torch_geometric.data import Batch

from hydragnn.models.execution import Execution

from .batching import call_batch
from .compiled import compile_failure_message, compiled_energy_forces, energy_only, is_compile_failure
from .errors import GraphFallbackWarning, HydraInferWarning
from .inputs import CallInputs
from .model_info import ModelInfo, ServedModel, model_fingerprint
from .modes import FallbackWarnings, graph_model_problem, graph_reasons, kernel_reasons, make_graph_engine
from .neighbors import NeighborCache

__all__ = ["CompiledRunner", "EagerRunner", "GraphRunner", "KernelRunner", "Runner", "Serving"]

Outputs = dict[str, torch.Tensor]


@dataclass
class Serving:
    """What the runners of one calculator share.

    Attributes:
        model: the served model with its stock forwards (compiled and kernel copies start from it;
            its weights are the ones served).
        view: ``model`` under the execution profile's backends (the same parameter tensors).
        info, device, execution: the model's facts, where it runs, the profile.
        neighbors: the regular path's neighbour lists.
        warnings: once-per-reason fallback warnings of the calculator.
    """

    model: ServedModel
    view: ServedModel
    info: ModelInfo
    device: torch.device
    execution: Execution
    neighbors: NeighborCache
    warnings: FallbackWarnings

    @property
    def dtype(self) -> torch.dtype:
        """Floating dtype of the positions and cells handed to the model (its geometry dtype)."""
        return self.model.geometry_dtype

    def build_batch(self, call: CallInputs) -> Batch:
        """The model's prepared batch for a validated call (edges from the neighbour list; :mod:`.batching`)."""
        return call_batch(self.model, self.info, call, self.neighbors)

    def evaluate(self, forward: Any, batch: Batch, *, forces: bool, stress: bool) -> Outputs:
        """``forward(batch)`` without weight gradients, asking a potential for forces / stress."""
        kwargs = {"compute_forces": forces, "compute_stress": stress} if self.model.mlip else {}
        with torch.no_grad():
            return forward(batch, **kwargs)


class Runner(Protocol):
    """How a calculator evaluates a validated call (see the module docstring)."""

    name: str

    @property
    def eager_model(self) -> ServedModel:
        """The eager module this runner evaluates (what a CUDA graph captures)."""
        ...

    def before_call(self) -> None:
        """Bring the runner up to date with the model and warn what it cannot do (once per reason)."""
        ...

    def run(self, call: CallInputs, *, forces: bool, stress: bool) -> Outputs:
        """Raw outputs of ``call`` in its flat layout."""
        ...


class EagerRunner:
    """The regular path: neighbours, then the model under the profile's backends."""

    name = "eager"

    def __init__(self, serving: Serving) -> None:
        self.serving = serving

    @property
    def eager_model(self) -> ServedModel:
        return self.serving.view

    def before_call(self) -> None:
        pass

    def run(self, call: CallInputs, *, forces: bool, stress: bool) -> Outputs:
        batch = self.serving.build_batch(call)
        return self.serving.evaluate(self.eager_model, batch, forces=forces, stress=stress)


class CompiledRunner(EagerRunner):
    """``compile_model``: the stock model's forward through ``torch.compile(dynamic=True)``, so
    varying atom and edge counts reuse one compiled graph; with forces and without stress the
    compiled region is energy-only and the forces come from autograd outside it
    (:func:`~.compiled.compiled_energy_forces`). A compile failure warns once
    (:class:`~.errors.GraphFallbackWarning`) and the eager path answers from then on."""

    name = "compiled"

    def __init__(self, serving: Serving, options: dict[str, Any] | None = None) -> None:
        super().__init__(serving)
        stock = serving.model
        kwargs = serving.execution.compile_kwargs(serving.device.type, options)
        self.failed = False
        self._forward = torch.compile(stock, dynamic=True, **kwargs)
        self._named_tensors = [*stock.named_parameters(), *stock.named_buffers()]
        self._compiled_energy = torch.compile(energy_only(stock), dynamic=True, **kwargs)

    def run(self, call: CallInputs, *, forces: bool, stress: bool) -> Outputs:
        if not self.failed:
            try:
                return self._compiled(self.serving.build_batch(call), forces=forces, stress=stress)
            except Exception as exc:
                if not is_compile_failure(exc):
                    raise
                self.serving.warnings.warn("compile", "failure", compile_failure_message(exc), GraphFallbackWarning)
                self.failed = True  # eager from now on, for this calculator
        return super().run(call, forces=forces, stress=stress)

    def _compiled(self, batch: Batch, *, forces: bool, stress: bool) -> Outputs:
        if self.serving.model.mlip and forces and not stress:
            return compiled_energy_forces(self._compiled_energy, self._named_tensors, batch, self.serving.info)
        return self.serving.evaluate(self._forward, batch, forces=forces, stress=stress)


class KernelRunner(EagerRunner):
    """``inference_kernels``: eager on a copy of the profile's view whose primitives run the
    Triton kernels (:func:`~.kernels.prepare`), rebuilt when the model's parameters or buffers
    change (:func:`~.model_info.model_fingerprint`). Where the kernels cannot run (device,
    triton, model), each reason warns once and the view answers."""

    name = "kernels"

    def __init__(self, serving: Serving) -> None:
        super().__init__(serving)
        self.patched: ServedModel | None = None
        self.problems: list[tuple[str, str]] = []
        self._fingerprint: tuple | None = None
        self.refresh()

    @property
    def eager_model(self) -> ServedModel:
        return self.patched if self.patched is not None else self.serving.view

    def refresh(self) -> None:
        """(Re)build the patched copy when the model's weights changed since the last build."""
        from .kernels import prepare

        fingerprint = model_fingerprint(self.serving.model)
        if fingerprint == self._fingerprint:
            return
        self.patched, self.problems = prepare(self.serving.view, self.serving.device)
        self._fingerprint = fingerprint

    def before_call(self) -> None:
        if self.patched is not None:
            self.refresh()
        for code, message in kernel_reasons(kernels=self.patched, problems=self.problems):
            self.serving.warnings.warn("kernels", code, message)

    def run(self, call: CallInputs, *, forces: bool, stress: bool) -> Outputs:
        self.before_call()
        return super().run(call, forces=forces, stress=stress)


class GraphRunner:
    """``cuda_graph``: a layout is captured on its second sighting and replayed once admitted
    (:class:`~.graphs.GraphEngineCache`); every call the engine cannot serve (the reasons of
    :func:`~.modes.graph_reasons`, each warned once) and every capture's reference go to
    ``regular``. ``capture`` provides the model the graphs capture (a :class:`KernelRunner` with
    inference kernels, else ``regular``; never a compiled forward). ``backend``: the engine's
    backend, ``None`` for CUDA capture (no engine off CUDA); the CPU ``"replay"`` backend (or a
    :class:`~.graphs.ReplayBackend`) runs the same static-buffer path on any device.

    The engine's :class:`~.graphs.host.EngineHost`: :attr:`model`, :attr:`eager_model`,
    :attr:`info`, :attr:`device`, :attr:`dtype`, :attr:`nb_threshold`, :meth:`regular`, :meth:`warn`.
    """

    name = "cuda_graph"

    def __init__(
        self, serving: Serving, regular: Runner, capture: Runner, *, nb_threshold: int, backend: Any = None
    ) -> None:
        self.serving, self.regular_runner, self.capture = serving, regular, capture
        self.nb_threshold = nb_threshold
        self.model_problem = graph_model_problem(serving.model)
        self.replay_backend = backend is not None
        self.engine: Any = None
        self.dependency_problem: str | None = None
        if self.model_problem is None:
            self.engine, self.dependency_problem = make_graph_engine(serving.device, backend)

    # EngineHost -------------------------------------------------------------------------------
    @property
    def model(self) -> ServedModel:
        return self.serving.model

    @property
    def eager_model(self) -> ServedModel:
        return self.capture.eager_model

    @property
    def info(self) -> ModelInfo:
        return self.serving.info

    @property
    def device(self) -> torch.device:
        return self.serving.device

    @property
    def dtype(self) -> torch.dtype:
        return self.serving.dtype

    def regular(self, call: CallInputs, *, forces: bool, stress: bool = False) -> Outputs:
        """The regular runner's answer: what a capture is admitted against."""
        return self.regular_runner.run(call, forces=forces, stress=stress)

    def warn(self, reason: str, message: str, category: type[Warning] = HydraInferWarning) -> None:
        """Warn that CUDA-graph replay fell back for ``reason`` (a code of the README's table), once per calculator."""
        self.serving.warnings.warn("cuda_graph", reason, message, category)

    # Runner -----------------------------------------------------------------------------------
    def reasons(self, call: CallInputs, *, stress: bool) -> list[tuple[str, str]]:
        """Why ``call`` cannot replay (empty: it may)."""
        return graph_reasons(
            device=self.device,
            engine=self.engine,
            replay_backend=self.replay_backend,
            model=self.model,
            model_problem=self.model_problem,
            dependency_problem=self.dependency_problem,
            partly_periodic=call.cell is not None and not bool(torch.as_tensor(call.pbc).all()),
            requires_grad=call.requires_grad,
            stress=stress,
        )

    def before_call(self) -> None:
        self.capture.before_call()

    def run(self, call: CallInputs, *, forces: bool, stress: bool) -> Outputs:
        reasons = self.reasons(call, stress=stress)
        for code, message in reasons:
            self.serving.warnings.warn("cuda_graph", code, message)  # not self.warn: it points at the caller
        self.before_call()
        raw = None if reasons else self.engine.run(self, call, forces=forces)
        return raw if raw is not None else self.regular(call, forces=forces, stress=stress)

    def memory_stats(self) -> dict[str, int]:
        if self.engine is not None:
            return dict(self.engine.memory_stats())
        return {"engines": 0, "graphs": 0, "graph_pool_bytes": 0, "static_buffer_bytes": 0, "budget_bytes": 0}

    def clear(self) -> None:
        if self.engine is not None:
            self.engine.clear()

"""``HydraCalculator``: energies, forces, stress and every other head of a HydraGNN model.

A call is checked (:mod:`.inputs`), handed to the calculator's runner and converted to the
caller's layout and units (:mod:`.outputs`). The runner (:mod:`.runners`) is chosen once, at
construction, from the options:

* regular (default): :class:`~.runners.EagerRunner`, the model under the execution profile's
  backends on a batch whose edges come from :func:`hydragnn.data.neighbors.radius_graph`
  (nvalchemi-toolkit-ops: all pairs for small structures, cell lists from 256 atoms, periodic or
  not; buffers grow, never truncate), kept by :class:`~.neighbors.NeighborCache`.
* ``compile_model=True``: :class:`~.runners.CompiledRunner`, the same through
  ``torch.compile(dynamic=True)`` so varying atom and edge counts reuse one compiled graph.
* ``inference_kernels=True``: :class:`~.runners.KernelRunner`, the Triton kernels.
* ``cuda_graph=True`` (or ``None`` with ``HYDRAGNN_CUDA_GRAPH`` set): :class:`~.runners.GraphRunner`
  in front of the regular runner: on a CUDA device a layout is captured on its second sighting and
  replayed after admission (see :mod:`.graphs.engine`); ineligible calls (partly periodic cells,
  stress, inputs requiring grad, other devices, ...) fall back to the regular runner with one
  :class:`HydraInferWarning` per calculator and reason (see :mod:`.modes`). ``graph_backend``
  replaces CUDA capture by another backend (the CPU replay backend runs the same static-buffer
  code path without a GPU: tests and tools).
"""

from __future__ import annotations

import copy
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

import hydragnn.data.pyg_import  # noqa: F401 (PyG as HydraGNN needs it)

import torch
from torch_geometric.data import Batch

from hydragnn.models import Committee, HydraModel, load_artifact
from hydragnn.models.execution import Execution, ExecutionError, get_profile

from .errors import InferenceError
from .inputs import DEFAULT_MAX_CELL_IMAGES, CallInputs, check_call
from .memory import DEFAULT_MAX_EDGES, estimated_edges
from .model_info import ModelInfo, ServedModel, model_info
from .modes import COMPILE_WITH_GRAPH, COMPILE_WITH_KERNELS, FallbackWarnings, resolve_cuda_graph
from .neighbors import NeighborCache, check_skin, md_skin
from .outputs import convert
from .process_threads import threads_notice
from .runners import CompiledRunner, EagerRunner, GraphRunner, KernelRunner, Runner, Serving


class HydraCalculator:
    """Run a HydraGNN model on raw coordinates.

    Args:
        model_or_artifact_path: a :class:`~hydragnn.models.HydraModel` or the path of a model
            artifact (``save_artifact``).
        device: where to run (default: the model's device, or CPU for a path).
        compile_model: wrap the forward in ``torch.compile(dynamic=True)``.
        cuda_graph: replay CUDA graphs; ``None`` lets ``HYDRAGNN_CUDA_GRAPH`` decide.
        inference_kernels: use the Triton inference kernels.
        nb_threshold: atoms per structure from which the sparse (neighbour-list) CUDA-graph engine
            is chosen over the dense one (kept for the engine; unused by the regular path).
        species: atomic numbers the model accepts, when the artifact does not list them.
        max_cell_images: periodic images searched per direction before a cell counts as too
            small (see :mod:`.inputs`).
        compile_options: extra ``torch.compile`` keyword arguments (e.g. ``backend``). Under a
            profile with ``compile_threads`` and passive OpenMP waiting the generated CPU kernels
            run on one thread unless these name ``mode`` or ``options["cpp.threads"]``.
        head: for a model with several energy heads (one per training data source), the one to
            serve (default: the first); sets the model's default head (``model.select_head``).
        graph_backend: the CUDA-graph runner's backend instead of CUDA capture: ``"replay"`` (or a
            :class:`~.graphs.ReplayBackend`) runs the static-buffer engines on any device, for
            tests and tools; implies nothing without ``cuda_graph``.
        skin: Verlet skin (Å, >= 0) of the regular path's neighbour list (:mod:`.neighbors`; same
            outputs, fewer searches). Default 0, a search per call: a plain calculator often sees
            unrelated structures, where a skin only widens it (the MD adapters default to 0.5 Å).
        execution: the execution profile (a name or an :class:`~hydragnn.models.execution.Execution`;
            default :data:`~hydragnn.models.execution.DEFAULT_PROFILE`). Its primitive backends run
            on a view of the model (the same parameter and buffer tensors; the model given is not
            modified), its process tuning is applied by the first calculator of a process.
        max_edges: refuse a call whose estimated edge count (:func:`~.memory.estimated_edges`,
            from each structure's density, before the neighbour search) passes this, naming both
            numbers; default :data:`~.memory.DEFAULT_MAX_EDGES` (20 million); ``None``: no limit.
            An allocation that fails anyway is an ``InferenceError`` with the same numbers.
        uncertainty: also return a committee's spread (``Architecture.committee`` >= 2) as
            ``energy_uncertainty [B]`` (eV: the members' standard deviation of the energy) and,
            with forces, ``forces_uncertainty [N]`` (eV/Å: per atom, the root mean square deviation
            of the members' force vectors from their mean) and, for a model with per-atom energies,
            ``atomic_energy_uncertainty [N]`` (eV: the members' standard deviation of each atom's
            energy), from the same pass (the committee runs every member anyway). Sets the
            committee's ``with_spread``.

    Attributes:
        neighbor_stats: ``{"builds": int, "reuses": int}``, neighbour lists searched and reused.
        runner: how calls are evaluated (:mod:`.runners`); ``graph_engine``: the CUDA-graph
            runner's engine cache, or None.
        execution: the profile; ``execution_report``: what the regular path computes with
            (:meth:`~hydragnn.models.execution.Execution.report`).
        threads: the threading notice of the profile's process tuning
            (:func:`hydragnn.models.execution.configure_threads`), which the first calculator of a
            process applies (torch's thread count lowered to the cores per torchrun rank when
            ``OMP_NUM_THREADS`` is unset, malloc block reuse; passive OpenMP waiting only if the
            program called it before importing torch); None under a profile without it.

    Raises:
        InferenceError: a model the calculator cannot feed, or bad options.
        hydragnn.models.ArtifactError: an unreadable artifact.
    """

    def __init__(
        self,
        model_or_artifact_path: HydraModel | str | os.PathLike,
        device: str | torch.device | None = None,
        compile_model: bool = False,
        cuda_graph: bool | None = False,
        inference_kernels: bool = False,
        nb_threshold: int = 120,
        *,
        species: Sequence[int] | None = None,
        max_cell_images: int = DEFAULT_MAX_CELL_IMAGES,
        compile_options: dict[str, Any] | None = None,
        head: str | None = None,
        skin: float = 0.0,
        execution: str | Execution | None = None,
        graph_backend: Any = None,
        uncertainty: bool = False,
        max_edges: int | None = DEFAULT_MAX_EDGES,
    ) -> None:
        self._neighbors = NeighborCache(check_skin(skin))
        try:
            self.execution = get_profile(execution)
        except ExecutionError as exc:
            raise InferenceError(f"execution: {exc}") from None
        self.threads = threads_notice(self.execution)
        model: ServedModel
        if isinstance(model_or_artifact_path, (str, os.PathLike)):
            model = load_artifact(Path(model_or_artifact_path), device=device or "cpu")
            model.requires_grad_(False)  # the calculator owns this copy: inference only
        else:
            model = model_or_artifact_path
        if head is not None:
            from hydragnn.models import ModelError

            try:
                model.select_head(head)
            except (ModelError, AttributeError) as exc:
                raise InferenceError(f"head: {exc}") from None
        if uncertainty:
            if not isinstance(model, Committee):
                raise InferenceError(
                    "uncertainty: needs a committee of models (Architecture.committee >= 2: their spread is the "
                    f"uncertainty); this is a single {type(model).__name__}"
                )
            model.with_spread = True
        self.uncertainty = bool(uncertainty)
        if max_edges is not None and (isinstance(max_edges, bool) or not isinstance(max_edges, int) or max_edges < 1):
            raise InferenceError(f"max_edges: expected an integer >= 1 or None, found {max_edges!r}")
        self.max_edges = max_edges
        self.info: ModelInfo = model_info(model, species)
        if device is None:
            device = cast(torch.device, next(iter(model.parameters())).device)
        self.device = torch.device(device)
        self.model = model.to(self.device).eval()
        if isinstance(max_cell_images, bool) or not isinstance(max_cell_images, int) or max_cell_images < 1:
            raise InferenceError(f"max_cell_images: expected an integer >= 1, found {max_cell_images!r}")
        if isinstance(nb_threshold, bool) or not isinstance(nb_threshold, int) or nb_threshold < 1:
            raise InferenceError(f"nb_threshold: expected an integer >= 1, found {nb_threshold!r}")
        self.max_cell_images = max_cell_images
        self.nb_threshold = nb_threshold
        self.compile_model = bool(compile_model)
        self.cuda_graph, env_note = resolve_cuda_graph(cuda_graph)
        self.inference_kernels = bool(inference_kernels)
        self._warnings = FallbackWarnings()
        if env_note is not None:
            self._warnings.warn("cuda_graph", "environment", env_note)
        self._warn_overridden_options()
        self.serving = Serving(
            self.model, self._profile_view(self.model), self.info, self.device, self.execution,
            self._neighbors, self._warnings,
        )  # fmt: skip
        self.runner = self._runner(dict(compile_options or {}), graph_backend)

    def _runner(self, compile_options: dict[str, Any], graph_backend: Any) -> Runner:
        """The runner of the options (see the module docstring): the regular one, behind a
        :class:`~.runners.GraphRunner` with ``cuda_graph``; graphs capture the kernel copy with
        ``inference_kernels`` (also when the regular path is compiled), never a compiled forward."""
        used = self.inference_kernels and (self.cuda_graph or not self.compile_model)  # (else warned unused)
        kernels = KernelRunner(self.serving) if used else None
        regular: Runner
        if self.compile_model:
            regular = CompiledRunner(self.serving, compile_options)
        else:
            regular = kernels or EagerRunner(self.serving)
        if not self.cuda_graph:
            return regular
        capture = kernels or regular
        return GraphRunner(self.serving, regular, capture, nb_threshold=self.nb_threshold, backend=graph_backend)

    # ------------------------------------------------------------------ public API
    @property
    def eager_model(self) -> ServedModel:
        """What eager evaluation and graph capture run: the kernel-patched copy, else the model
        with the profile's backends switched in."""
        return self.runner.eager_model

    @property
    def graph_engine(self) -> Any:
        """The CUDA-graph runner's engine cache (capture / replay / LRU / budget), or None."""
        return self.runner.engine if isinstance(self.runner, GraphRunner) else None

    @property
    def dtype(self) -> torch.dtype:
        """Floating dtype of the positions and cells handed to the model (its geometry dtype)."""
        return self.model.geometry_dtype

    def _profile_view(self, model: ServedModel) -> ServedModel:
        """``model`` under the profile's backends: ``model`` itself for a profile without any, else
        a copy of its modules sharing every parameter and buffer tensor (weight updates show)."""
        if not self.execution.backends:
            self.execution_report = self.execution.report(model)
            return model
        shared = {id(t): t for t in (*model.parameters(), *model.buffers())}
        view = copy.deepcopy(model, memo=shared)
        self.execution.switch_in(view)
        self.execution_report = self.execution.report(view)
        return view

    def _warn_overridden_options(self) -> None:
        """One warning at construction for every option another one overrides (see the README's precedence)."""
        if not self.compile_model:
            return
        if self.cuda_graph:
            self._warnings.warn("cuda_graph", "compile", COMPILE_WITH_GRAPH)
        if self.inference_kernels:
            where = "" if self.cuda_graph else " (cuda_graph is off: the kernels are not used at all)"
            self._warnings.warn("kernels", "compile", COMPILE_WITH_KERNELS.format(where=where))

    @property
    def cutoff(self) -> float:
        return self.info.cutoff

    @property
    def skin(self) -> float:
        """The neighbour list's Verlet skin (Å); setting it validates it and forgets the kept lists."""
        return self._neighbors.skin

    @skin.setter
    def skin(self, value: float) -> None:
        self._neighbors.skin = check_skin(value)
        self._neighbors.clear()

    @property
    def neighbor_stats(self) -> dict[str, int]:
        return self._neighbors.stats()

    def __call__(
        self,
        coord: Any,
        numbers: Any,
        charge: Any = None,
        cell: Any = None,
        pbc: Any = None,
        forces: bool = False,
        stress: bool = False,
        mol_idx: Any = None,
        spin: Any = None,
    ) -> dict[str, torch.Tensor]:
        """Predict one structure, a dense padded batch or a flat batch.

        Args:
            coord: ``[N, 3]``, ``[B, N, 3]`` (padded where ``numbers == 0``) or ``[N, 3]`` with
                ``mol_idx``; Å.
            numbers: ``[N]`` / ``[B, N]`` atomic numbers.
            charge: total charge per structure (scalar or ``[B]``), for models with a charge input.
            cell: ``[3, 3]`` or ``[B, 3, 3]`` lattice vectors as rows (Å).
            pbc: ``[3]`` or ``[B, 3]`` bool (default with a cell: periodic everywhere).
            forces: return ``forces`` (eV/Å) = ``-dE/dR``.
            stress: return ``stress [B, 3, 3]`` (eV/Å³); needs a cell.
            mol_idx: ``[N]`` structure index of each atom (flat layout).
            spin: spin per structure (scalar or ``[B]``), for models with a spin input.

        Returns:
            ``energy [B]`` (eV), ``forces`` (``[N, 3]`` or ``[B, N, 3]``), ``stress [B, 3, 3]`` and
            every other head of the model (per-atom heads in the layout of the forces).

        Raises:
            InferenceError: invalid input (see :mod:`.inputs`).
        """
        call = self._check(coord, numbers, charge, cell, pbc, mol_idx, spin)
        if forces and self.info.forces is None:
            raise InferenceError(
                "forces: requested, but the model predicts no forces (enable_interatomic_potential with compute_grad_energy)"
            )
        if stress:
            if self.info.stress is None:
                raise InferenceError(
                    "stress: requested, but the model predicts no stress (not an interatomic potential)"
                )
            if call.cell is None or not bool(cast(torch.Tensor, call.pbc).any()):  # pbc comes with the cell
                raise InferenceError(
                    "stress: requested for a structure without a periodic cell; expected cell [3, 3] or [B, 3, 3]"
                )
        if charge is not None and not self.info.charge_input:
            self._warnings.warn("inputs", "charge", "charge was given but the model has no charge input; it is ignored")
        if spin is not None and not self.info.spin_input:
            self._warnings.warn("inputs", "spin", "spin was given but the model has no spin input; it is ignored")
        edges = self._edge_budget(call)
        try:
            raw = self.runner.run(call, forces=forces, stress=stress)
        except (torch.OutOfMemoryError, RuntimeError) as exc:
            if isinstance(exc, torch.OutOfMemoryError) or "allocate" in str(exc) or "out of memory" in str(exc):
                raise InferenceError(
                    f"out of memory for {call.pos.shape[0]} atoms "
                    f"({f'about {sum(edges):,} edges estimated' if edges else 'edges not estimated'}): "
                    f"{str(exc).splitlines()[0][:300]}; evaluate fewer or smaller structures, or lower max_edges "
                    "to refuse such calls before they allocate"
                ) from None
            raise
        return convert(raw, call, self.info)

    def _edge_budget(self, call: CallInputs) -> list[int]:
        """The call's estimated edges per structure (:func:`~.memory.estimated_edges`); refused beyond
        ``max_edges``. Calls without a cell whose every pair fits the limit skip the estimate (no
        host synchronisation on the MD path of molecules); their result is then empty."""
        atoms = int(call.pos.shape[0])
        if self.max_edges is None or (call.cell is None and atoms * atoms <= self.max_edges):
            return []
        # uncapped: the search lists every pair within the cutoff before it keeps the k nearest
        edges = estimated_edges(call.pos, call.batch, call.num_graphs, call.cell, call.pbc, self.info.cutoff, None)
        if self.max_edges is not None and sum(edges) > self.max_edges:
            worst = max(range(len(edges)), key=edges.__getitem__)
            atoms = int((call.batch == worst).sum())
            raise InferenceError(
                f"the call would build about {sum(edges):,} edges, more than max_edges={self.max_edges:,} (structure "
                f"{worst}: {atoms} atoms with about {edges[worst] // max(atoms, 1):,} neighbours each within "
                f"{self.info.cutoff:g} Å). Atoms far denser than matter? Else evaluate fewer structures per call, or "
                "raise max_edges (HydraCalculator(..., max_edges=...)) if your memory holds them"
            )
        return edges

    def memory_stats(self) -> dict[str, int]:
        """Memory held by captured CUDA graphs and the engine's event counters (zeros without an engine).

        Keys: ``engines``, ``graphs``, ``graph_pool_bytes``, ``static_buffer_bytes``, ``budget_bytes``
        and, with an engine, counters such as ``captures``, ``admitted``, ``rejected``, ``replays``,
        ``evictions``, ``overflows``, ``invalidations`` (see :mod:`.graphs.engine`).
        """
        if isinstance(self.runner, GraphRunner):
            return self.runner.memory_stats()
        return {"engines": 0, "graphs": 0, "graph_pool_bytes": 0, "static_buffer_bytes": 0, "budget_bytes": 0}

    def clear_cuda_graphs(self) -> None:
        """Drop every captured CUDA graph, its buffers and memory pool (no-op without an engine)."""
        if isinstance(self.runner, GraphRunner):
            self.runner.clear()

    # ------------------------------------------------------------------ internals
    def _check(self, coord, numbers, charge, cell, pbc, mol_idx, spin=None) -> CallInputs:
        return check_call(
            coord,
            numbers,
            charge=charge,
            spin=spin,
            cell=cell,
            pbc=pbc,
            mol_idx=mol_idx,
            cutoff=self.info.cutoff,
            max_cell_images=self.max_cell_images,
            species=self.info.species,
            max_species=self.info.max_species,
            dtype=self.dtype,
            device=self.device,
        )

    def build_batch(self, call: CallInputs) -> Batch:
        """The model's prepared batch for a validated call (edges from the neighbour list; see :mod:`.batching`)."""
        return self.serving.build_batch(call)


def md_calculator(calc_or_path: Any, skin: float | None = None, **calculator_kwargs: Any) -> HydraCalculator:
    """The calculator an MD adapter (ASE, torch-sim) wraps: ``calc_or_path`` itself when it is a
    :class:`HydraCalculator` (its skin replaced only when ``skin`` is given), else a new one on
    that artifact or model with ``calculator_kwargs`` and the MD skin
    (:func:`~.neighbors.md_skin`: neighbour lists reused between steps where the model allows)."""
    if isinstance(calc_or_path, HydraCalculator):
        if skin is not None:
            calc_or_path.skin = skin
        return calc_or_path
    calc = HydraCalculator(calc_or_path, **calculator_kwargs)
    calc.skin = md_skin(calc, skin)
    return calc

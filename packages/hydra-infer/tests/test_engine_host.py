"""The seam between the CUDA-graph engines and their calculator (:class:`EngineHost`).

The calculator satisfies the Protocol, and the engines run for a host that is not a calculator:
the dense, sparse and periodic engines of a :class:`GraphEngineCache` on the CPU replay backend,
driven by a minimal host, replay the regular path's energies and forces.
"""

from __future__ import annotations

import inspect

import pytest
import torch
from infer_helpers import cluster
from test_graphs import assert_same

from hydragnn.infer import HydraCalculator, HydraInferWarning
from hydragnn.infer.batching import call_batch
from hydragnn.infer.graphs import EngineHost, GraphEngineCache, ReplayBackend
from hydragnn.infer.inputs import check_call
from hydragnn.infer.model_info import model_info
from hydragnn.infer.outputs import convert
from hydragnn.infer.runners import GraphRunner

MEMBERS = sorted(name for name in vars(EngineHost) if not name.startswith("_"))


class MinimalHost:
    """An engine host that is not a calculator: a frozen model and its regular path, nothing else."""

    def __init__(self, model, nb_threshold: int = 120) -> None:
        self.model = model
        self.eager_model = model
        self.info = model_info(model, None)
        self.device = torch.device("cpu")
        self.dtype = model.geometry_dtype
        self.nb_threshold = nb_threshold
        self.warned: list[str] = []

    def regular(self, call, *, forces):
        with torch.no_grad():
            return dict(
                self.model(call_batch(self.model, self.info, call), compute_forces=forces, compute_stress=False)
            )

    def warn(self, reason, message, category=HydraInferWarning):
        self.warned.append(reason)

    def check(self, coord, numbers, cell=None):
        return check_call(
            coord,
            numbers,
            charge=None,
            cell=cell,
            pbc=None,
            mol_idx=None,
            cutoff=self.info.cutoff,
            max_cell_images=8,
            species=None,
            max_species=self.info.max_species,
            dtype=self.dtype,
            device=self.device,
        )


def test_the_graph_runner_is_the_engine_host(model64):
    """The engines call back into the CUDA-graph runner that owns them, never into the calculator."""
    assert MEMBERS == ["device", "dtype", "eager_model", "info", "model", "nb_threshold", "regular", "warn"]
    calc = HydraCalculator(model64, cuda_graph=True, graph_backend="replay")
    host = calc.runner
    assert isinstance(host, GraphRunner) and isinstance(host, EngineHost) and not isinstance(calc, EngineHost)
    assert isinstance(MinimalHost(model64), EngineHost) and not isinstance(object(), EngineHost)
    assert host.dtype == model64.geometry_dtype and host.eager_model is not host.model  # the profile's view
    assert HydraCalculator(model64, execution="reference").eager_model is model64
    view = dict(host.eager_model.named_parameters())
    assert all(view[name] is p for name, p in model64.named_parameters())  # the same tensors
    for name in ("regular", "warn"):  # the Protocol's parameters bind to the runner's methods
        wanted = inspect.signature(getattr(EngineHost, name))
        got = inspect.signature(getattr(host, name))
        for param in list(wanted.parameters.values())[1:]:
            assert param.name in got.parameters and got.parameters[param.name].kind == param.kind, (name, param)
    call = calc._check(*cluster(5), None, None, None, None)
    assert_same(host.regular(call, forces=True), MinimalHost(model64).regular(call, forces=True))


@pytest.mark.parametrize("engine", ["dense", "sparse", "periodic"])
def test_engines_replay_for_a_host_that_is_not_a_calculator(model64, cuau_atoms, engine):
    host = MinimalHost(model64, nb_threshold=4 if engine == "sparse" else 120)
    cache = GraphEngineCache(ReplayBackend())
    ref = HydraCalculator(model64)
    if engine == "periodic":
        atoms = cuau_atoms[0]
        pos, z, cell = atoms.positions, atoms.numbers, atoms.cell.array
    else:
        (pos, z), cell = cluster(6), None
    answers = []
    for step in range(3):  # regular, captured and admitted, replayed
        moved = pos + 0.02 * step
        call = host.check(moved, z, cell)
        raw = cache.run(host, call, forces=True)
        answers.append(raw is not None)
        if raw is not None:
            assert_same(convert(raw, call, host.info), ref(moved, z, cell=cell, forces=True))
    stats = cache.memory_stats()
    assert answers == [False, True, True] and host.warned == []
    assert stats["captures"] == 1 and stats["admitted"] == 1 and stats["replays"] == 1
    assert [key[0] for key in cache.engines] == [engine]


def test_a_rejection_is_reported_through_the_host(model64):
    host = MinimalHost(model64)
    cache = GraphEngineCache(ReplayBackend(perturb=lambda out: out["energy"].add_(1e-3)))
    pos, z = cluster(6)
    for _ in range(3):
        cache.run(host, host.check(pos, z), forces=False)
    assert host.warned == ["rejected"] and cache.memory_stats()["replays"] == 0

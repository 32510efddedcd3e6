"""Runner conformance: every runner the calculator can choose, under every shipped execution
profile, answers what the reference (the eager stock model, profile ``"reference"``) answers, on
every built-in encoder: energy, forces and stress of periodic cells, energies of a cluster.

The CUDA-graph runner runs its static-buffer engines on the CPU replay backend (captured on a
layout's second sighting, replayed from the third); the compiled runner compiles with Dynamo's
``"eager"`` backend (the runner's logic, not Inductor's code generation, which
``test_compile.py`` covers). The Triton kernels have their own checks (``test_kernels.py``).
"""

from __future__ import annotations

import warnings

import pytest
import torch
from infer_helpers import cluster

from hydragnn.infer import HydraCalculator, HydraInferWarning
from hydragnn.models.execution import PROFILES
from hydragnn.models.testing import REGISTERED_ENCODERS, set_defaults, subject
from hydragnn.models.testing.graphs import periodic_atoms

set_defaults("DimeNet", arch={"triplet_capacity": 32})  # capture-safe triplet buffers (as hydra-models' tests)

RUNNERS = {
    "eager": {},
    "compiled": {"compile_model": True, "compile_options": {"backend": "eager"}},
    "cuda_graph": {"cuda_graph": True, "graph_backend": "replay"},
}
"""Runner -> the calculator options that choose it."""


def _calls(calc: HydraCalculator) -> list[dict[str, torch.Tensor]]:
    cell = periodic_atoms(2)[1]
    pos, numbers = cluster(6)
    out = []
    for _ in range(3):  # a graph runner captures on the second sighting, replays on the third
        out.append(calc(cell.positions, cell.numbers, cell=cell.cell.array, forces=True, stress=True))
        out.append(calc(pos, numbers, forces=True))
    return out


@pytest.mark.parametrize("profile", sorted(PROFILES))
@pytest.mark.parametrize("runner", sorted(RUNNERS))
@pytest.mark.parametrize("encoder", REGISTERED_ENCODERS)
def test_every_runner_and_profile_answers_as_the_reference(encoder, runner, profile):
    model = subject(encoder).build().double().eval().requires_grad_(False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", HydraInferWarning)  # fallback reasons (stress, models without capture)
        calc = HydraCalculator(model, execution=profile, **RUNNERS[runner])
        want = _calls(HydraCalculator(model, execution="reference"))
        got = _calls(calc)
    assert calc.runner.name == runner
    if runner == "cuda_graph" and calc.runner.model_problem is None:
        assert calc.memory_stats()["replays"] >= 1, calc.memory_stats()  # the replayed answers were compared
    for g, w in zip(got, want, strict=True):
        assert g.keys() == w.keys()
        for key in w:
            torch.testing.assert_close(g[key], w[key], rtol=1e-9, atol=1e-10, msg=f"{encoder} {key}")

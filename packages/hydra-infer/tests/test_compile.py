"""compile_model=True: one torch.compile(dynamic=True) graph set serves every atom / edge count.

The only test that runs inductor (tens of seconds on CPU for a tiny model)."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch._dynamo.utils as dynamo_utils
from infer_helpers import cluster

from hydragnn.infer import HydraCalculator
from hydragnn.infer.errors import GraphFallbackWarning


def test_compiled_matches_eager_without_recompiling(model64):
    torch._dynamo.reset()
    dynamo_utils.counters.clear()
    compiled = HydraCalculator(model64, compile_model=True)
    eager = HydraCalculator(model64)
    graphs = []
    for n in (8, 11, 15, 21):  # different atom and edge counts
        pos, z = cluster(n, seed=n)
        got = compiled(pos, z, forces=True)
        want = eager(pos, z, forces=True)
        torch.testing.assert_close(got["energy"], want["energy"])
        torch.testing.assert_close(got["forces"], want["forces"])
        graphs.append(dynamo_utils.counters["stats"]["unique_graphs"])
    assert graphs[0] > 0, "nothing was compiled"
    # at most one recompilation round (dynamic shapes): never a compile per size
    assert graphs[-1] <= 2 * graphs[0], f"compiled graphs per call: {graphs}"
    assert compiled.compile_model, "compilation failed and the calculator fell back to eager"
    torch._dynamo.reset()


def test_a_failing_compile_falls_back_to_eager_with_one_warning(model64):
    """Inductor can fail on a model (torch 2.13 CPU codegen on a float32 SchNet cell, for one): the
    call must still be answered, by the eager model, with one warning."""

    def broken_backend(gm, example_inputs):
        raise RuntimeError("backend broke (test)")

    torch._dynamo.reset()
    calc = HydraCalculator(model64, compile_model=True, compile_options={"backend": broken_backend})
    pos, z = cluster(8)
    with pytest.warns(GraphFallbackWarning, match=r"torch.compile failed on this model .*backend broke"):
        out = calc(pos, z, forces=True)
    want = HydraCalculator(model64)(pos, z, forces=True)
    torch.testing.assert_close(out["forces"], want["forces"])
    assert calc.runner.failed  # eager from now on
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        calc(pos, z)
    torch._dynamo.reset()


def test_generated_cpu_kernels_take_one_thread_under_passive_waiting_unless_told(model64, monkeypatch):
    """compile_model compiles with hydra-data's ``compile_kwargs``: Inductor's ``cpp.threads`` 1
    under passive OpenMP waiting with two threads, unless ``compile_options`` says otherwise."""
    calls = []
    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: calls.append(kw) or fn)
    for given in ({}, {"options": {"cpp.threads": 2, "max_autotune": False}}, {"mode": "reduce-overhead"}):
        HydraCalculator(model64, compile_model=True, compile_options=given)
    assert calls[0] == calls[1] == {"dynamic": True, "options": {"cpp.threads": 1}}  # the forward and energy-only
    assert calls[2]["options"] == {"cpp.threads": 2, "max_autotune": False}
    assert calls[4] == {"dynamic": True, "mode": "reduce-overhead"}  # torch takes a mode or options, not both

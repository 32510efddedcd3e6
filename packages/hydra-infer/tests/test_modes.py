"""Mode selection: HYDRAGNN_CUDA_GRAPH precedence, fallback reasons, one warning per reason."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from infer_helpers import cluster, tiny_model

from hydragnn.infer import ENV_CUDA_GRAPH, HydraCalculator, HydraInferWarning, InferenceError

POS, Z = cluster(4)


@pytest.mark.parametrize(
    "env, explicit, expected",
    [
        (None, None, False),
        ("1", None, True),
        (" TRUE ", None, True),
        ("Yes", None, True),
        ("on\n", None, True),
        ("0", None, False),
        ("off", None, False),
        ("", None, False),
        ("1", False, False),
        ("0", True, True),
        (None, True, True),
    ],
)
def test_env_precedence(monkeypatch, model64, env, explicit, expected):
    if env is None:
        monkeypatch.delenv(ENV_CUDA_GRAPH, raising=False)
    else:
        monkeypatch.setenv(ENV_CUDA_GRAPH, env)
    assert HydraCalculator(model64, cuda_graph=explicit).cuda_graph is expected


def test_default_ignores_env(monkeypatch, model64):
    monkeypatch.setenv(ENV_CUDA_GRAPH, "1")
    assert HydraCalculator(model64).cuda_graph is False  # the default is an explicit False


def test_unrecognised_env_value_disables_replay_with_one_warning(monkeypatch, model64):
    monkeypatch.setenv(ENV_CUDA_GRAPH, "maybe")
    with pytest.warns(HydraInferWarning, match="HYDRAGNN_CUDA_GRAPH='maybe' is not one of"):
        calc = HydraCalculator(model64, cuda_graph=None)
    assert calc.cuda_graph is False
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        calc(POS, Z)
    with pytest.raises(InferenceError, match="cuda_graph: expected True, False or None"):
        HydraCalculator(model64, cuda_graph="yes")


def _messages(record) -> list[str]:
    return [str(w.message) for w in record if issubclass(w.category, HydraInferWarning)]


def test_no_warning_without_fast_modes(model64):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        HydraCalculator(model64)(POS, Z, forces=True)


def test_graph_fallback_reasons_warn_once_each(model64, cuau_atoms):
    calc = HydraCalculator(model64, cuda_graph=True)
    reference = HydraCalculator(model64)
    with pytest.warns(HydraInferWarning) as record:
        out = calc(POS, Z, forces=True)
    first = _messages(record)
    assert len(first) == 1 and "needs a CUDA device" in first[0]  # a CPU request: one warning, not two
    torch.testing.assert_close(out["forces"], reference(POS, Z, forces=True)["forces"])  # regular path answered
    call = calc._check(POS, Z, None, None, None, None)
    assert [code for code, _ in calc.runner.reasons(call, stress=False)] == ["device"]

    with warnings.catch_warnings():  # the same reasons again: silent
        warnings.simplefilter("error")
        calc(POS, Z, forces=True)

    a = cuau_atoms[0]
    with warnings.catch_warnings():  # off CUDA, nothing else is reported: the device reason says it all
        warnings.simplefilter("error")
        calc(a.positions, a.numbers, cell=a.cell.array, forces=True, stress=True)
        calc(torch.tensor(POS, requires_grad=True), Z)
    assert {code for _, code in calc._warnings.issued} == {"device"}


def test_unsupported_model_reason():
    calc = HydraCalculator(tiny_model(dynamic_graph=True), cuda_graph=True, graph_backend="replay")
    with pytest.warns(HydraInferWarning) as record:
        calc(POS, Z)
    assert len(_messages(record)) == 1
    assert any("not supported by CUDA-graph replay (dynamic_graph=True" in m for m in _messages(record))


def test_warnings_are_per_calculator(model64):
    for _ in range(2):
        with pytest.warns(HydraInferWarning):
            HydraCalculator(model64, cuda_graph=True)(POS, Z)


def test_kernels_fallback_once(model64, monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    calc = HydraCalculator(model64, inference_kernels=True)
    with pytest.warns(HydraInferWarning) as record:
        calc(POS, Z)
    msgs = _messages(record)
    assert any("TRITON_INTERPRET=1" in m for m in msgs)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        calc(POS, Z)


def test_kernels_fallback_names_a_missing_dependency(model64, monkeypatch):
    import hydragnn.infer.kernels as kernels

    monkeypatch.setattr(kernels, "available", lambda device: (False, "triton is not installed (test)"))
    calc = HydraCalculator(model64, inference_kernels=True)
    with pytest.warns(HydraInferWarning) as record:
        out = calc(POS, Z)
    assert any("triton is not installed (test)" in m for m in _messages(record))
    assert torch.equal(out["energy"], HydraCalculator(model64)(POS, Z)["energy"])


class _FakeEngine:
    """Stands in for the CUDA-graph engine: answers with its host's regular runner, counts replays."""

    def __init__(self):
        self.runs = 0

    def run(self, host, call, *, forces):
        self.runs += 1
        return host.regular(call, forces=forces)

    def memory_stats(self):
        return {"engines": 1}

    def clear(self):
        self.runs = -1


def test_engine_seam_and_compile_warning(model64, monkeypatch):
    with pytest.warns(HydraInferWarning, match="eligible calls run the eager model"):
        calc = HydraCalculator(model64, cuda_graph=True, compile_model=True, compile_options={"backend": "eager"})
    engine = _FakeEngine()
    calc.runner.engine = engine
    call = calc._check(POS, Z, None, None, None, None)
    monkeypatch.setattr(calc.serving, "device", torch.device("cuda"))  # pretend: eligibility only reads the type
    assert calc.runner.reasons(call, stress=False) == []
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for runs in (1, 2):  # eligible: the engine answers, silently
            calc.runner.run(call, forces=True, stress=False)
            assert engine.runs == runs
    assert calc.memory_stats() == {"engines": 1}
    calc.clear_cuda_graphs()
    assert engine.runs == -1


def test_memory_stats_without_engine(model64):
    calc = HydraCalculator(model64)
    assert set(calc.memory_stats().values()) == {0}
    calc.clear_cuda_graphs()
    assert np.isfinite(float(calc(POS, Z)["energy"][0]))


def test_ignored_charge_warns_once(model64):
    calc = HydraCalculator(model64)
    with pytest.warns(HydraInferWarning, match="no charge input; it is ignored"):
        calc(POS, Z, charge=1.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        calc(POS, Z, charge=1.0)


def test_calculators_report_the_threading_defaults_of_their_process(model64):
    calc = HydraCalculator(model64)
    assert calc.threads.startswith(f"threads: {torch.get_num_threads()} intra-op (")
    assert HydraCalculator(model64).threads is calc.threads  # chosen and printed once per process

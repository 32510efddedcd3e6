"""The CUDA-graph policy's failure safety, concurrency, memory generations and eligibility, on CPU
through the replay backend (the same engine code path as real capture)."""

from __future__ import annotations

import subprocess
import sys
import threading
import warnings

import numpy as np
import pytest
import torch
from infer_helpers import cluster, tiny_model
from test_graphs import POS, Z, assert_same, dense_batch, stats

from hydragnn.infer import HydraCalculator, HydraInferWarning, InferenceError
from hydragnn.infer.errors import GraphFallbackWarning
from hydragnn.infer.graphs import GraphEngineCache, ReplayBackend
from hydragnn.infer.graphs.admission import PER_ATOM, mismatch, tolerance


class FailingBackend(ReplayBackend):
    """Raises ``error`` at ``stage``: ``capture``, ``check`` (the admission replay) or ``replay`` (later ones)."""

    def __init__(self, stage: str, error: Exception, **kwargs):
        super().__init__(**kwargs)
        self.stage, self.error, self.replays = stage, error, 0

    def capture(self, fn, device):
        if self.stage == "capture":
            raise self.error
        captured = super().capture(fn, device)
        inner = captured._replay

        def replay():
            self.replays += 1
            if (self.stage == "check" and self.replays == 1) or (self.stage == "replay" and self.replays > 1):
                raise self.error
            inner()

        captured._replay = replay
        return captured


def _fallback_messages(record) -> list[str]:
    return [str(w.message) for w in record if issubclass(w.category, GraphFallbackWarning)]


@pytest.mark.parametrize("stage", ["capture", "check", "replay"])
def test_a_failing_capture_check_or_replay_falls_back_with_one_runtime_warning(model64, stage, graph_calc):
    calc = graph_calc(model64, FailingBackend(stage, RuntimeError(f"boom at {stage}")))
    ref = HydraCalculator(model64)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        outs = [calc(POS + 0.01 * i, Z, forces=True) for i in range(5)]
    for i, out in enumerate(outs):
        assert_same(out, ref(POS + 0.01 * i, Z, forces=True))  # every call answered, by the regular path
    messages = _fallback_messages(record)
    assert len(messages) == 1 and f"boom at {stage}" in messages[0]
    assert issubclass(GraphFallbackWarning, RuntimeWarning)
    s = stats(calc)
    assert s["failures"] == 1 and s["engines"] == 0 and s["graph_pool_bytes"] == 0
    assert calc.graph_engine.rejected[("dense", 1, 6, True)].startswith("failed: RuntimeError")
    # another layout is still captured and replayed (the failure belongs to one layout)
    if stage == "capture":
        return
    pos, z = cluster(5, seed=3)
    calc.graph_engine.backend.stage = "none"
    for _ in range(3):
        calc(pos, z)
    assert stats(calc)["replays"] == 1


def test_a_context_breaking_cuda_error_is_raised(model64, graph_calc):
    calc = graph_calc(
        model64, FailingBackend("replay", RuntimeError("CUDA error: an illegal memory access was encountered"))
    )
    for _ in range(2):
        calc(POS, Z)
    with pytest.raises(RuntimeError, match="illegal memory access"):
        calc(POS, Z)


def test_out_of_memory_retires_the_generation(model64, graph_calc):
    backend = FailingBackend("none", torch.cuda.OutOfMemoryError("CUDA out of memory (test)"))
    calc = graph_calc(model64, backend)
    for _ in range(2):
        calc(POS, Z)
    assert stats(calc)["engines"] == 1
    backend.stage = "capture"
    pos, z = cluster(5, seed=3)
    calc(pos, z)
    with pytest.warns(GraphFallbackWarning, match="out of memory"):
        calc(pos, z)
    s = stats(calc)
    assert s["engines"] == 0 and s["graph_pool_bytes"] == 0 and s["retirements"] == 1  # the admitted one too
    backend.stage = "none"
    calc(POS, Z)  # a retired layout is captured again on its next sighting (it was seen before)
    assert stats(calc)["engines"] == 1


def test_first_reuse_for_a_smaller_batch_is_checked_and_a_failed_check_keeps_it_regular(model64, graph_calc):
    perturbing = {"on": False}

    def perturb(outputs):
        if perturbing["on"]:
            outputs["energy"] += 1e-2

    calc, ref = graph_calc(model64, ReplayBackend(perturb=perturb)), HydraCalculator(model64)
    big = dense_batch([4, 7, 5, 6, 3, 7], width=7)
    for _ in range(2):
        calc(*big, forces=True)
    perturbing["on"] = True  # from now on the recorded graph is wrong for every reuse
    five = dense_batch([4, 7, 5, 6, 2], width=7, seed=10)
    with pytest.warns(HydraInferWarning, match="reusing the graph of 6 rows"):
        out = calc(*five, forces=True)
    assert_same(out, ref(*five, forces=True))
    for _ in range(2):
        assert_same(calc(*five, forces=True), ref(*five, forces=True))
    s = stats(calc)
    assert s["padded_checks"] == 1 and s["padded_replays"] == 0 and s["rejected"] == 1
    assert ("dense", 5, 7, True) in calc.graph_engine.rejected


def test_one_calculator_from_four_threads_returns_no_foreign_result(model64, graph_calc):
    calc, ref = graph_calc(model64), HydraCalculator(model64)
    structures = [(POS + 0.02 * i, Z) for i in range(12)]
    want = [ref(p, z, forces=True) for p, z in structures]
    for _ in range(2):
        calc(*structures[0], forces=True)  # captured and admitted: the threads below all replay
    wrong: list[int] = []
    barrier = threading.Barrier(4)

    def worker(offset: int) -> None:
        barrier.wait()
        for k in range(15):
            i = (offset + 5 * k) % len(structures)
            got = calc(*structures[i], forces=True)
            if not torch.allclose(got["energy"], want[i]["energy"], rtol=0, atol=1e-10):
                wrong.append(i)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert wrong == [] and stats(calc)["replays"] == 60


def test_dense_engine_up_to_and_including_nb_threshold(model64, graph_calc):
    calc = graph_calc(model64, nb_threshold=6)
    for _ in range(2):
        calc(POS, Z)  # N = 6 = nb_threshold: dense
    pos, z = cluster(7, seed=1)
    for _ in range(2):
        calc(pos, z)  # N = 7: sparse
    assert set(calc.graph_engine.engines) == {("dense", 1, 6, False), ("sparse", 7, 1, False)}


def test_rejected_layouts_are_remembered_among_the_most_recent_only(model64, graph_calc):
    calc = graph_calc(model64, ReplayBackend(perturb=lambda out: out["energy"].add_(1.0)))
    calc.runner.engine = GraphEngineCache(calc.graph_engine.backend, max_layouts=3)
    with pytest.warns(HydraInferWarning, match="did not match"):
        for _ in range(2):
            calc(POS, Z)
    for n in (2, 3, 4):  # three other layouts seen once push the rejected one out
        calc(*cluster(n, seed=n))
    assert len(calc.graph_engine.layouts) == 3 and not calc.graph_engine.rejected
    calc(POS, Z)
    calc(POS, Z)
    assert stats(calc)["captures"] == 2  # forgotten, so captured (and checked) again


class NoSegmentsBackend(ReplayBackend):
    def pool_bytes(self) -> int:
        return 0


def test_a_capture_whose_pool_reports_no_segments_is_not_cached(model64, graph_calc):
    calc = graph_calc(model64, NoSegmentsBackend())
    for _ in range(3):
        out = calc(POS, Z)
    s = stats(calc)
    assert s["captures"] == 1 and s["engines"] == 0 and s["admitted"] == 0 and s["replays"] == 0
    assert_same(out, HydraCalculator(model64)(POS, Z))


def test_budget_rejection_with_no_admitted_engine_retires_the_pool(model64, graph_calc):
    calc = graph_calc(model64, ReplayBackend(total_memory=1000))
    calc(POS, Z)
    with pytest.warns(HydraInferWarning, match="does not fit the budget"):
        calc(POS, Z)
    s = stats(calc)
    assert s["graph_pool_bytes"] == 0 and s["retirements"] == 1 and s["engines"] == 0


class RecordingBackend(ReplayBackend):
    def __init__(self):
        super().__init__()
        self.events: list[str] = []

    def begin(self, device):
        self.events.append("begin")

    def end(self, device):
        self.events.append("end")

    def synchronize(self):
        self.events.append("sync")


def test_replays_are_ordered_and_clear_waits_for_them(model64, graph_calc):
    backend = RecordingBackend()
    calc = graph_calc(model64, backend)
    for _ in range(3):
        calc(POS, Z)
    assert backend.events == ["begin", "end"] * 3
    calc.clear_cuda_graphs()
    assert backend.events[-1] == "sync" and stats(calc)["engines"] == 0


def test_options_another_overrides_warn_once_at_construction(model64, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        calc = HydraCalculator(
            model64, compile_model=True, inference_kernels=True, compile_options={"backend": "eager"}
        )
    messages = [str(w.message) for w in record if issubclass(w.category, HydraInferWarning)]
    assert len(messages) == 1 and "the compiled forward runs the stock primitives" in messages[0]
    assert "not used at all" in messages[0]
    assert calc.runner._forward._orig_mod is calc.model  # compiled from the stock model, never the kernel copy


def test_graph_package_is_imported_only_for_cuda_with_graph_opt_in():
    code = (
        "import sys, warnings; warnings.simplefilter('ignore')\n"
        "sys.path.insert(0, sys.argv[1])\n"
        "from infer_helpers import tiny_model, cluster\n"
        "from hydragnn.infer import HydraCalculator\n"
        "m = tiny_model(); pos, z = cluster(4)\n"
        "HydraCalculator(m, cuda_graph=True)(pos, z)\n"
        "HydraCalculator(m, inference_kernels=True)(pos, z)\n"
        "assert 'hydragnn.infer.graphs' not in sys.modules, 'graphs imported'\n"
        "HydraCalculator(m, cuda_graph=True, graph_backend='replay')\n"
        "assert 'hydragnn.infer.graphs' in sys.modules\n"
    )
    here = str(__import__("pathlib").Path(__file__).parent)
    out = subprocess.run([sys.executable, "-c", code, here], capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr[-2000:]


def _reason_codes(calc, *args, **kwargs) -> list[str]:
    call = calc._check(*args, **kwargs)
    return [code for code, _ in calc.runner.reasons(call, stress=False)]


def test_eligibility_reasons_of_their_own(model64, graph_calc):
    calc = graph_calc(model64)
    charge = torch.tensor([1.0], requires_grad=True)
    assert _reason_codes(calc, POS, Z, charge, None, None, None) == ["requires_grad"]
    assert _reason_codes(calc, POS, Z, None, None, None, None, spin=charge) == ["requires_grad"]
    trainable = tiny_model().requires_grad_(True)
    calc = graph_calc(trainable)
    with pytest.warns(HydraInferWarning, match="parameters that require grad"):
        out = calc(POS, Z, forces=True)
    assert_same(out, HydraCalculator(tiny_model())(POS, Z, forces=True))
    model = tiny_model()
    handle = model.encoder.register_forward_hook(lambda *args: None)
    calc = graph_calc(model)
    with pytest.warns(HydraInferWarning, match="forward hooks"):
        calc(POS, Z)
    handle.remove()
    for _ in range(2):
        calc(POS, Z)
    assert stats(calc)["captures"] == 1  # without the hook, the layout is served again
    torch.use_deterministic_algorithms(True)
    try:
        with pytest.warns(HydraInferWarning, match="deterministic"):
            calc(POS, Z)
    finally:
        torch.use_deterministic_algorithms(False)
    assert stats(calc)["replays"] == 0


def test_artifact_path_calculator_freezes_its_own_copy(tmp_path):
    from hydragnn.models import save_artifact

    model = tiny_model().requires_grad_(True)
    path = save_artifact(model, tmp_path / "m.hydra")
    calc = HydraCalculator(path, cuda_graph=True, graph_backend="replay")
    assert not any(p.requires_grad for p in calc.model.parameters())
    assert all(p.requires_grad for p in model.parameters())  # the caller's model is untouched


def test_dependency_gate_names_versions_and_refuses_rocm(monkeypatch):
    from hydragnn.infer import modes

    cuda = torch.device("cuda")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(
        modes, "_installed_version", {"torch": "2.13.0", "warp-lang": "1.12.1", "nvalchemi-toolkit-ops": "0.5.0"}.get
    )
    problem = modes.graph_dependency_problem(cuda)
    assert "warp-lang 1.12.1 (needs >= 1.19)" in problem and "pip install -U 'warp-lang>=1.19'" in problem
    monkeypatch.setattr(modes, "_installed_version", {"torch": "2.13.0+cu130", "warp-lang": "1.19.0"}.get)
    assert "nvalchemi-toolkit-ops not installed" in modes.graph_dependency_problem(cuda)
    monkeypatch.setattr(
        modes, "_installed_version", {"torch": "2.14.1", "warp-lang": "1.19.0", "nvalchemi-toolkit-ops": "0.5.2"}.get
    )
    assert modes.graph_dependency_problem(cuda) is None
    monkeypatch.setattr(torch.version, "hip", "6.2", raising=False)
    assert "ROCm" in modes.graph_dependency_problem(cuda)


def test_triton_kernels_fall_back_below_compute_capability_8(monkeypatch):
    from hydragnn.infer import kernels

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (7, 5))
    ok, why = kernels.available("cuda")
    assert not ok and "compute capability 7.5, below the 8.0" in why


def test_force_tolerance_has_a_per_atom_term():
    ref = torch.zeros(1000, 3, dtype=torch.float64)
    ref[0, 0] = 2.0
    assert tolerance(ref, 1000) == pytest.approx(1e-4 + 1e-5 * 2.0 + PER_ATOM * 1000)
    counts = torch.tensor([1000])
    energy = torch.zeros(1, dtype=torch.float64)
    got = {"energy": energy, "forces": ref + 1.5e-4, "charges": ref[:, 0] + 1.5e-4}
    want = {"energy": energy, "forces": ref, "charges": ref[:, 0]}
    assert mismatch(got, want, counts, per_atom={"forces", "charges"}) is None  # 1.5e-4 < 1e-4 + 2e-5 + 1e-4
    assert "forces" in mismatch(got, want, counts, per_atom=set())  # without the per-atom term it fails
    bad = dict(got, forces=ref + 3e-4)
    assert "forces: max deviation" in mismatch(bad, want, counts, per_atom={"forces", "charges"})


def test_a_bad_graph_backend_is_an_error_only_where_graphs_are_asked_for(model64):
    with pytest.raises(InferenceError, match="graph_backend: "):
        HydraCalculator(model64, cuda_graph=True, graph_backend="nonsense")
    calc = HydraCalculator(model64, cuda_graph=False, graph_backend="nonsense")  # not read
    assert np.isfinite(float(calc(POS, Z)["energy"][0]))

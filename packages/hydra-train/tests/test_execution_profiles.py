"""Execution profiles in training: the stock path unless a profile says otherwise, the profile's
devices switched in for the run and out after it, the same weights either way, and the choice
recorded in the run log, ``config.json`` and the artifact."""

from __future__ import annotations

import json

import pytest
import torch
from train_helpers import build, config, samples

from hydragnn.models import read_manifest
from hydragnn.models.execution import Execution
from hydragnn.models.nn import Primitive, RadialFilter
from hydragnn.train import ConfigError, create_dataloaders, train_validate_test
from hydragnn.train.pipeline import run_training


def _is_view(p: torch.Tensor) -> bool:
    """Whether ``p`` is a view of a larger buffer (what the flat step lays parameters out as)."""
    return p.untyped_storage().nbytes() > p.numel() * p.element_size()


def _train(tmp_path, execution, **training):
    """Two epochs of the graph task through the seed API with a user-built Adam: ``(model,
    optimizer, summary, seen)``, ``seen`` recording per forward the thread count, the backends
    running the model's primitives and whether the optimizer state was laid out flat."""
    model = build()
    seen: list[tuple[int, frozenset[str], bool]] = []

    def record(module, args):
        backends = frozenset(m.backend for m in module.modules() if isinstance(m, RadialFilter))
        flat = any(_is_view(p) for p in module.parameters())
        seen.append((torch.get_num_threads(), backends, flat))

    model.register_forward_pre_hook(record)
    data = samples("graph", 16)
    train, val, _ = create_dataloaders(data[:8], data[8:12], data[12:], 4)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    nn_config = config("graph", epochs=2, **training)["NeuralNetwork"]
    summary = train_validate_test(
        model, optimizer, train, val, None, None, None, nn_config, "t", 0, run_dir=tmp_path, execution=execution
    )
    return model, optimizer, summary, seen


def test_the_reference_profile_trains_the_stock_path(tmp_path, four_threads):
    """Stock forwards, the optimizer as its user built it, the thread count untouched."""
    model, optimizer, summary, seen = _train(tmp_path, "reference")
    assert seen and {s[1] for s in seen} == {frozenset({"torch"})}
    assert {s[0] for s in seen} == {4} and not any(s[2] for s in seen)
    assert all(g["fused"] is None and g["foreach"] is None for g in optimizer.param_groups)
    assert summary["execution"]["name"] == "reference"
    assert summary["execution"]["primitives"]["RadialFilter"] == {"torch": 2}


def test_the_cpu_profile_switches_its_devices_in_for_the_run_and_out_after(tmp_path, four_threads):
    model, optimizer, summary, seen = _train(tmp_path, "cpu")
    assert {s[1] for s in seen} == {frozenset({"distinct"})}
    assert any(s[2] for s in seen)  # the flat step
    assert all(g["fused"] for g in optimizer.param_groups)
    assert summary["execution"]["primitives"]["RadialFilter"] == {"distinct": 2}
    assert {m.backend for m in model.modules() if isinstance(m, Primitive)} == {"torch"}  # given back
    assert not any(_is_view(p) for p in model.parameters())
    assert torch.get_num_threads() == 4


def test_a_thread_count_in_the_config_holds_under_any_profile(tmp_path, four_threads):
    *_, seen = _train(tmp_path, "reference", intra_op_threads=1)
    assert {s[0] for s in seen} == {1}
    assert torch.get_num_threads() == 4


def test_every_profile_trains_to_the_same_weights(tmp_path):
    """The profile changes how, never what: the same seeds give the same weights after two epochs
    (fused and flat steps and the distinct lengths round their last bits differently)."""
    weights = []
    for name in ("reference", "cpu"):
        model, *_ = _train(tmp_path / name, name)
        weights.append({k: v.detach().clone() for k, v in model.state_dict().items()})
    for key, ref in weights[0].items():
        torch.testing.assert_close(weights[1][key], ref, rtol=1e-4, atol=1e-5)


def test_a_profile_of_ones_own_is_taken_as_an_object(tmp_path):
    only_fused = Execution("fused-only", optimizer_step="fused")
    model, optimizer, summary, seen = _train(tmp_path, only_fused)
    assert all(g["fused"] for g in optimizer.param_groups) and not any(s[2] for s in seen)
    assert summary["execution"]["name"] == "fused-only" and summary["execution"]["optimizer_step"] == "fused"


@pytest.mark.parametrize(
    ("name", "message"), [("fast", "unknown execution profile 'fast'"), ("", "unknown"), (3, "expected str")]
)
def test_an_unknown_profile_is_refused_by_name(tmp_path, name, message):
    with pytest.raises(ConfigError, match=r"NeuralNetwork\.Training\.execution: " + message):
        run_training(config("graph", execution=name), tmp_path / "run")
    assert not (tmp_path / "run").exists()  # refused before any work


@pytest.mark.parametrize("execution", [None, "reference"])
def test_the_run_records_its_profile_in_the_log_the_config_and_the_artifact(tmp_path, execution):
    training = {} if execution is None else {"execution": execution}
    metrics = run_training(config("graph", epochs=1, **training), tmp_path / "run", verbosity=1)
    name = execution or "cpu"
    log = (tmp_path / "run" / "train.log").read_text()
    assert f"execution {name!r}: " in log
    assert json.loads((tmp_path / "run" / "config.json").read_text())["NeuralNetwork"]["Training"]["execution"] == name
    recorded = read_manifest(metrics["paths"]["artifact"])["extra"]["execution"]
    assert recorded["name"] == name and "RadialFilter" in recorded["primitives"]

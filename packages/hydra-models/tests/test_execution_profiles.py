"""Execution profiles as values: named, validated, recorded; the derivative engine as a module they set."""

from __future__ import annotations

import pytest
import torch

from hydragnn.models.derivatives import EnergyDerivatives
from hydragnn.models.execution import DEFAULT_PROFILE, PROFILES, Execution, ExecutionError, get_profile
from hydragnn.models.execution.profiles import register_profile
from hydragnn.models.nn import Primitive
from hydragnn.models.testing import build
from hydragnn.models.testing.graphs import collate, periodic_samples


def test_the_shipped_profiles_and_the_default():
    assert {"reference", "cpu"} <= set(PROFILES) and DEFAULT_PROFILE == "cpu"
    assert get_profile() is Execution.cpu() and get_profile("reference") is Execution.reference()
    reference = Execution.reference()
    assert reference.backends == () and reference.optimizer_step == "torch" and not reference.process
    assert reference.describe() == "execution 'reference': stock PyTorch"
    assert get_profile(reference) is reference
    assert Execution.cpu().as_dict() == {
        "name": "cpu",
        "backends": ["distinct", "dense"],
        "optimizer_step": "flat",
        "threads": "auto",
        "process": True,
        "compile_threads": True,
        "derivatives": "autograd",
    }


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"optimizer_step": "fast"}, r"Execution.optimizer_step: expected one of \['torch', 'fused', 'flat'\]"),
        ({"threads": 2}, r"Execution.threads: expected one of \['keep', 'auto'\]"),
        ({"derivatives": "jax"}, r"Execution.derivatives: expected one of"),
        ({"backends": "dense"}, r"Execution.backends: a tuple of backend names"),
    ],
)
def test_a_profile_field_out_of_its_choices_is_refused_by_name(fields, message):
    with pytest.raises(ExecutionError, match=message):
        Execution("mine", **fields)


def test_unknown_names_and_the_shipped_names_are_guarded():
    with pytest.raises(ExecutionError, match=r"unknown execution profile 'fast'; registered: \["):
        get_profile("fast")
    with pytest.raises(ExecutionError, match="ships with HydraGNN"):
        register_profile(Execution("cpu"))
    mine = register_profile(Execution("test-fused", optimizer_step="fused"))
    try:
        assert get_profile("test-fused") is mine
    finally:
        PROFILES.pop("test-fused")


def test_switching_in_and_out_and_the_report():
    """The profile's backends and derivative engine go in and come out; parameters, state-dict
    keys and outputs stay (the derivative engine is a module without parameters)."""
    model = build("MACE")
    keys = list(model.state_dict())
    assert isinstance(model.derivatives, EnergyDerivatives) and model.derivatives_by == "autograd"
    assert not any("derivatives" in k for k in keys)
    batch = collate(periodic_samples(4.0)[:2])
    want = model(batch)
    mine = Execution("test-func", backends=("dense",), derivatives="func")
    reports = mine.switch_in(model)
    assert reports[0].backend == "dense" and reports[0].switched
    assert model.derivatives_by == "func" and list(model.state_dict()) == keys
    report = mine.report(model)
    assert report["name"] == "test-func" and set(report["primitives"]["E3nnProduct"]) == {"dense"}
    got = model(batch)
    for key in want:
        torch.testing.assert_close(got[key], want[key], rtol=1e-5, atol=1e-6)
    Execution.switch_out(model)
    assert model.derivatives_by == "autograd"
    assert {m.backend for m in model.modules() if isinstance(m, Primitive)} == {"torch"}


def test_the_process_is_left_alone_by_a_profile_without_process_tuning():
    assert Execution.reference().configure_process() is None
    assert Execution.reference().prefer_passive_waiting() is False
    assert Execution.reference().compile_kwargs("cpu", {"backend": "eager"}) == {"backend": "eager"}

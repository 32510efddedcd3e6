"""``Training.compile``: one compiled graph for training batches of any size, one for evaluation,
the same training as eager, interatomic potentials with forces included (by ``torch.func.grad``);
refused under distributed strategies."""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.utils import counters
from train_helpers import build, config, samples

from hydragnn.train import ConfigError, create_dataloaders, train_validate_test
from hydragnn.train.strategies.ddp import DDPStrategy


def _run(model, compile_: bool, tmp_path, kind: str = "graph") -> dict:
    data = samples(kind, 16)
    train, val, _ = create_dataloaders(data[:8], data[8:12], data[12:], 4)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    nn_config = config(kind, epochs=2, compile=compile_)["NeuralNetwork"]
    return train_validate_test(model, optimizer, train, val, None, None, None, nn_config, "c", 0, run_dir=tmp_path)


def test_compiled_training_compiles_once_per_mode_and_trains_as_eager(tmp_path):
    torch._dynamo.reset()
    counters.clear()
    eager, compiled = build(), build()
    edges = {int(d.edge_index.shape[1]) for d in samples("graph", 16)}
    assert len(edges) > 4  # batches differ in edge count: one graph must serve them all
    _run(eager, False, tmp_path / "eager")
    assert counters["stats"]["unique_graphs"] == 0
    summary = _run(compiled, True, tmp_path / "compiled")
    assert counters["stats"]["unique_graphs"] == 2, dict(counters["stats"])  # training + no_grad evaluation
    assert summary["epochs_run"] == 2
    for (name, a), b in zip(eager.state_dict().items(), compiled.state_dict().values(), strict=True):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-6, msg=name)


def test_compiled_potential_trains_with_forces_compiling_once_per_mode(tmp_path):
    """A potential with forces (double backward) compiles: one graph for training batches of
    every edge count and one for evaluation, forces by torch.func, the losses of eager training."""
    from hydragnn.models.model import HydraModel

    torch._dynamo.reset()
    counters.clear()
    edges = {int(d.edge_index.shape[1]) for d in samples("mlip", 16)}
    assert len(edges) > 4
    eager, compiled = build("mlip"), build("mlip")
    seen: list[str] = []
    compiled.register_forward_pre_hook(lambda module, args: seen.append(module.derivatives_by))
    expected = _run(eager, False, tmp_path / "eager", kind="mlip")
    summary = _run(compiled, True, tmp_path / "compiled", kind="mlip")
    assert counters["stats"]["unique_graphs"] == 2, dict(counters["stats"])  # training + no_grad evaluation
    assert seen and set(seen) == {"func"}  # while compiled training ran
    assert [m.derivatives_by for m in compiled.modules() if isinstance(m, HydraModel)] == ["autograd"]  # given back
    assert eager.derivatives_by == "autograd"
    for a, b in zip(expected["history"], summary["history"], strict=True):
        assert b["train_loss"] == pytest.approx(a["train_loss"], rel=1e-3)


def test_compiled_potential_step_equals_eager_forces_and_gradients():
    """One batch: energy, forces and every parameter gradient of the compiled step (forces by
    torch.func.grad) equal those of eager autograd."""
    from torch_geometric.data import Batch

    from hydragnn.models.model import set_derivatives

    model = build("mlip")
    model.train()
    batch = Batch.from_data_list(samples("mlip", 4))

    def step(forward):
        model.zero_grad()
        out = forward(batch)
        loss, _ = model.loss(out, batch)
        loss.backward()
        return {k: v.detach() for k, v in out.items()}, {k: p.grad.clone() for k, p in model.named_parameters()}

    outputs, grads = step(model)
    set_derivatives(model, "func")
    compiled_outputs, compiled_grads = step(torch.compile(model, dynamic=True))
    assert outputs.keys() == compiled_outputs.keys() and "forces" in outputs
    for name, value in outputs.items():
        torch.testing.assert_close(compiled_outputs[name], value, rtol=1e-4, atol=1e-6, msg=name)
    for name, grad in grads.items():
        torch.testing.assert_close(compiled_grads[name], grad, rtol=1e-3, atol=1e-6, msg=name)


def test_compile_is_refused_for_distributed_strategies():
    ddp = DDPStrategy.__new__(DDPStrategy)  # the class's rule: no process group needed to refuse
    with pytest.raises(ConfigError, match=r"Training\.compile: single-process training only \(strategy 'ddp'\)"):
        ddp.compile()


def test_set_derivatives_names_the_choices():
    from hydragnn.models.errors import ModelError
    from hydragnn.models.model import set_derivatives

    with pytest.raises(ModelError, match=r"derivatives: expected one of \['autograd', 'func'\], found 'jax'"):
        set_derivatives(build("mlip"), "jax")


def test_compiled_cpu_kernels_take_one_thread_under_passive_waiting(monkeypatch):
    """Under a profile with ``compile_threads`` (``"cpu"``) and passive OpenMP waiting with two
    intra-op threads the generated CPU kernels run on one
    (``hydragnn.models.execution.compiled_kernel_threads``); the model still compiles as given; the
    reference profile passes no options."""
    from hydragnn.models.execution import Execution
    from hydragnn.train.strategies import Strategy, build_optimizer_factory

    calls = []
    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    monkeypatch.setattr(torch, "compile", lambda model, **kw: calls.append(kw) or model)
    strategy = Strategy()
    strategy.setup(build(), build_optimizer_factory({"type": "Adam", "learning_rate": 1e-3}))
    strategy.compile()
    assert calls == [{"dynamic": True}]  # the reference profile
    strategy.execution = Execution.cpu()
    strategy.compile()
    assert calls[-1] == {"dynamic": True, "options": {"cpp.threads": 1}}
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    strategy.compile()
    assert calls[-1] == {"dynamic": True}

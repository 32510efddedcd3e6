"""``FlatStep``: one fused Adam / AdamW kernel per parameter group over flat buffers, with torch's
per-parameter state layout kept and torch's semantics where the flat layout cannot follow."""

from __future__ import annotations

import io
import warnings

import pytest
import torch
from torch import nn
from torch.optim.optimizer import register_optimizer_step_pre_hook

from hydragnn.models.execution import Execution
from hydragnn.train.strategies import Strategy
from hydragnn.train.strategies import flat as flat_module
from hydragnn.train.strategies.flat import FlatStep


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(5, 7)
        self.b = nn.Linear(7, 3)
        self.spare = nn.Linear(3, 1)  # used only when forward(use_spare=True)

    def forward(self, x: torch.Tensor, use_spare: bool = True) -> torch.Tensor:
        y = self.b(torch.tanh(self.a(x)))
        return self.spare(y) if use_spare else y.sum(-1, keepdim=True)


def _pair(make=lambda ps: torch.optim.AdamW(ps, lr=0.05, weight_decay=0.1, fused=True)):
    torch.manual_seed(0)
    flat_model = Net()
    ref_model = Net()
    ref_model.load_state_dict(flat_model.state_dict())
    return (flat_model, make(list(flat_model.parameters()))), (ref_model, make(list(ref_model.parameters())))


def _train(model, opt, flat, steps, use_spare=lambda i: True):
    gen = torch.Generator().manual_seed(1)
    for i in range(steps):
        x = torch.randn(9, 5, generator=gen)
        model(x, use_spare(i)).pow(2).mean().backward()
        if flat is None or not flat.step():
            opt.step()
        opt.zero_grad(set_to_none=True)


def _assert_close_state(a: dict, b: dict) -> None:
    assert a["param_groups"] == b["param_groups"]
    assert a["state"].keys() == b["state"].keys()
    for i, entry in a["state"].items():
        assert entry.keys() == b["state"][i].keys()
        for key, value in entry.items():
            torch.testing.assert_close(value, b["state"][i][key], rtol=2e-6, atol=1e-7)


def test_flat_steps_follow_torch_and_keep_its_state_layout():
    """Parameters and state follow torch's fused per-parameter step (the vectorised kernel may
    round the last bit differently by position); the parameters view one buffer while training
    and own their storage after release; the state dict has torch's per-parameter layout."""
    (model, opt), (ref, ref_opt) = _pair()
    flat = FlatStep.attach(opt)
    assert flat is not None
    storages = {p.untyped_storage().data_ptr() for p in model.parameters()}
    assert len(storages) == 1
    _train(model, opt, flat, 12)
    _train(ref, ref_opt, None, 12)
    for p, q in zip(model.parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=2e-6, atol=1e-7)
        assert not torch.equal(p, torch.zeros_like(p))
    _assert_close_state(opt.state_dict(), ref_opt.state_dict())
    assert float(opt.state_dict()["state"][0]["step"]) == 12.0
    flat.release()
    assert len({p.untyped_storage().data_ptr() for p in model.parameters()}) == 6
    assert all(p.untyped_storage().nbytes() == p.numel() * 4 for p in model.parameters())
    for s in opt.state.values():
        assert all(t.untyped_storage().nbytes() == t.numel() * 4 for t in s.values())
    _train(model, opt, None, 2)  # the released optimizer is a plain one
    _train(ref, ref_opt, None, 2)
    for p, q in zip(model.parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=2e-6, atol=1e-7)


def test_a_parameter_without_gradient_ends_flat_mode_before_that_step():
    """torch skips a parameter whose gradient is None (no update, no weight decay, no state
    step); flat mode cannot, so it ends and torch steps that batch and the rest."""
    (model, opt), (ref, ref_opt) = _pair()
    flat = FlatStep.attach(opt)
    spare_before = model.spare.weight.detach().clone()
    uses_spare = lambda i: i != 3  # noqa: E731
    _train(model, opt, flat, 6, uses_spare)
    _train(ref, ref_opt, None, 6, uses_spare)
    assert not flat.active
    for p, q in zip(model.parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=2e-6, atol=1e-7)
    state = opt.state_dict()["state"]
    assert float(state[4]["step"]) == 5.0 and float(state[0]["step"]) == 6.0  # spare.weight skipped once
    assert not torch.equal(model.spare.weight, spare_before)


def test_a_state_loaded_mid_training_is_taken_over():
    """``load_state_dict`` (a resume) replaces the state: the next flat step copies it into the
    buffers, and training continues as torch continues from that state."""
    (model, opt), (ref, ref_opt) = _pair()
    _train(ref, ref_opt, None, 4)
    buffer = io.BytesIO()
    torch.save({"model": ref.state_dict(), "opt": ref_opt.state_dict()}, buffer)
    buffer.seek(0)
    ckpt = torch.load(buffer, weights_only=True)
    flat = FlatStep.attach(opt)
    model.load_state_dict(ckpt["model"])
    opt.load_state_dict(ckpt["opt"])
    _train(model, opt, flat, 3)
    _train(ref, ref_opt, None, 3)
    assert flat.active
    for p, q in zip(model.parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=2e-6, atol=1e-7)
    _assert_close_state(opt.state_dict(), ref_opt.state_dict())


def test_a_saved_flat_state_loads_into_a_plain_optimizer():
    """The step counts of a flat state are separate tensors: a plain optimizer that loads them
    counts each parameter once per step."""
    (model, opt), (ref, ref_opt) = _pair(lambda ps: torch.optim.Adam(ps, lr=0.01, fused=True))
    flat = FlatStep.attach(opt)
    _train(model, opt, flat, 3)
    buffer = io.BytesIO()
    torch.save(opt.state_dict(), buffer)
    buffer.seek(0)
    plain = torch.optim.Adam(ref.parameters(), lr=0.01, foreach=False)
    plain.load_state_dict(torch.load(buffer, weights_only=True))
    ref.load_state_dict(model.state_dict())
    _train(ref, plain, None, 2)
    assert {float(s["step"]) for s in plain.state.values()} == {5.0}


@pytest.mark.parametrize(
    "make",
    [
        lambda ps: torch.optim.SGD(ps, lr=0.1, fused=True),
        lambda ps: torch.optim.AdamW(ps, lr=0.1, foreach=True),
        lambda ps: torch.optim.AdamW(ps, lr=0.1, fused=True, amsgrad=True),
        lambda ps: torch.optim.AdamW(ps, lr=torch.tensor(0.1), fused=True),
        lambda ps: torch.optim.AdamW([{"params": ps[:2]}, {"params": ps[2:], "fused": False}], lr=0.1),
    ],
    ids=["sgd", "foreach", "amsgrad", "tensor-lr", "unfused-group"],
)
def test_what_the_flat_layout_cannot_hold_is_left_to_torch(make):
    model = Net()
    opt = make(list(model.parameters()))
    assert FlatStep.attach(opt) is None
    assert len({p.untyped_storage().data_ptr() for p in model.parameters()}) == 6


def test_large_parameter_tensors_are_left_to_torch():
    big = nn.Linear(400, 400)  # 160,400 elements in 2 tensors: the per-tensor cost is small beside the copy
    assert FlatStep.attach(torch.optim.AdamW(big.parameters(), lr=0.1, fused=True)) is None
    assert FlatStep.attach(torch.optim.AdamW(Net().parameters(), lr=0.1, fused=True)) is not None


def test_the_single_process_strategy_flattens_between_begin_and_end_under_a_flat_profile():
    model = Net()
    opt = torch.optim.AdamW(model.parameters(), lr=0.01, fused=True)
    strategy = Strategy()
    strategy.setup(model, lambda _params: opt)
    strategy.begin_training()  # the reference profile: nothing laid out flat
    assert strategy._flat is None and len({p.untyped_storage().data_ptr() for p in model.parameters()}) == 6
    strategy.execution = Execution.cpu()
    strategy.begin_training()
    assert len({p.untyped_storage().data_ptr() for p in model.parameters()}) == 1
    model(torch.randn(4, 5)).sum().backward()
    strategy.step()
    assert all(p.grad is None for p in model.parameters())
    strategy.end_training()
    assert len({p.untyped_storage().data_ptr() for p in model.parameters()}) == 6


def test_the_direct_kernel_call_steps_as_optimizer_step_does():
    """Without hooks the flat step calls the fused kernel itself: bit for bit what the same flat
    step through ``optimizer.step()`` gives (a step hook forces that path), Adam and AdamW,
    with an LR scheduler counting the steps (no 'scheduler before optimizer' warning)."""
    for make in (
        lambda ps: torch.optim.AdamW(ps, lr=0.05, weight_decay=0.1, fused=True),
        lambda ps: torch.optim.Adam(ps, lr=0.05, weight_decay=0.1, fused=True, maximize=True),
    ):
        (model, opt), (ref, ref_opt) = _pair(make)
        flat, ref_flat = FlatStep.attach(opt), FlatStep.attach(ref_opt)
        calls = []
        ref_opt.register_step_post_hook(lambda *args, seen=calls: seen.append(1))
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
        ref_sched = torch.optim.lr_scheduler.StepLR(ref_opt, step_size=2, gamma=0.5)
        gen = torch.Generator().manual_seed(1)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            for _ in range(5):
                x = torch.randn(9, 5, generator=gen)
                for m, f, s in ((model, flat, sched), (ref, ref_flat, ref_sched)):
                    m(x).pow(2).mean().backward()
                    assert f.step()
                    f.zero_grad()
                    s.step()
        assert len(calls) == 5  # the hooked optimizer stepped through optimizer.step()
        for p, q in zip(model.parameters(), ref.parameters(), strict=True):
            assert torch.equal(p, q)
        _assert_close_state(opt.state_dict(), ref_opt.state_dict())
        assert opt.param_groups[0]["lr"] == pytest.approx(0.05 * 0.25)


def test_a_global_step_hook_sees_every_flat_step():
    (model, opt), _ = _pair()
    flat = FlatStep.attach(opt)
    seen = []
    handle = register_optimizer_step_pre_hook(lambda o, a, k: seen.append(o))
    try:
        _train(model, opt, flat, 3)
    finally:
        handle.remove()
    assert seen == [opt] * 3


@pytest.fixture
def fresh_check():
    """The once-per-process check of torch's private names, run again in the test and after it."""
    flat_module.private_step_ok.cache_clear()
    yield
    flat_module.private_step_ok.cache_clear()


def _strategy_run(steps: int) -> tuple[Net, bool]:
    """``steps`` steps of the single-process strategy on a fused AdamW, and whether it was flat."""
    torch.manual_seed(0)
    model = Net()
    strategy = Strategy()
    strategy.execution = Execution.cpu()
    strategy.setup(model, lambda ps: torch.optim.AdamW(ps, lr=0.05, weight_decay=0.1, fused=True))
    strategy.begin_training()
    flat = strategy._flat is not None
    gen = torch.Generator().manual_seed(1)
    for _ in range(steps):
        model(torch.randn(9, 5, generator=gen)).pow(2).mean().backward()
        strategy.step()
    strategy.end_training()
    return model, flat


def _assert_public_steps(model: Net, steps: int) -> None:
    """``model`` equals the same steps of torch's fused AdamW stepping per parameter, bit for bit."""
    torch.manual_seed(0)
    ref = Net()
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=0.05, weight_decay=0.1, fused=True)
    gen = torch.Generator().manual_seed(1)
    for _ in range(steps):
        ref(torch.randn(9, 5, generator=gen)).pow(2).mean().backward()
        ref_opt.step()
        ref_opt.zero_grad(set_to_none=True)
    for p, q in zip(model.parameters(), ref.parameters(), strict=True):
        assert torch.equal(p, q)


def test_this_torch_passes_the_private_name_check(fresh_check):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert flat_module.private_step_ok("cpu")


def test_a_torch_without_a_private_name_steps_per_parameter(fresh_check, monkeypatch):
    """No ``torch._foreach_copy_``: one warning naming it, nothing flat, and the steps are those
    of the public optimizer per parameter."""
    monkeypatch.delattr(torch, "_foreach_copy_")
    with pytest.warns(RuntimeWarning, match=r"no torch\._foreach_copy_ .*optimizer\.step\(\)") as seen:
        model, flat = _strategy_run(4)
        assert FlatStep.attach(torch.optim.AdamW(Net().parameters(), lr=0.1, fused=True)) is None
    assert len(seen) == 1 and not flat
    _assert_public_steps(model, 4)


def test_a_kernel_that_steps_differently_fails_the_check(fresh_check, monkeypatch):
    """Adam's and AdamW's kernels swapped (a torch whose kernel changed meaning): the numerical
    comparison with the public step catches it, nothing is laid out flat and the optimizer's own
    step runs; with the right kernels the same run is flat."""
    monkeypatch.setattr(flat_module, "_KERNELS", {False: "_fused_adamw_", True: "_fused_adam_"})
    with pytest.warns(RuntimeWarning, match=r"_fused_adamw_ on a flat tensor differs from the public adam\(\) step"):
        assert not flat_module.private_step_ok("cpu")
    model, flat = _strategy_run(3)
    assert not flat
    _assert_public_steps(model, 3)
    monkeypatch.undo()
    flat_module.private_step_ok.cache_clear()
    assert _strategy_run(1)[1]

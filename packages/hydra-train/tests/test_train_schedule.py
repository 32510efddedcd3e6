"""What MLIP users expect of a training run: LR warmup, gradient clipping, EMA weights, the second
stage, a wall-clock budget, errors per head in physical units, a live progress bar."""

from __future__ import annotations

import math

import pytest
import torch
from train_helpers import build, config, samples

from hydragnn.train import ConfigError, create_dataloaders, load_config, train_validate_test
from hydragnn.train.averaging import WeightAverage
from hydragnn.train.checkpoint import load_checkpoint
from hydragnn.train.evaluate import evaluate_losses, head_units, mae_report
from hydragnn.train.strategies import Strategy


def _loaders(kind: str = "mlip", n: int = 8, batch_size: int = 2):
    data = samples(kind, n)
    return create_dataloaders(data[: n - 2], data[n - 2 :], data[n - 2 :], batch_size)


def _run(tmp_path, epochs=2, kind="mlip", optimizer=None, scheduler=None, verbosity=0, **training):
    train, val, test_loader = _loaders(kind)
    model = build(kind)
    optimizer = optimizer(model) if optimizer else torch.optim.Adam(model.parameters(), lr=0.01)
    sched = scheduler(optimizer) if scheduler else None
    nn_config = config(kind, epochs=epochs, **training)["NeuralNetwork"]
    summary = train_validate_test(
        model, optimizer, train, val, test_loader, None, sched, nn_config, "s", verbosity, run_dir=tmp_path
    )
    return model, optimizer, summary


def test_warmup_scales_the_first_steps_and_leaves_the_schedule_alone(tmp_path):
    """3 batches per epoch, warmup over 4 steps under cosine decay: steps see lr (k+1)/4 of the
    scheduled value, and the epoch-end learning rates equal those of a run without warmup."""
    runs = {}
    for warm in (0, 4):
        seen: list[float] = []

        def make(model, seen=seen):
            o = torch.optim.SGD(model.parameters(), lr=0.1)
            o.register_step_pre_hook(lambda opt, *_: seen.append(opt.param_groups[0]["lr"]))
            return o

        sched = lambda o: torch.optim.lr_scheduler.CosineAnnealingLR(o, T_max=3)  # noqa: E731
        training = {"Scheduler": {"type": "CosineAnnealingLR", "warmup_steps": warm}}
        _, _, summary = _run(tmp_path / str(warm), epochs=3, optimizer=make, scheduler=sched, **training)
        runs[warm] = (seen, [h["lr"] for h in summary["history"]])
    plain, warmed = runs[0], runs[4]
    assert plain[1] == warmed[1]  # epoch-end learning rates unchanged by the warmup
    scheduled = plain[0]
    assert len(scheduled) == len(warmed[0]) == 9
    for k in range(4):
        assert math.isclose(warmed[0][k], scheduled[k] * (k + 1) / 4, rel_tol=1e-12)
    assert warmed[0][4:] == scheduled[4:]


def test_gradient_clipping_bounds_the_update():
    model = build("mlip")
    strategy = Strategy()
    strategy.max_grad_norm = 1e-3
    strategy.setup(model, lambda p: torch.optim.SGD(p, lr=1.0))
    before = [p.detach().clone() for p in model.parameters()]
    batch = next(iter(_loaders()[0]))
    loss, _ = model.loss(strategy.forward(batch), batch)
    strategy.backward(loss)
    norm = float(torch.nn.utils.get_total_norm([p.grad for p in model.parameters() if p.grad is not None]))
    strategy.step()
    moved = torch.sqrt(sum(((p.detach() - b) ** 2).sum() for p, b in zip(model.parameters(), before)))
    assert norm > 1e-2 and float(moved) == pytest.approx(1e-3, rel=1e-4)  # SGD lr 1: the step is the clipped gradient


def test_clip_grad_norm_reaches_the_strategy_through_the_loop(tmp_path):
    """SGD at lr 1 with the gradients clipped to 1e-6: three steps move the weights by <= 3e-6."""
    model = build("mlip")
    before = [p.detach().clone() for p in model.parameters()]
    train, _, _ = _loaders()
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    nn_config = config("mlip", epochs=1, clip_grad_norm=1e-6, Checkpoint={"enabled": False})["NeuralNetwork"]
    train_validate_test(model, optimizer, train, None, None, None, None, nn_config, "c", 0, run_dir=tmp_path)
    moved = torch.sqrt(sum(((p.detach() - b) ** 2).sum() for p, b in zip(model.parameters(), before)))
    assert len(train) == 3 and 0 < float(moved) <= 3e-6 * (1 + 1e-4)


def test_weight_average_math_and_swap():
    layer = torch.nn.Linear(2, 2)
    average = WeightAverage(layer, decay=0.75, warmup=False)
    first = layer.weight.detach().clone()
    average.update(layer)
    with torch.no_grad():
        layer.weight.add_(1.0)
    second = layer.weight.detach().clone()
    average.update(layer)
    with average.applied(layer):
        torch.testing.assert_close(layer.weight.detach(), 0.75 * first + 0.25 * second)
    assert torch.equal(layer.weight.detach(), second) and average.updates == 2


def test_weight_average_warms_up():
    """With warm-up the n-th update folds in with decay min(decay, (1 + n) / (10 + n)): after 56
    steps from zero towards ones the average holds far less of the start than 0.99 ** 55."""
    layer = torch.nn.Linear(2, 2, bias=False)
    with torch.no_grad():
        layer.weight.zero_()
    warm, plain = WeightAverage(layer, 0.99), WeightAverage(layer, 0.99, warmup=False)
    assert [warm.decay_at(n) for n in (0, 1, 8, 10_000)] == pytest.approx([0.1, 2 / 11, 0.5, 0.99])
    expected = 0.0
    for n in range(56):
        if n == 1:
            with torch.no_grad():
                layer.weight.fill_(1.0)
        warm.update(layer)
        plain.update(layer)
        if n:
            expected += (1 - warm.decay_at(n)) * (1.0 - expected)
    torch.testing.assert_close(warm.average["weight"], torch.full((2, 2), expected))
    assert float(plain.average["weight"][0, 0]) == pytest.approx(1 - 0.99**55)  # 42 % of the way
    assert expected > 0.9


def test_ema_weights_are_validated_kept_and_checkpointed(tmp_path):
    model, _, summary = _run(tmp_path, epochs=1, EMA={"enabled": True, "decay": 0.9})
    ckpt = load_checkpoint(tmp_path / "checkpoint.pt")
    ema = {k.removeprefix("module."): v for k, v in ckpt["callbacks"]["ema"].items() if k.startswith("module.")}
    live = ckpt["model"]
    kept = model.state_dict()
    differs = [k for k in ema if not torch.equal(ema[k], live[k])]
    assert differs  # the average is not the live weights
    chosen = ema if summary["kept_weights"] == "EMA weights" else live
    assert summary["kept_weights"] in ("EMA weights", "raw weights")
    for k in ema:
        if dict(model.named_parameters()).get(k) is not None:
            assert torch.equal(kept[k], chosen[k]), k  # the model kept is the one the summary names
    assert summary["best_epoch"] == 0


def test_last_raw_weights_win_over_a_lagging_average(tmp_path, capsys):
    """An average that barely moved from the initial weights (decay 0.999, no warm-up) validates
    worse than the weights two epochs of training reached: those are kept, and the log says so."""
    ema = {"enabled": True, "decay": 0.999, "warmup": False}
    model, _, summary = _run(tmp_path, epochs=3, verbosity=1, EMA=ema)
    assert summary["kept_weights"] == "raw weights" and summary["best_epoch"] == 2
    assert "raw weights" in capsys.readouterr().out
    ckpt = load_checkpoint(tmp_path / "checkpoint.pt")
    for k, v in ckpt["model"].items():
        assert torch.equal(model.state_dict()[k], v), k  # the live weights of the last epoch
    strategy = Strategy()
    strategy.setup(model, lambda params: torch.optim.SGD(params, lr=0.0))
    assert evaluate_losses(strategy, _loaders()[1])[0] == pytest.approx(summary["best_val_loss"])


def test_second_stage_switches_lr_and_weights_and_resumes(tmp_path):
    kw = {"SecondStage": {"enabled": True, "start": 0.5, "learning_rate": 0.002, "energy_weight": 50.0}}
    model, optimizer, summary = _run(tmp_path, epochs=4, **kw)
    assert [h["second_stage"] for h in summary["history"]] == [False, False, True, True]
    assert summary["second_stage_epoch"] == 2 and summary["best_epoch"] >= 2
    assert [h["lr"] for h in summary["history"]][2:] == [0.002, 0.002]
    assert model.task_weights["energy"] == 50.0
    # the same run interrupted after epoch 2 and resumed: second stage and weights come back
    cut = tmp_path / "cut"
    _run(cut, epochs=3, **kw)
    train, val, test_loader = _loaders()
    again = build("mlip")
    opt = torch.optim.Adam(again.parameters(), lr=0.01)
    resumed = train_validate_test(
        again,
        opt,
        train,
        val,
        test_loader,
        None,
        None,
        config("mlip", epochs=4, **kw)["NeuralNetwork"],
        "s",
        0,
        run_dir=cut,
        resume=True,
    )
    assert again.task_weights["energy"] == 50.0 and resumed["second_stage_epoch"] == 2
    for key, value in model.state_dict().items():
        torch.testing.assert_close(again.state_dict()[key], value, rtol=0, atol=0)


def test_second_stage_factors_keep_the_users_proportions(tmp_path, capsys):
    """``energy_factor`` multiplies the first stage's energy weight; the other heads keep theirs;
    the log names each change. A weight and a factor for one role are refused."""
    start = build("mlip").task_weights
    kw = {"SecondStage": {"enabled": True, "start": 0.5, "energy_factor": 10.0}}
    model, _, summary = _run(tmp_path, epochs=2, verbosity=1, **kw)
    assert model.task_weights["energy"] == pytest.approx(10 * start["energy"])
    assert {k: v for k, v in model.task_weights.items() if k != "energy"} == {
        k: v for k, v in start.items() if k != "energy"
    }
    out = capsys.readouterr().out
    assert f"energy {start['energy']:g} -> {10 * start['energy']:g}" in out and "kept" in out
    from hydragnn.train.config_sections import SecondStageConfig

    with pytest.raises(ConfigError, match="SecondStage: give energy_weight .* or energy_factor"):
        SecondStageConfig.from_dict({"energy_weight": 5.0, "energy_factor": 2.0}, "Training.SecondStage")


def test_the_second_stage_reweighs_every_committee_member(tmp_path):
    """A committee's second stage changes the loss of every member, not member 0's alone."""
    from train_helpers import CUAU_VARIABLES, MLIP_ARCH

    from hydragnn.data import Schema
    from hydragnn.models import Committee, build_model
    from hydragnn.models.committee import member_predictions

    torch.manual_seed(0)
    model = build_model({**MLIP_ARCH, "committee": 2}, Schema.from_dict(CUAU_VARIABLES))
    assert isinstance(model, Committee)
    start = dict(model.task_weights)
    kw = {"SecondStage": {"enabled": True, "start": 0.5, "energy_factor": 10.0}}
    train, val, test_loader = _loaders()
    nn_config = config("mlip", epochs=2, **kw)["NeuralNetwork"]
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    train_validate_test(model, opt, train, val, test_loader, None, None, nn_config, "s", 0, run_dir=tmp_path)
    energy = model.special["energy"]
    batch = next(iter(train))
    model.train()
    out = model(batch)
    for k, member in enumerate(model.members):
        assert member.task_weights[energy] == pytest.approx(10 * start[energy])
        total, heads = member.loss(member_predictions(out, k), batch)
        expected = sum(model.task_weights[n] * value for n, value in heads.items())
        torch.testing.assert_close(total, expected)


def test_a_head_worse_after_the_second_stage_is_named():
    from hydragnn.train.config_sections import SecondStageConfig
    from hydragnn.train.schedule import SecondStage

    stage = SecondStage(SecondStageConfig(enabled=True, start=0.5), num_epoch=4, max_time_s=None)
    stage.epoch = 2
    history = [
        {"epoch": e, "val_errors": {"energy": {"mae": m}, "atomic_energy": {"mae": a}}}
        for e, m, a in ((0, 0.5, 0.02), (1, 0.3, 0.0094), (2, 0.2, 0.05), (3, 0.1, 0.091))
    ]
    lines = stage.worse_heads(history, kept_epoch=3)
    assert len(lines) == 1 and "'atomic_energy'" in lines[0] and "0.091" in lines[0] and "0.0094" in lines[0]
    assert stage.worse_heads(history, kept_epoch=1) == []  # a first-stage epoch kept: nothing to compare


def test_time_budget_stops_at_an_epoch_boundary_and_keeps_the_best(tmp_path, capsys):
    _, _, summary = _run(tmp_path, epochs=5, verbosity=1, max_time_s=1e-3)
    assert summary["epochs_run"] == 1 and summary["stop_reason"] == "max_time_s" and summary["best_epoch"] == 0
    out = capsys.readouterr().out
    assert "time budget max_time_s=0.001 s: stopping after epoch 0" in out and "the best model is kept" in out
    _, _, full = _run(tmp_path / "b", epochs=2, max_time_s=3600.0)
    assert full["epochs_run"] == 2 and full["stop_reason"] == "num_epoch"


def test_errors_per_head_in_units(tmp_path, capsys):
    model, _, summary = _run(tmp_path, epochs=1, verbosity=2)
    out = capsys.readouterr().out
    assert "val MAE energy " in out and " eV/atom, atomic_energy " in out and " eV/Å" in out
    errors = summary["history"][0]["val_errors"]
    assert errors["energy"]["unit"] == "eV/atom" and errors["forces"]["unit"] == "eV/Å"
    _, val, _ = _loaders()
    strategy = Strategy()
    strategy._module = strategy.model = model
    _, _, trues, preds, extras = evaluate_losses(strategy, val, collect=True)
    report = mae_report(trues, preds, extras["natoms"], head_units(model))
    for name in ("energy", "forces"):
        assert math.isclose(extras["errors"][name]["mae"], report[name]["mae"], rel_tol=1e-5)
        assert math.isclose(extras["errors"][name]["rmse"], report[name]["rmse"], rel_tol=1e-5)
        assert report[name]["rmse"] >= report[name]["mae"]
    test_mae = summary["test"]["mae"]
    assert set(test_mae["energy"]) == {"mae", "rmse", "unit", "count"}


def test_progress_bar_on_a_terminal(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HYDRAGNN_PROGRESS", "bar")
    _run(tmp_path, epochs=1, verbosity=2)
    out = capsys.readouterr().out
    assert "epoch 0: " in out and "graphs/s]" in out and "batch" in out  # tqdm's bar, then the epoch line
    monkeypatch.setenv("HYDRAGNN_PROGRESS", "plain")
    _run(tmp_path / "p", epochs=1, verbosity=2)
    assert "graphs/s]" not in capsys.readouterr().out


@pytest.mark.parametrize(
    ("training", "message"),
    [
        ({"EMA": {"enabled": True}, "Parallelism": {"strategy": "fsdp"}}, "EMA.enabled: the weight average needs"),
        ({"EMA": {"decay": 1.0}}, "EMA.decay: expected a value in (0, 1)"),
        ({"SecondStage": {"start": 1.5}}, "SecondStage.start: expected a fraction in (0, 1)"),
        ({"SecondStage": {"learning_rate": 0}}, "SecondStage.learning_rate: expected a value > 0"),
        ({"clip_grad_norm": -1}, "clip_grad_norm: expected a value > 0"),
        ({"max_time_s": "1h"}, "max_time_s: expected float"),
        ({"Scheduler": {"warmup_steps": -2}}, "Scheduler.warmup_steps: expected a value >= 0"),
    ],
)
def test_training_section_errors(training, message):
    with pytest.raises(ConfigError) as err:
        load_config(config("mlip", **training))
    assert message in str(err.value)

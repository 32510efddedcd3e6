"""The seed API end to end on tiny CuAu data: train_validate_test, test, best-epoch restore,
NaN handling, atomic checkpoints, resume equivalence, save_model / load_existing_model."""

from __future__ import annotations

import math

import pytest
import torch
from train_helpers import build, config, params, samples

from hydragnn.train import (
    CheckpointError,
    TrainingAborted,
    create_dataloaders,
    load_existing_model,
    save_model,
    test,
    train_validate_test,
)
from hydragnn.train.checkpoint import atomic_save, load_checkpoint


def _nn(epochs: int = 2, **training) -> dict:
    return config(epochs=epochs, **training)["NeuralNetwork"]


def _loaders(kind: str = "graph", n: int = 16, batch_size: int = 4):
    data = samples(kind, n)
    k = n // 4
    return create_dataloaders(data[: n - 2 * k], data[n - 2 * k : n - k], data[n - k :], batch_size)


def test_seed_api_end_to_end(tmp_path, capsys):
    train, val, test_loader = _loaders()
    model = build()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    summary = train_validate_test(
        model, optimizer, train, val, test_loader, None, None, _nn(2), "seed", 2, run_dir=tmp_path
    )
    assert summary["epochs_run"] == 2 and summary["best_epoch"] in (0, 1)
    assert optimizer.param_groups[0]["fused"] is True  # left to torch: the fused step, not the loop
    assert set(summary["test"]["heads"]) == {"energy_per_atom", "au_fraction"}
    out = capsys.readouterr().out
    assert "epoch 1:" in out and "graphs/s" in out and f"best epoch {summary['best_epoch']}" in out
    error, task_errors, targets, predictions = test(test_loader, model, 0)
    assert test(test_loader, model, 0, reduce_ranks=False)[0] == error  # one process: the same
    lean = test(test_loader, model, 0, return_samples=False)
    assert lean[0] == error and lean[2] == {} and lean[3] == {}
    assert math.isclose(error, summary["test"]["loss"], rel_tol=1e-5)
    assert targets["au_fraction"].shape == predictions["au_fraction"].shape == (4, 1)
    assert (tmp_path / "checkpoint.pt").is_file()


def test_mlip_test_returns_forces(tmp_path):
    train, val, test_loader = _loaders("mlip", n=8, batch_size=2)
    model = build("mlip")
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    summary = train_validate_test(
        model,
        optimizer,
        train,
        val,
        test_loader,
        None,
        None,
        config("mlip", epochs=1)["NeuralNetwork"],
        "m",
        0,
        run_dir=tmp_path,
    )
    assert summary["test"]["mae"]["forces"]["unit"] == "eV/Å"
    _, heads, targets, predictions = test(test_loader, model, 0)
    assert predictions["forces"].shape == targets["forces"].shape == (2 * 32, 3)
    assert torch.isfinite(predictions["forces"]).all() and predictions["forces"].abs().sum() > 0


def test_best_epoch_is_restored(tmp_path, capsys):
    train, val, test_loader = _loaders()
    model = build()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    # epoch 2 trains with a 50x learning rate: a worse model that must not be kept
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda e: 50.0 if e >= 2 else 1.0)
    summary = train_validate_test(
        model, optimizer, train, val, test_loader, None, scheduler, _nn(3), "best", 1, run_dir=tmp_path
    )
    losses = [h["val_loss"] for h in summary["history"]]
    assert losses[2] > min(losses[:2]), losses
    assert summary["best_epoch"] == losses.index(min(losses)) < 2
    error, heads, *_ = test(val, model, 0)
    assert math.isclose(error, summary["best_val_loss"], rel_tol=1e-5)
    assert f"best epoch {summary['best_epoch']}" in capsys.readouterr().out


def _poison(data, index):
    bad = data[index].clone()
    bad.graph_output = torch.full_like(bad.graph_output, float("nan"))
    data[index] = bad


def test_nan_loss_aborts_naming_the_batch(tmp_path):
    data = samples("graph", 16)
    _poison(data, 3)
    train, val, _ = create_dataloaders(data[:8], data[8:12], None, 4)
    model = build()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    with pytest.raises(TrainingAborted, match=r"epoch 0, batch \d of 2") as info:
        train_validate_test(model, optimizer, train, val, None, None, None, _nn(1), "nan", 0, run_dir=tmp_path)
    assert "energy_per_atom=nan" in str(info.value)
    assert all(torch.isfinite(v).all() for v in params(model).values())


def test_nan_loss_skip_policy(tmp_path):
    data = samples("graph", 16)
    _poison(data, 3)
    train, val, _ = create_dataloaders(data[:8], data[8:12], None, 4)
    model = build()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    nn_cfg = _nn(2, nan_policy="skip", max_skipped_fraction=0.5)
    summary = train_validate_test(model, optimizer, train, val, None, None, None, nn_cfg, "skip", 0, run_dir=tmp_path)
    assert summary["skipped_batches"] == 2  # one poisoned batch per epoch
    assert all(torch.isfinite(v).all() for v in params(model).values())


def test_skipping_more_than_the_allowed_fraction_aborts(tmp_path):
    data = samples("graph", 16)
    _poison(data, 3)
    train, val, _ = create_dataloaders(data[:8], data[8:12], None, 4)
    model = build()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    with pytest.raises(TrainingAborted, match=r"1 of 2 training batches .*more than max_skipped_fraction=0\.1"):
        train_validate_test(
            model, optimizer, train, val, None, None, None, _nn(2, nan_policy="skip"), "s", 0, run_dir=tmp_path
        )


def test_atomic_checkpoint_leaves_no_partial_file(tmp_path):
    path = tmp_path / "ck.pt"
    atomic_save({"a": torch.ones(3)}, path)
    with pytest.raises(CheckpointError):
        atomic_save({"a": torch.zeros(3), "bad": lambda: None}, path)  # cannot be pickled mid-write
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ck.pt"]
    assert torch.equal(torch.load(path, weights_only=True)["a"], torch.ones(3))


def test_resume_gives_the_same_parameters(tmp_path):
    train, val, _ = _loaders()

    def run(epochs, run_dir, resume=False):
        model = build()
        optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
        scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, factor=0.5, patience=0)
        summary = train_validate_test(
            model, optimizer, train, val, None, None, scheduler, _nn(epochs), "r", 0, run_dir=run_dir, resume=resume
        )
        return model, summary, optimizer

    straight, s1, opt1 = run(4, tmp_path / "a")
    run(2, tmp_path / "b")  # 'killed' after epoch 1: its checkpoint is the last state
    resumed, s2, opt2 = run(4, tmp_path / "b", resume=True)
    for k, v in params(straight).items():
        assert torch.equal(v, params(resumed)[k]), k
    assert s1["best_epoch"] == s2["best_epoch"]
    assert [h["val_loss"] for h in s1["history"]] == [h["val_loss"] for h in s2["history"]]
    assert opt1.param_groups[0]["lr"] == opt2.param_groups[0]["lr"]


def test_resume_without_checkpoint_is_an_error(tmp_path):
    train, val, _ = _loaders()
    model = build()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    with pytest.raises(CheckpointError, match="no such checkpoint"):
        train_validate_test(
            model, optimizer, train, val, None, None, None, _nn(1), "x", 0, run_dir=tmp_path, resume=True
        )


def test_save_and_load_existing_model_round_trip(tmp_path):
    train, _, _ = _loaders()
    model = build()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    for batch in train:
        loss, _ = model.loss(model(batch), batch)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    path = save_model(model, optimizer, "run", path=str(tmp_path))
    assert path == tmp_path / "run" / "run.pt"
    other = build(seed=1)
    other_opt = torch.optim.Adam(other.parameters(), lr=0.5)
    load_existing_model(other, "run", path=str(tmp_path), optimizer=other_opt)
    for k, v in params(model).items():
        assert torch.equal(v, params(other)[k])
    a, b = optimizer.state_dict(), other_opt.state_dict()
    assert a["param_groups"][0]["lr"] == b["param_groups"][0]["lr"] == 0.01
    for i, st in a["state"].items():
        for key, value in st.items():
            assert torch.equal(torch.as_tensor(value), torch.as_tensor(b["state"][i][key]))


def test_load_existing_model_refuses_another_architecture(tmp_path):
    save_model(build(), None, "run", path=str(tmp_path))
    with pytest.raises(CheckpointError, match="missing keys|unexpected keys|shape mismatches"):
        load_existing_model(build("mlip"), "run", path=str(tmp_path))


def test_a_checkpoint_from_before_head_standardisation_says_how_to_continue_it(tmp_path):
    """A graph model's checkpoint without the heads' input_norm buffers (hydra-models 0.2) names the key to set."""
    model = build()
    state = {k: v for k, v in model.state_dict().items() if ".input_norm." not in k}
    assert len(state) < len(model.state_dict())
    save_model(model, None, "run", path=str(tmp_path))
    ckpt = tmp_path / "run" / "run.pt"
    blob = torch.load(ckpt, weights_only=True)
    blob["model_state_dict"] = state
    torch.save(blob, ckpt)
    with pytest.raises(CheckpointError, match='output_heads.graph.input_norm to "none"'):
        load_existing_model(build(), "run", path=str(tmp_path))


def test_a_checkpoint_holding_code_is_refused_with_its_cause(tmp_path):
    import os

    class Evil:
        def __reduce__(self):
            return (os.mkdir, (str(tmp_path / "pwned"),))

    path = tmp_path / "checkpoint.pt"
    torch.save({"model": Evil()}, path)
    with pytest.raises(CheckpointError, match="corrupted or unsafe checkpoint: it holds a Python object") as err:
        load_checkpoint(path)
    assert "weights_only=False" not in str(err.value) and not (tmp_path / "pwned").exists()


def test_an_epoch_reads_the_host_once_per_batch_beyond_the_step_itself(monkeypatch):
    """Besides what a training step itself reads, an epoch reads the host once per batch: the
    batch's losses in one transfer (their finiteness is what the non-finite policy needs, their
    values what the running metrics add up). Reads are ``item()`` (a dispatcher op) and
    ``tolist()`` (which is not: counted by a wrapper)."""
    from hydragnn.models.testing.host_sync import HostSyncDetector
    from hydragnn.train.epoch import train_epoch
    from hydragnn.train.progress import Progress
    from hydragnn.train.strategies import Strategy, build_optimizer_factory

    data = samples("graph", 16)

    def setup(n_graphs):
        strategy = Strategy()
        strategy.setup(build(), build_optimizer_factory({"type": "Adam", "learning_rate": 0.01}))
        return strategy, create_dataloaders(data[:n_graphs], None, None, 4)[0]

    listed = []
    tolist = torch.Tensor.tolist
    monkeypatch.setattr(torch.Tensor, "tolist", lambda self: listed.append(1) or tolist(self))

    def reads(run) -> int:
        listed.clear()
        with HostSyncDetector() as detector:
            run()
        return detector.violations.count("aten::_local_scalar_dense") + len(listed)

    strategy, loader = setup(8)
    batches = iter(loader)
    next(batches)  # the iterator's creation is not part of a step

    def one_step():
        batch = strategy.to_device(next(batches))
        loss, _ = strategy.unwrap().loss(strategy.forward(batch), batch)
        strategy.backward(loss)
        strategy.step()

    per_step = reads(one_step)
    short, long = (setup(n) for n in (8, 16))  # 2 and 4 batches
    epoch = [reads(lambda s=s, ld=ld: train_epoch(s, ld, 0, "error", Progress(0))) for s, ld in (short, long)]
    assert epoch[1] - epoch[0] == 2 * (per_step + 1)

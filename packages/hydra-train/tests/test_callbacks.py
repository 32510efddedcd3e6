"""The training loop's callbacks: a user-written callback runs at every hook, is checkpointed and
resumed, can stop a run and add to the history; config callbacks come from the registry or an
installed entry point; bad specs name where they are."""

from __future__ import annotations

import textwrap

import pytest
import torch
from train_helpers import build, config, params, samples

from hydragnn.train import ConfigError, create_dataloaders, train_validate_test
from hydragnn.train.callbacks import Callback, register_callback, registered_callbacks
from hydragnn.train.checkpoint import atomic_save, load_checkpoint


class Counter(Callback):
    """Counts hooks and optimizer steps (its state: the steps), tags each record, stops after
    ``stop_after`` epochs when given."""

    key = "counter"

    def __init__(self, stop_after: int | None = None) -> None:
        self.stop_after = stop_after
        self.steps = 0
        self.calls: dict[str, int] = {}
        self.restored: int | None = None

    def _hit(self, hook: str) -> None:
        self.calls[hook] = self.calls.get(hook, 0) + 1

    def on_fit_start(self, loop):
        self._hit("fit_start")

    def on_epoch_start(self, loop, epoch):
        self._hit("epoch_start")

    def before_forward(self, loop, batch_index):
        self._hit("before_forward")

    def before_step(self, loop):
        self._hit("before_step")

    def after_step(self, loop, graphs, loss):
        assert graphs > 0 and loss == loss
        self.steps += 1

    def on_epoch_end(self, loop, record):
        record["counter_steps"] = self.steps
        if self.stop_after is not None and len(loop.history) + 1 >= self.stop_after:
            loop.request_stop("counter", f"counter: stopping after {self.steps} steps")

    def on_fit_end(self, loop):
        self._hit("fit_end")

    def summary(self):
        return {"counter_steps": self.steps}

    def state_dict(self):
        return {"steps": self.steps}

    def load_state_dict(self, state):
        self.steps = self.restored = int(state["steps"])


def _train(run_dir, epochs, user=(), resume=False, **training):
    data = samples("graph", 16)
    train, val, _ = create_dataloaders(data[:8], data[8:12], data[12:], 4)  # 2 batches per epoch
    model = build()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    nn_config = config("graph", epochs=epochs, **training)["NeuralNetwork"]
    summary = train_validate_test(
        model,
        optimizer,
        train,
        val,
        None,
        None,
        None,
        nn_config,
        "cb",
        0,
        run_dir=run_dir,
        resume=resume,
        callbacks=user,
    )
    return model, summary


def test_a_user_callback_runs_at_every_hook_and_is_checkpointed_and_resumed(tmp_path):
    counter = Counter()
    straight, summary = _train(tmp_path / "a", 3, [counter])
    assert counter.calls == {"fit_start": 1, "epoch_start": 3, "before_forward": 6, "before_step": 6, "fit_end": 1}
    assert counter.steps == 6 and summary["counter_steps"] == 6
    assert [h["counter_steps"] for h in summary["history"]] == [2, 4, 6]
    assert load_checkpoint(tmp_path / "a" / "checkpoint.pt")["callbacks"]["counter"] == {"steps": 6}

    _train(tmp_path / "b", 2, [Counter()])
    again = Counter()
    resumed, summary = _train(tmp_path / "b", 3, [again], resume=True)
    assert again.restored == 4 and again.steps == 6 and summary["counter_steps"] == 6
    for key, value in params(straight).items():  # a user callback leaves the run as it was
        assert torch.equal(value, params(resumed)[key]), key


def test_a_callback_can_stop_the_run(tmp_path):
    _, summary = _train(tmp_path, 5, [Counter(stop_after=2)])
    assert summary["epochs_run"] == 2 and summary["stop_reason"] == "counter" and summary["stopped_early"]
    assert load_checkpoint(tmp_path / "checkpoint.pt")["epoch"] == 1  # the stopping epoch is checkpointed


def test_config_callbacks_come_from_the_registry(tmp_path):
    built: list[Counter] = []

    @register_callback("test-counter")
    def make(stop_after: int | None = None) -> Counter:
        built.append(Counter(stop_after))
        return built[-1]

    assert "test-counter" in registered_callbacks()
    _, summary = _train(tmp_path, 4, **{"callbacks": [{"name": "test-counter", "stop_after": 1}]})
    assert len(built) == 1 and summary["epochs_run"] == 1 and summary["stop_reason"] == "counter"
    with pytest.raises(ConfigError, match=r"Training\.callbacks\[0\]: options \['every'\] do not fit"):
        _train(tmp_path / "x", 1, **{"callbacks": [{"name": "test-counter", "every": 2}]})
    with pytest.raises(ConfigError, match=r"Training\.callbacks\[1\]: unknown callback 'nope'.*test-counter"):
        _train(tmp_path / "y", 1, **{"callbacks": [{"name": "test-counter"}, {"name": "nope"}]})
    with pytest.raises(ConfigError, match=r"Training\.callbacks\[0\]: an object with a non-empty string 'name'"):
        _train(tmp_path / "z", 1, **{"callbacks": [{"stop_after": 1}]})


def test_config_callbacks_come_from_an_installed_entry_point(tmp_path, monkeypatch):
    """A distribution that declares ``[project.entry-points."hydragnn.train.callbacks"]``: its
    dist-info on ``sys.path`` is all importlib.metadata reads."""
    site = tmp_path / "site"
    (site / "my_plugin_cb").mkdir(parents=True)
    (site / "my_plugin_cb" / "__init__.py").write_text(
        textwrap.dedent(
            """
            from hydragnn.train.callbacks import Callback

            class Tagger(Callback):
                key = "tagger"

                def __init__(self, tag="t"):
                    self.tag = tag

                def on_epoch_end(self, loop, record):
                    record["tag"] = self.tag
            """
        )
    )
    info = site / "my_plugin_cb-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: my-plugin-cb\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[hydragnn.train.callbacks]\ntagger = my_plugin_cb:Tagger\n")
    monkeypatch.syspath_prepend(str(site))
    assert registered_callbacks()["tagger"] == "my_plugin_cb:Tagger"
    _, summary = _train(tmp_path / "run", 1, **{"callbacks": [{"name": "tagger", "tag": "hello"}]})
    assert summary["history"][0]["tag"] == "hello"


def test_a_config_callback_that_fails_is_refused_before_the_data_loads(tmp_path):
    """A constructor that raises, and a key taken by a built-in (``ema``) or by another config
    callback: ConfigErrors naming Training.callbacks[i], from run_training before it reads any
    data (the data set here does not exist: its error would come first otherwise)."""
    from hydragnn.train.pipeline import run_training

    class Clash(Callback):
        key = "ema"

    @register_callback("test-raises")
    def raises(level: int = 1) -> Callback:
        raise RuntimeError(f"no licence for level {level}")

    register_callback("test-clash")(Clash)
    register_callback("test-counter-2")(Counter)
    cfg = config("graph", n=8, epochs=1)
    del cfg["Dataset"]["generator"], cfg["Dataset"]["split"]
    cfg["Dataset"]["train_file"] = str(tmp_path / "missing.xyz")
    cases = {
        "test-raises": r"callbacks\[0\]: callback 'test-raises' failed to build with options \{'level': 3\}: "
        r"RuntimeError: no licence for level 3",
        "test-clash": r"callbacks\[0\]: callback 'test-clash' has the checkpoint key 'ema' of a built-in callback",
    }
    for name, message in cases.items():
        cfg["NeuralNetwork"]["Training"]["callbacks"] = [
            {"name": name, **({"level": 3} if name == "test-raises" else {})}
        ]
        with pytest.raises(ConfigError, match=message):
            run_training(cfg, tmp_path / name, verbosity=0)
    cfg["NeuralNetwork"]["Training"]["callbacks"] = []
    with pytest.raises(Exception, match="missing.xyz"):  # noqa: B017,PT011 (without them: the data's error)
        run_training(cfg, tmp_path / "none", verbosity=0)
    cfg["NeuralNetwork"]["Training"]["callbacks"] = [{"name": "test-counter-2"}, {"name": "test-counter-2"}]
    with pytest.raises(ConfigError, match=r"callbacks\[1\]: callback key 'counter' is also that of .*callbacks\[0\]"):
        run_training(cfg, tmp_path / "twice", verbosity=0)


def test_two_callbacks_with_one_key_are_refused(tmp_path):
    with pytest.raises(ValueError, match="two callbacks are named 'counter'"):
        _train(tmp_path, 1, [Counter(), Counter()])


def test_a_checkpoint_from_before_callbacks_resumes(tmp_path):
    """Checkpoints written before the ``callbacks`` section kept warmup and EMA states at the top."""
    training = {"Scheduler": {"warmup_steps": 5}, "EMA": {"enabled": True, "decay": 0.9}}
    straight, _ = _train(tmp_path / "a", 3, **training)
    _train(tmp_path / "b", 2, **training)
    path = tmp_path / "b" / "checkpoint.pt"
    ckpt = load_checkpoint(path)
    states = ckpt.pop("callbacks")
    ckpt["warmup_done"], ckpt["ema"] = states["warmup"]["done"], states["ema"]
    ckpt["second_stage_epoch"] = None
    atomic_save(ckpt, path)
    resumed, _ = _train(tmp_path / "b", 3, resume=True, **training)
    for key, value in params(straight).items():
        assert torch.equal(value, params(resumed)[key]), key

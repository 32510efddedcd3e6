"""``Training.intra_op_threads``: the run's thread count measured ("auto") or fixed, the
process's count given back afterwards."""

from __future__ import annotations

import pytest
import torch
from train_helpers import build, config, samples

from hydragnn.train import ConfigError, create_dataloaders, train_validate_test
from hydragnn.train.config import parse_training
from hydragnn.train.threads import ThreadTuner


def _tune(cost: dict[int, float]) -> tuple[ThreadTuner, list[str], set[int]]:
    """Drive a tuner with a clock on which a step of 2 graphs takes ``cost[threads]`` seconds."""
    now, lines, ran = [0.0], [], set()
    tuner = ThreadTuner("auto", measure=True, log=lines.append, clock=lambda: now[0])
    tuner.new_epoch()
    for _ in range(100):
        if tuner.chosen is not None:
            break
        ran.add(torch.get_num_threads())
        now[0] += cost[torch.get_num_threads()]
        tuner.step_done(2)
    return tuner, lines, ran


def test_auto_keeps_the_fastest_count_and_gives_the_process_its_own_back(four_threads):
    tuner, lines, ran = _tune({4: 3.0, 2: 1.0, 1: 1.5})
    assert ran == {4, 2, 1}  # the count and each halving were timed
    assert tuner.chosen == 2 and torch.get_num_threads() == 2
    assert lines == ["intra-op threads: 2 of 4 (median step time per graph by thread count: 4: 1.5e+03 ms, "
                     "2: 500 ms, 1: 750 ms; NeuralNetwork.Training.intra_op_threads sets it)"]  # fmt: skip
    tuner.step_done(2)  # later steps change nothing
    assert torch.get_num_threads() == 2
    tuner.restore()
    assert torch.get_num_threads() == 4


@pytest.mark.parametrize(
    ("cost", "chosen"),
    [({4: 1.0, 2: 1.05, 1: 1.2}, 4), ({4: 1.0, 2: 1.02, 1: 1.2}, 2), ({4: 1.0, 2: 1.02, 1: 1.025}, 1)],
)
def test_fewer_threads_win_a_tie_within_three_percent(four_threads, cost, chosen):
    tuner, _, _ = _tune(cost)
    assert tuner.chosen == chosen and torch.get_num_threads() == chosen


def test_nothing_is_timed_where_measuring_is_off(four_threads):
    tuner = ThreadTuner("auto", measure=False, log=pytest.fail)
    for _ in range(30):
        tuner.step_done(2)
    assert tuner.chosen is None and torch.get_num_threads() == 4


def _train(tmp_path, threads, batch_size: int = 4, epochs: int = 2, verbosity: int = 0):
    model = build()
    seen: list[int] = []
    model.register_forward_pre_hook(lambda module, args: seen.append(torch.get_num_threads()))
    data = samples("graph", 16)
    train, val, _ = create_dataloaders(data[:8], data[8:12], data[12:], batch_size)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    nn_config = config("graph", epochs=epochs, intra_op_threads=threads)["NeuralNetwork"]
    train_validate_test(model, optimizer, train, val, None, None, None, nn_config, "t", verbosity, run_dir=tmp_path)
    return seen


def test_a_fixed_count_holds_for_the_run(tmp_path, four_threads):
    seen = _train(tmp_path, 1)
    assert seen and set(seen) == {1}  # training and validation
    assert torch.get_num_threads() == 4


def test_auto_measures_real_training_steps_and_says_what_it_chose(tmp_path, four_threads, capsys):
    seen = _train(tmp_path, "auto", batch_size=1, epochs=3, verbosity=1)  # 24 steps: all timed ones fit
    assert {4, 2, 1} <= set(seen)
    chosen = [line for line in capsys.readouterr().out.splitlines() if line.startswith("intra-op threads: ")]
    assert len(chosen) == 1 and " of 4 (median step time per graph by thread count: 4: " in chosen[0], chosen
    assert torch.get_num_threads() == 4


@pytest.mark.parametrize("value", [0, "fast", 1.5, True])
def test_bad_thread_settings_are_refused_by_name(value):
    with pytest.raises(ConfigError, match=r"NeuralNetwork\.Training\.intra_op_threads: expected"):
        parse_training({"intra_op_threads": value})

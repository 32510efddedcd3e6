"""How many committee members a time budget buys: ``Architecture.committee: "auto"``.

A committee of K members (:class:`hydragnn.models.Committee`) costs K times one model's compute
per step (measured 3.2-3.3x for three members on both MLIP benchmarks), so under
``Training.max_time_s`` each member gets a K-th of the epochs. Averaging members pays once one
model has stopped gaining from more epochs, and costs where it has not: on the GFN2-xTB
organic-molecule benchmark one model reaches its 400-epoch errors by 150 epochs (13,600 steps),
and three members of 115-141 epochs each cut the unseen-molecule force error by 13 %; on EMT
Cu-Au three members of 45 epochs (1,800 steps) each lost 7x in energy to one model of 149
(``docs/notes/organic_benchmark.md``). The rule: the most members, up to :data:`MAX_MEMBERS`,
of which each still gets :data:`MIN_EPOCHS` epochs and :data:`MIN_STEPS` optimizer steps, as
estimated from a few timed training steps of a throwaway member; one member without a time
budget (a committee would then multiply the run's time, not share it). Large data sets thus
stay one model: 100 epochs of 50,000 structures take 625,000 steps per member.

The decision is the run's: the resolved count is what ``config.json`` and the artifact record (a
rerun of that config repeats it without timing), and a resumed run takes it from its run folder.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

__all__ = [
    "MAX_MEMBERS",
    "MIN_EPOCHS",
    "MIN_STEPS",
    "CommitteeChoice",
    "choose_members",
    "stored_members",
    "time_train_step",
]

MAX_MEMBERS = 3
"""The largest committee ``"auto"`` builds (serving cost grows with it; the measured gain of a
fourth member was 3 % on the unseen forces)."""
MIN_EPOCHS = 100
"""Epochs each member must get in the budget."""
MIN_STEPS = 8_000
"""Optimizer steps each member must get in the budget."""
VALIDATION_STEP_COST = 0.5
"""A validation batch's cost in training steps (forward and the force backward, no update)."""


@dataclass(frozen=True)
class CommitteeChoice:
    """What ``"auto"`` decided and from what: ``members`` and a line for the log."""

    members: int
    reason: str


def choose_members(
    step_s: float | None, train_batches: int, val_batches: int, max_time_s: float | None, num_epoch: int
) -> CommitteeChoice:
    """The committee size for a run whose training step takes ``step_s`` seconds (one member),
    with ``train_batches`` / ``val_batches`` per epoch, a budget of ``max_time_s`` and at most
    ``num_epoch`` epochs (see the module docstring for the rule)."""
    if max_time_s is None or step_s is None:
        return CommitteeChoice(1, "1 member: no Training.max_time_s for members to share")
    epoch_s = step_s * (train_batches + VALIDATION_STEP_COST * val_batches)
    for k in range(MAX_MEMBERS, 0, -1):
        epochs = min(float(num_epoch), max_time_s / (k * epoch_s))
        steps = epochs * train_batches
        if k == 1 or (epochs >= MIN_EPOCHS and steps >= MIN_STEPS):
            return CommitteeChoice(
                k,
                f"{k} member{'s' if k > 1 else ''}: a training step takes {step_s * 1e3:.1f} ms, so each of "
                f"{k} gets ~{epochs:.0f} epochs ({steps:,.0f} steps) of max_time_s {max_time_s:g} s "
                f"(more members need >= {MIN_EPOCHS} epochs and >= {MIN_STEPS:,} steps each)",
            )
    raise AssertionError("unreachable: k == 1 always returns")


def time_train_step(
    model: nn.Module,
    batches: Iterable[Any],
    optimizer_factory: Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer],
    device: torch.device,
    steps: int = 6,
    warmup: int = 2,
) -> float:
    """Median seconds of one training step (the batch from the loader, forward, loss, backward,
    update) of ``model`` on the first ``warmup + steps`` batches of ``batches`` (cycled when
    shorter). ``model`` is a throwaway: its weights are updated; the caller's random state is left
    as it was."""
    model = model.to(device).train()
    optimizer = optimizer_factory(model.parameters())
    times: list[float] = []
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        while len(times) < warmup + steps:
            seen = len(times)
            iterator = iter(batches)
            while len(times) < warmup + steps:
                t0 = time.perf_counter()
                batch = next(iterator, None)
                if batch is None:
                    break
                batch = batch.to(device)
                out = model(batch)
                loss, _ = model.loss(out, batch)  # type: ignore[operator]  # a HydraModel
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                times.append(time.perf_counter() - t0)
            if len(times) == seen:
                raise ValueError("time_train_step: no batches to time")
    return statistics.median(times[warmup:])


def stored_members(run_dir: Path) -> int:
    """The committee size a run folder's ``config.json`` recorded (what a resumed ``"auto"`` run
    takes instead of timing again)."""
    path = run_dir / "config.json"
    try:
        members = json.loads(path.read_text())["NeuralNetwork"]["Architecture"]["committee"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(
            f"{path}: no committee size recorded ({exc}); the run cannot resume an 'auto' committee"
        ) from exc
    if not isinstance(members, int) or isinstance(members, bool) or members < 1:
        raise ValueError(f"{path}: NeuralNetwork.Architecture.committee is {members!r}, not a member count")
    return members

"""The training setting an interatomic potential gets for what its config leaves out.

With ``enable_interatomic_potential`` the generic defaults (Adam at 1e-3, no weight average,
energy and forces weighted alike, one stage) train a poor potential: the force term swamps
nothing and the energies are never refined. An MLIP config therefore starts from the setting
measured best on the EMT Cu-Au and GFN2-xTB organic-molecule benchmarks
(``docs/notes/mlip_fit.md``, ``docs/notes/organic_benchmark.md``): AdamW at 5e-3 with 100 warmup
steps, ReduceLROnPlateau (factor 0.7, patience 4), gradient clipping at 10, an EMA of the weights
(0.99, warmed up), energy / forces loss weights 100 / 100, and a second stage over the last 20 %
of the epochs (or of ``max_time_s``) at 5e-4 with the energy weight multiplied by 10 (1000 / 100
at the default weights; the weights a config gives keep their proportions), and a committee
sized by the time budget (``Architecture.committee: "auto"``, :mod:`.committee_size`): up to three
members when the budget gives each enough epochs (small data sets: they transfer better to unseen
molecules), else one model.

Rules: a ``Training`` subsection you give (``Optimizer``, ``Scheduler``, ``EMA``,
``SecondStage``) replaces the default one whole; a key you give (``clip_grad_norm``) wins; the
loss weights are filled only where neither ``task_weights`` nor that weight is given (in
``Architecture`` or ``Training``); FSDP runs get no EMA (it needs the whole parameters on every
rank). What was filled is logged and written into the run's
``config.json`` like every other default.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

__all__ = ["MLIP_ARCHITECTURE", "MLIP_LOSS_WEIGHTS", "MLIP_TRAINING", "with_mlip_defaults"]

MLIP_TRAINING: dict[str, Any] = {
    "Optimizer": {"type": "AdamW", "learning_rate": 0.005},
    "Scheduler": {"type": "ReduceLROnPlateau", "factor": 0.7, "patience": 4, "warmup_steps": 100},
    "clip_grad_norm": 10.0,
    "EMA": {"enabled": True, "decay": 0.99},
    "SecondStage": {
        "enabled": True,
        "start": 0.8,
        "learning_rate": 0.0005,
        "energy_factor": 10.0,
    },
}
"""``Training`` keys an MLIP run takes when its config leaves them out."""

MLIP_LOSS_WEIGHTS: dict[str, float] = {"energy_weight": 100.0, "forces_weight": 100.0}
"""Loss weights an MLIP takes when neither they nor ``task_weights`` are given."""

MLIP_ARCHITECTURE: dict[str, Any] = {"committee": "auto"}
"""``Architecture`` keys an MLIP takes when its config leaves them out."""


def with_mlip_defaults(
    architecture: Mapping[str, Any], training: Mapping[str, Any] | None
) -> tuple[dict[str, Any], dict[str, Any] | None, list[str]]:
    """``(architecture, training, filled)``: copies with the MLIP defaults filled in where left
    out, and the JSON paths filled (empty, and the inputs unchanged, for a model that is not an
    interatomic potential). Malformed sections are left for the parsers to report."""
    arch = copy.deepcopy(dict(architecture))
    train = copy.deepcopy(dict(training)) if isinstance(training, Mapping) else training
    if arch.get("enable_interatomic_potential") is not True or (train is not None and not isinstance(train, dict)):
        return arch, train, []
    train = {} if train is None else train
    parallelism = train.get("Parallelism")
    sharded = isinstance(parallelism, Mapping) and parallelism.get("strategy") in ("fsdp", "fsdp2")
    filled = []
    for key, value in MLIP_TRAINING.items():
        if key == "EMA" and sharded:  # the average needs every parameter on every rank
            continue
        if key not in train:
            train[key] = copy.deepcopy(value)
            filled.append(f"Training.{key}")
    for key, value in MLIP_ARCHITECTURE.items():
        if key not in arch:
            arch[key] = value
            filled.append(f"Architecture.{key}")
    if "task_weights" not in arch:
        for key, value in MLIP_LOSS_WEIGHTS.items():
            if key not in arch and key not in train:
                arch[key] = value
                filled.append(f"Architecture.{key}")
    return arch, train, filled

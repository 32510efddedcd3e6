"""Training strategies: single process, DDP, FSDP (v1), FSDP2, DeepSpeed, post-local SGD.

:func:`make_strategy` turns the ``NeuralNetwork.Training`` section into a
:class:`~hydragnn.train.strategies.base.Strategy`; :func:`build_optimizer_factory` turns its
``Optimizer`` section into the factory that :meth:`Strategy.setup` calls. Distributed runs are
started with ``torchrun``, ``srun`` (SLURM), ``mpirun`` (Open MPI), ``jsrun`` (LSF) or a PMI
launcher (:mod:`.launch` reads their variables); a distributed strategy initialises the default
process group from that environment (:func:`init_distributed`) unless one already exists, and
destroys it in ``teardown()`` only if it created it; a one-process strategy under several ranks is refused.

Support matrix (``torchrun --nproc_per_node=2``, gloo, CPU; ``tests/test_strategies_dist.py``):

==========  ===========  ==========================  =========================================
strategy    MLIP forces  model_state_dict            optimizer_state_dict
==========  ===========  ==========================  =========================================
none        yes          full                        full (plain torch layout)
ddp         yes          full, every rank            full, every rank; with
                                                     ``use_zero_redundancy``: consolidated on
                                                     rank 0 (``None`` elsewhere)
localsgd    yes          every rank's own (equal     every rank's own (``rank_local``) or equal
                         right after a sync)         after a sync (``synchronized``)
fsdp        yes          full, every rank            full, every rank, keyed by parameter name
fsdp2       yes          full, every rank            full, every rank, keyed by parameter name
deepspeed   ZeRO 1/2     full, every rank (ZeRO-3    ``None`` (ZeRO-partitioned; use DeepSpeed's
            (ZeRO-3: a   gathers)                    ``save_checkpoint``)
            ConfigError)
==========  ===========  ==========================  =========================================

Every ``model_state_dict()`` loads strictly into a plain single-process ``HydraModel``.
"""

from __future__ import annotations

from typing import Any

from ..config_sections import STRATEGY_SPECS, LocalSGDConfig, ParallelismConfig, StrategySpec
from ..errors import ConfigError
from . import ddp, deepspeed_engine, fsdp, fsdp2, localsgd  # noqa: F401  (register the strategies)
from ._dist import DistributedStrategy, destroy_distributed, init_distributed
from .base import STRATEGIES, OptimizerFactory, Strategy, register_strategy
from .launch import LaunchEnv, detect_launch
from .optim import OPTIMIZERS, OptimizerBuilder, adopt_fast_step, build_optimizer_factory

__all__ = [
    "OPTIMIZERS",
    "STRATEGIES",
    "STRATEGY_SPECS",
    "StrategySpec",
    "OptimizerBuilder",
    "OptimizerFactory",
    "LaunchEnv",
    "Strategy",
    "adopt_fast_step",
    "build_optimizer_factory",
    "destroy_distributed",
    "detect_launch",
    "init_distributed",
    "make_strategy",
    "parse_parallelism",
    "register_strategy",
    "strategy_options",
]

_WHERE = "NeuralNetwork.Training"


def strategy_options(par: ParallelismConfig, lsgd: LocalSGDConfig) -> tuple[str, dict[str, Any]]:
    """``(registry name, options)`` of parsed sections: ``"localsgd"`` when ``lsgd.enabled``,
    else ``par.strategy``; the options are both sections' values (the strategies' keyword table)."""
    options = {
        "timeout_s": par.timeout_s,
        "find_unused_parameters": par.find_unused_parameters,
        "zero_stage": par.zero_stage,
        "warmup_steps": lsgd.warmup_steps,
        "synchronization_period": lsgd.synchronization_period,
        "optimizer_state_policy": lsgd.optimizer_state_policy,
    }
    return ("localsgd" if lsgd.enabled else par.strategy), options


def parse_parallelism(training: Any) -> tuple[str, dict[str, Any]]:
    """Validate ``Parallelism`` / ``LocalSGD`` (and ``Optimizer.use_zero_redundancy``).

    Args:
        training: a parsed :class:`~hydragnn.train.config.TrainingConfig`, or the raw JSON
            ``NeuralNetwork.Training`` section (parsed here by
            :func:`~hydragnn.train.config_training.parse_training`, as the pipeline parses it).

    Returns:
        See :func:`strategy_options`.

    Raises:
        ConfigError: naming the JSON path, the expected and the found value.
    """
    from ..config_training import parse_training

    cfg = parse_training(training, _WHERE)
    return strategy_options(cfg.parallelism, cfg.local_sgd)


def make_strategy(training: Any) -> Strategy:
    """Build the strategy of a ``NeuralNetwork.Training`` section.

    Args:
        training: the parsed :class:`~hydragnn.train.config.TrainingConfig` (what the pipeline
            passes), or a raw section as :func:`parse_parallelism` takes it.

    Returns:
        An unset-up :class:`Strategy` on the device of ``Training.device``
        (:meth:`Strategy.place`). A distributed one has already initialised the process
        group (from torchrun's environment, or a one-process group without it), so loaders
        built afterwards shard the data.

    Raises:
        ConfigError: an invalid section (see :func:`parse_parallelism`), or DeepSpeed asked
            for but not installed.
    """
    from ..config_training import parse_training

    cfg = parse_training(training, _WHERE)
    name, options = strategy_options(cfg.parallelism, cfg.local_sgd)
    launch = detect_launch()
    if launch is not None and launch.world_size > 1 and not issubclass(STRATEGIES[name], DistributedStrategy):
        raise ConfigError(
            f"{_WHERE}.Parallelism.strategy: {name!r} trains in one process, but {launch.launcher} started "
            f"{launch.world_size} ranks (this is rank {launch.rank}): each would train alone and write the same run "
            "folder; set Parallelism.strategy to 'ddp' (or 'fsdp', 'deepspeed', ...) or start one process"
        )
    strategy = STRATEGIES[name](options)
    try:
        strategy.place(cfg.device)
    except ConfigError:
        strategy.teardown()
        raise
    return strategy

"""Strategy configuration, optimizer factory and one-process runs of the distributed strategies.

The multi-process tests (torchrun, 2 ranks) are in ``test_strategies_dist.py``.
"""

from __future__ import annotations

import copy
import types

import pytest
import torch
import torch.distributed as dist

from hydragnn.train.errors import ConfigError
from hydragnn.train.strategies import (
    STRATEGIES,
    Strategy,
    adopt_fast_step,
    build_optimizer_factory,
    init_distributed,
    make_strategy,
    parse_parallelism,
)
from hydragnn.train.strategies.optim import OPTIMIZERS


@pytest.fixture(autouse=True)
def no_leaked_group():
    yield
    if dist.is_initialized():
        dist.destroy_process_group()
        pytest.fail("a test left the default process group initialised")


def test_registry_has_every_strategy():
    assert {"none", "ddp", "fsdp", "fsdp2", "deepspeed", "localsgd"} <= set(STRATEGIES)


def test_defaults_are_single_process():
    strategy = make_strategy({})
    assert type(strategy) is Strategy and strategy.name == "none"
    assert not dist.is_initialized()


def test_parse_the_raw_section_or_the_parsed_one():
    from hydragnn.train.config import parse_training

    section = {"Parallelism": {"strategy": "ddp", "timeout_s": 20}, "LocalSGD": {"enabled": True, "warmup_steps": 3}}
    assert parse_parallelism(section) == parse_parallelism(parse_training(section))
    with pytest.raises(ConfigError, match="NeuralNetwork.Training"):  # one shape: no attribute objects
        parse_parallelism(types.SimpleNamespace(**section))
    name, options = parse_parallelism(section)
    assert name == "localsgd"
    assert options["timeout_s"] == 20.0 and options["warmup_steps"] == 3 and options["synchronization_period"] == 4
    assert options["optimizer_state_policy"] == "rank_local"


@pytest.mark.parametrize(
    ("training", "where"),
    [
        ({"Parallelism": {"strategy": "horovod"}}, "Parallelism.strategy"),
        ({"Parallelism": {"strategy": "ddp", "timeout_s": 0}}, "Parallelism.timeout_s"),
        ({"Parallelism": {"strategy": "deepspeed", "zero_stage": 4}}, "Parallelism.zero_stage"),
        ({"Parallelism": {"strategy": "ddp", "zero_stage": 2}}, "Parallelism.zero_stage"),
        ({"Parallelism": {"strategy": "ddp", "bogus": 1}}, "Parallelism.bogus: unknown key; allowed"),
        ({"Parallelism": {"strategy": "ddp", "find_unused_parameters": "yes"}}, "find_unused_parameters"),
        ({"Parallelism": {"strategy": "fsdp"}, "LocalSGD": {"enabled": True}}, "LocalSGD.enabled"),
        (
            {"Parallelism": {"strategy": "ddp"}, "LocalSGD": {"enabled": True, "synchronization_period": 0}},
            "synchronization_period",
        ),
        ({"Parallelism": {"strategy": "ddp"}, "LocalSGD": {"warmup_steps": -1}}, "warmup_steps"),
        (
            {"Parallelism": {"strategy": "ddp"}, "LocalSGD": {"optimizer_state_policy": "global"}},
            "optimizer_state_policy",
        ),
        ({"Parallelism": {"strategy": "fsdp"}, "Optimizer": {"use_zero_redundancy": True}}, "use_zero_redundancy"),
        (
            {
                "Parallelism": {"strategy": "ddp"},
                "LocalSGD": {"enabled": True},
                "Optimizer": {"use_zero_redundancy": True},
            },
            "LocalSGD.enabled",
        ),
        ({"Parallelism": "ddp"}, "Parallelism: expected an object"),
    ],
)
def test_invalid_parallelism(training, where):
    with pytest.raises(ConfigError, match=where):
        make_strategy(training)
    assert not dist.is_initialized()


@pytest.mark.parametrize("kind", ["AdamW", "Adam", "SGD", "RMSprop", "Adagrad"])
def test_optimizer_factory(kind):
    cfg = {"type": kind, "learning_rate": 0.01, "weight_decay": 0.001}
    if kind in ("SGD", "RMSprop"):
        cfg["momentum"] = 0.5
    param = torch.nn.Parameter(torch.ones(3))
    opt = build_optimizer_factory(cfg)([param])
    assert type(opt).__name__ == kind
    assert opt.defaults["lr"] == 0.01 and opt.defaults["weight_decay"] == 0.001
    if kind in ("SGD", "RMSprop"):
        assert opt.defaults["momentum"] == 0.5
    # never torch's per-parameter loop: fused where the class has it, else foreach
    assert opt.defaults.get("fused") is (kind in ("AdamW", "Adam", "SGD")) or opt.defaults.get("foreach") is True


def _twins() -> tuple[torch.nn.Module, torch.nn.Module]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.SiLU(), torch.nn.Linear(8, 1)).double()
    return model, copy.deepcopy(model)


def _assert_same_trajectory(pairs) -> None:
    """Five steps of each ``(model, optimizer)`` on the same data end at the same parameters."""
    x = torch.randn(16, 4, dtype=torch.float64)
    for _ in range(5):
        for net, opt in pairs:
            opt.zero_grad()
            net(x).pow(2).mean().backward()
            opt.step()
    (model, _), (twin, _) = pairs
    for a, b in zip(model.parameters(), twin.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("kind", ["AdamW", "SGD"])
def test_fused_optimizer_step_matches_the_loop(kind):
    """The fused step applies the same update as torch's reference loop (to rounding)."""
    model, twin = _twins()
    cfg = {"type": kind, "learning_rate": 0.01, "weight_decay": 0.01}
    fused = build_optimizer_factory(cfg)(model.parameters())
    loop = OPTIMIZERS[kind](twin.parameters(), lr=0.01, weight_decay=0.01, foreach=False)
    assert fused.defaults.get("fused") is True
    _assert_same_trajectory([(model, fused), (twin, loop)])


@pytest.mark.parametrize(
    ("make", "expected"),
    [
        (lambda ps: torch.optim.AdamW(ps, lr=0.01, weight_decay=0.01), "fused"),
        (lambda ps: torch.optim.RMSprop(ps, lr=0.01), "foreach"),
        (lambda ps: torch.optim.AdamW(ps, lr=0.01, weight_decay=0.01, foreach=False), None),
        (lambda ps: torch.optim.AdamW(ps, lr=0.01, weight_decay=0.01, fused=False), None),
    ],
)
def test_a_user_optimizer_left_to_torch_defaults_gets_the_fast_step(make, expected):
    """``adopt_fast_step``: an optimizer whose step implementation was left to torch runs fused /
    foreach (same trajectory as torch's loop, to rounding); an explicit choice is kept."""
    model, twin = _twins()
    opt, ref = make(list(model.parameters())), make(list(twin.parameters()))
    for group in ref.param_groups:
        group["foreach"] = False  # torch's per-parameter loop, the reference
    assert adopt_fast_step(opt) == expected
    if expected is not None:
        assert all(g[expected] is True for g in opt.param_groups)
    _assert_same_trajectory([(model, opt), (twin, ref)])
    if expected == "fused":  # with state already there, fused is no longer chosen
        fresh = make(list(model.parameters()))
        fresh.load_state_dict(opt.state_dict() | {"param_groups": fresh.state_dict()["param_groups"]})
        assert adopt_fast_step(fresh) == "foreach"


@pytest.mark.parametrize(
    ("cfg", "where"),
    [
        ({"type": "Lion", "learning_rate": 0.1}, "Optimizer.type"),
        ({"type": "Adam"}, "learning_rate: required"),
        ({"type": "Adam", "learning_rate": 0}, "learning_rate"),
        ({"type": "Adam", "learning_rate": 0.1, "weight_decay": -1}, "weight_decay"),
        ({"type": "Adam", "learning_rate": 0.1, "momentum": 0.9}, "momentum"),
        ({"type": "Adam", "learning_rate": 0.1, "use_zero_redundancy": 1}, "use_zero_redundancy"),
        ({"type": "Adam", "learning_rate": 0.1, "lr": 0.1}, "unknown key"),
    ],
)
def test_invalid_optimizer(cfg, where):
    with pytest.raises(ConfigError, match=where):
        build_optimizer_factory(cfg)


def test_zero_redundancy_without_process_group_is_plain():
    opt = build_optimizer_factory({"type": "Adam", "learning_rate": 0.1, "use_zero_redundancy": True})
    assert type(opt([torch.nn.Parameter(torch.ones(2))])) is torch.optim.Adam


def _tiny_mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1))


@pytest.mark.parametrize(
    "training",
    [
        {"Parallelism": {"strategy": "ddp"}},
        {"Parallelism": {"strategy": "ddp"}, "LocalSGD": {"enabled": True, "synchronization_period": 2}},
        {"Parallelism": {"strategy": "fsdp"}},
        {"Parallelism": {"strategy": "fsdp2"}},
    ],
)
def test_one_process_group_is_created_and_destroyed(training):
    """Without torchrun a distributed strategy runs in a one-process group that it owns."""
    strategy = make_strategy(training)
    assert dist.is_initialized() and strategy.world_size == 1
    strategy.setup(_tiny_mlp(), build_optimizer_factory({"type": "SGD", "learning_rate": 0.1}))
    x = torch.randn(8, 3)
    for _ in range(2):
        loss = strategy.forward(x).pow(2).mean()
        strategy.backward(loss)
        strategy.step()
    state = strategy.model_state_dict()
    plain = _tiny_mlp()
    plain.load_state_dict(state)
    assert torch.allclose(strategy.all_reduce_mean(torch.tensor([2.0])), torch.tensor([2.0]))
    strategy.teardown()
    assert not dist.is_initialized()


def test_existing_group_is_not_destroyed():
    assert init_distributed(30) is True
    try:
        assert init_distributed(30) is False
        strategy = make_strategy({"Parallelism": {"strategy": "ddp"}})
        strategy.setup(_tiny_mlp(), build_optimizer_factory({"type": "Adam", "learning_rate": 0.1}))
        strategy.teardown()
        assert dist.is_initialized()
    finally:
        dist.destroy_process_group()


class _EnergyAndForces(torch.nn.Module):
    """A ``[1, 8]`` readout whose weight gradient sums the energy path and a ``create_graph`` force path."""

    def __init__(self) -> None:
        super().__init__()
        self.embed, self.readout = torch.nn.Linear(3, 8), torch.nn.Linear(8, 1)

    def forward(self, pos: torch.Tensor) -> torch.Tensor:
        pos = pos.requires_grad_(True)
        energy = self.readout(torch.tanh(self.embed(pos))).sum()
        (forces,) = torch.autograd.grad(-energy, pos, create_graph=True)
        return energy + forces.pow(2).sum()


@pytest.mark.parametrize("strategy_name", ["ddp", "localsgd"])
def test_ddp_gradients_have_their_parameters_strides(strategy_name):
    """DDP warned "Grad strides do not match bucket view strides" on every MLIP run: the readout
    weight's gradient came out with strides (1, 1) for a (8, 1)-strided parameter."""
    training = {"Parallelism": {"strategy": "ddp"}}
    if strategy_name == "localsgd":
        training["LocalSGD"] = {"enabled": True, "warmup_steps": 1}
    strategy = make_strategy(training)
    try:
        strategy.setup(_EnergyAndForces(), build_optimizer_factory({"type": "SGD", "learning_rate": 0.1}))
        strategy.backward(strategy.forward(torch.randn(5, 3, dtype=torch.float32)))
        assert strategy.name == strategy_name
        for name, param in strategy.unwrap().named_parameters():
            assert param.grad.stride() == param.stride(), name
        strategy.teardown()
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def test_init_distributed_rejects_bad_timeout():
    with pytest.raises(ConfigError, match="timeout_s"):
        init_distributed(-1)


def test_deepspeed_config_turns_clipping_off():
    pytest.importorskip("deepspeed")
    from deepspeed.runtime.constants import GRADIENT_CLIPPING_DEFAULT

    from hydragnn.train.strategies.deepspeed_engine import deepspeed_config

    assert GRADIENT_CLIPPING_DEFAULT != 0  # why the explicit 0 matters
    cfg = deepspeed_config(2)
    assert cfg["gradient_clipping"] == 0.0 and cfg["zero_optimization"] == {"stage": 2}


def test_deepspeed_zero3_refuses_mlip_forces():
    pytest.importorskip("deepspeed")
    from hydragnn.data import Schema
    from hydragnn.data.emt import CUAU_VARIABLES
    from hydragnn.models import build_model

    arch = {"mpnn_type": "SchNet", "hidden_dim": 8, "num_conv_layers": 1, "radius": 4.0, "num_radial": 4}
    model = build_model({**arch, "enable_interatomic_potential": True}, Schema.from_dict(CUAU_VARIABLES))
    strategy = make_strategy({"Parallelism": {"strategy": "deepspeed", "zero_stage": 3}})
    try:
        with pytest.raises(ConfigError, match="ZeRO-3 cannot train this interatomic potential"):
            strategy.setup(model, build_optimizer_factory({"type": "Adam", "learning_rate": 0.01}))
    finally:
        strategy.teardown()


def test_a_batch_already_on_the_device_is_not_walked_again():
    from torch_geometric.data import Batch, Data

    batch = Batch.from_data_list([Data(x=torch.ones(3, 1), edge_index=torch.tensor([[0, 1], [1, 2]]))] * 2)
    strategy = Strategy()
    strategy.device = torch.device("cpu")
    assert strategy.to_device(batch) is batch
    strategy.device = torch.device("meta")
    moved = strategy.to_device(batch)
    assert moved.x.device.type == "meta" and moved.edge_index.device.type == "meta"


@pytest.fixture
def registries():
    """The strategy registries, restored in place after the test."""
    from hydragnn.train.strategies import STRATEGIES, STRATEGY_SPECS

    saved = dict(STRATEGIES), dict(STRATEGY_SPECS)
    yield
    for live, old in zip((STRATEGIES, STRATEGY_SPECS), saved, strict=True):
        live.clear()
        live.update(old)


def test_a_strategy_added_with_one_decorator_is_selectable(registries):
    """``@register_strategy(spec=...)`` is all a new strategy needs: the config accepts its name,
    its options are checked against its spec, and make_strategy builds it."""
    from hydragnn.train.strategies import Strategy, StrategySpec, make_strategy, register_strategy

    with pytest.raises(ConfigError, match=r"Parallelism\.strategy: expected one of 'none', 'ddp'.*found 'mine'"):
        make_strategy({"Parallelism": {"strategy": "mine"}})

    @register_strategy(spec=StrategySpec("mine", options=("zero_stage",)))
    class Mine(Strategy):
        name = "mine"

    assert type(make_strategy({"Parallelism": {"strategy": "mine", "zero_stage": 2}})) is Mine
    with pytest.raises(ConfigError, match="find_unused_parameters: only used with strategy 'ddp', strategy is 'mine'"):
        make_strategy({"Parallelism": {"strategy": "mine", "find_unused_parameters": True}})
    with pytest.raises(ConfigError, match="LocalSGD needs .*Parallelism.strategy 'ddp', found 'mine'"):
        make_strategy({"Parallelism": {"strategy": "mine"}, "LocalSGD": {"enabled": True}})
    with pytest.raises(ValueError, match="has no spec"):

        @register_strategy
        class Unknown(Strategy):
            name = "unknown"

    with pytest.raises(ValueError, match="registered twice"):
        register_strategy(spec=StrategySpec("mine", options=("zero_stage",)))(Mine)
    with pytest.raises(ValueError, match="already declared"):
        register_strategy(spec=StrategySpec("mine"))(Mine)

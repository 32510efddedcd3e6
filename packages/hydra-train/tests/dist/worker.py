"""torchrun worker: ``worker.py SCENARIO DATA OUT`` (see tests/test_strategies_dist.py).

Scenarios: ``ddp``, ``fsdp``, ``fsdp2``, ``deepspeed``, ``localsgd``, ``global_attention``, ``die``.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import torch
from distcommon import (
    across_ranks_max_diff,
    collate,
    flat_params,
    load_data,
    new_model,
    rel_diff,
    run_main,
    state_vector,
)

from hydragnn.data import create_dataloaders
from hydragnn.data.loaders import set_epoch
from hydragnn.models import load_artifact, save_artifact
from hydragnn.train.errors import TrainingAborted
from hydragnn.train.strategies import build_optimizer_factory, make_strategy

SCENARIO, DATA, OUT = sys.argv[1], sys.argv[2], sys.argv[3]


def train_and_checkpoint(strategy, data, tag: str, optimizer=None, epochs: int = 2, mlip: bool = True) -> dict:
    """Train the tiny MLIP a few steps, write rank 0's checkpoint as an artifact, reload it in a
    plain model and compare its predictions with the distributed model's."""
    model = new_model(mlip=mlip)
    before = flat_params(model)
    strategy.setup(model, build_optimizer_factory(optimizer or {"type": "Adam", "learning_rate": 5e-3}))
    train_loader, _, _ = create_dataloaders(data, None, None, batch_size=4, seed=0)
    losses = []
    for epoch in range(epochs):
        set_epoch(train_loader, epoch)
        strategy.model.train()
        for batch in train_loader:
            batch = strategy.to_device(batch)
            out = strategy.forward(batch)
            assert "forces" in out and out["forces"].shape == batch.pos.shape
            loss, _ = strategy.unwrap().loss(out, batch)
            strategy.backward(loss)
            strategy.step()
            losses.append(float(strategy.all_reduce_mean(loss.detach())))
    state = strategy.model_state_dict()
    probe = collate(data[:3])
    strategy.model.eval()
    pred = strategy.forward(probe)
    pred = {k: v.detach() for k, v in pred.items()}
    plain = new_model(seed=123, mlip=mlip)
    plain.load_state_dict(state)  # strict: every key of the plain model, nothing else
    artifact = Path(OUT) / f"{tag}.hydra"
    if strategy.is_main:
        save_artifact(plain, artifact)
    strategy.barrier()
    reloaded = load_artifact(artifact)
    ref = reloaded(probe)
    opt_state = strategy.optimizer_state_dict()
    n_params = sum(1 for p in plain.parameters() if p.requires_grad)
    result = {
        "losses": losses,
        "finite": all(torch.isfinite(torch.tensor(losses)).tolist()),
        "param_change": rel_diff(flat_params(plain), before),
        "pred_energy_rel": rel_diff(ref["energy"], pred["energy"]),
        "pred_forces_rel": rel_diff(ref["forces"], pred["forces"]),
        "state_keys_equal": sorted(state) == sorted(plain.state_dict()),
        "ranks_state_diff": across_ranks_max_diff(state_vector(state)),
        "opt_state_entries": None if opt_state is None else len(opt_state["state"]),
        "n_params": n_params,
    }
    if opt_state is not None:
        strategy.load_optimizer_state_dict(opt_state)
        result["opt_state_reloaded"] = True
    return result


def equivalence(
    kind: str,
    opt: dict,
    steps: int,
    data,
    precision: str = "fp64",
    parallelism=None,
    mlip: bool = True,
    strategy=None,
    extra: dict | None = None,
    clip: float | None = None,
) -> dict:
    """Same global batch: world_size ranks x (B / world) graphs vs one process x B graphs.

    ``extra``: more ``Architecture`` keys for both models (e.g. global attention).
    ``clip``: ``Training.clip_grad_norm`` for the strategy; the reference clips its global
    gradient norm with ``torch.nn.utils.clip_grad_norm_`` (``clip_active``: it was above)."""
    dtype = torch.float64 if precision == "fp64" else torch.float32
    strategy = strategy or make_strategy({"Parallelism": parallelism or {"strategy": "ddp"}})
    ws, r = strategy.world_size, strategy.rank
    B = 4
    extra = extra or {}
    dist_model = new_model(precision, mlip=mlip, **extra)
    ref_model = new_model(precision, mlip=mlip, **extra)
    strategy.max_grad_norm = clip
    strategy.setup(dist_model, build_optimizer_factory(opt))
    ref_opt = build_optimizer_factory(opt).cls(ref_model.parameters(), **build_optimizer_factory(opt).kwargs)
    ref_model.train()
    losses, ref_losses, per_step, clip_active = [], [], [], []
    for k in range(steps):
        globl = data[k * B : (k + 1) * B]
        mine = globl[r * B // ws : (r + 1) * B // ws]
        batch = collate(mine, dtype)
        out = strategy.forward(batch)
        loss, _ = strategy.unwrap().loss(out, batch)
        strategy.backward(loss)
        strategy.step()
        losses.append(float(strategy.all_reduce_mean(loss.detach())))
        gb = collate(globl, dtype)
        rl, _ = ref_model.loss(ref_model(gb), gb)
        ref_opt.zero_grad()
        rl.backward()
        if clip is not None:
            clip_active.append(float(torch.nn.utils.clip_grad_norm_(ref_model.parameters(), clip)) > clip)
        ref_opt.step()
        ref_losses.append(float(rl))
        per_step.append(rel_diff(state_vector(strategy.model_state_dict()), state_vector(ref_model.state_dict())))
    result = {
        "kind": kind,
        "losses": losses,
        "ref_losses": ref_losses,
        "param_rel_diff_per_step": per_step,
        "clip_active": all(clip_active) if clip is not None else None,
        "changed": rel_diff(
            state_vector(strategy.model_state_dict()),
            state_vector(new_model(precision, mlip=mlip, **extra).state_dict()),
        ),
    }
    strategy.teardown()
    return result


def scenario_ddp(data) -> dict:
    owner = make_strategy({"Parallelism": {"strategy": "ddp", "timeout_s": 60}})
    res = {"train": train_and_checkpoint(owner, data, "ddp")}
    res["equiv_sgd"] = equivalence("SGD", {"type": "SGD", "learning_rate": 1e-3, "momentum": 0.9}, 3, data)
    res["equiv_adam"] = equivalence("Adam", {"type": "Adam", "learning_rate": 1e-3}, 3, data)
    res["equiv_adam_committee"] = equivalence("Adam", {"type": "Adam", "learning_rate": 1e-3}, 3, data, extra={"committee": 2})
    sgd = {"type": "SGD", "learning_rate": 1e-3, "momentum": 0.9}
    res["equiv_sgd_clipped"] = equivalence("SGD", sgd, 3, data, clip=0.05)
    zero = make_strategy(
        {
            "Parallelism": {"strategy": "ddp"},
            "Optimizer": {"type": "AdamW", "learning_rate": 5e-3, "use_zero_redundancy": True},
        }
    )
    res["zero"] = train_and_checkpoint(
        zero, data, "ddp_zero", {"type": "AdamW", "learning_rate": 5e-3, "use_zero_redundancy": True}
    )
    res["zero"]["optimizer_class"] = type(zero.optimizer).__name__
    zero.teardown()
    owner.teardown()
    return res


GLOBAL_ATTENTION_VARIANTS: dict[str, dict] = {
    "gps_performer_schnet": {
        "global_attn_engine": "GPS",
        "global_attn_type": "performer",
        "global_attn_heads": 2,
        "global_attn_features": 8,
        "conv_checkpointing": True,
    },
    "gps_multihead_painn": {"mpnn_type": "PAINN", "global_attn_engine": "GPS", "global_attn_heads": 2},
    "et_after_schnet": {
        "global_attn_engine": "EquivariantTransformer",
        "global_attn_heads": 2,
        "conv_checkpointing": True,
    },
}


def scenario_global_attention(data) -> dict:
    """DDP trains GPS / equivariant-transformer MLIPs (with activation checkpointing) exactly like
    one process on the same global batch; performer projections redrawn from (seed, count) are
    the same on every rank."""
    from hydragnn.models import redraw_projections

    res = {}
    for name, extra in GLOBAL_ATTENTION_VARIANTS.items():
        res[name] = equivalence("Adam", {"type": "Adam", "learning_rate": 1e-3}, 3, data, extra=extra)
    strategy = make_strategy({"Parallelism": {"strategy": "ddp", "timeout_s": 60}})
    model = new_model("fp64", **GLOBAL_ATTENTION_VARIANTS["gps_performer_schnet"])
    strategy.setup(model, build_optimizer_factory({"type": "Adam", "learning_rate": 1e-3}))
    before = state_vector(strategy.model_state_dict())
    redrawn = redraw_projections(strategy.unwrap(), 0, 1)
    after = state_vector(strategy.model_state_dict())
    res["redraw"] = {
        "redrawn": redrawn,
        "changed": rel_diff(after, before),
        "ranks_state_diff": across_ranks_max_diff(after),
    }
    strategy.teardown()
    return res


def scenario_sharded(name: str):
    def body(data) -> dict:
        strategy = make_strategy({"Parallelism": {"strategy": name, "timeout_s": 60}})
        res = {"train": train_and_checkpoint(strategy, data, name)}
        res["equiv_adam"] = equivalence(
            "Adam", {"type": "Adam", "learning_rate": 1e-3}, 3, data, "fp32", {"strategy": name}
        )
        sgd = {"type": "SGD", "learning_rate": 1e-3, "momentum": 0.9}
        res["equiv_sgd_clipped"] = equivalence("SGD", sgd, 3, data, "fp32", {"strategy": name}, clip=0.05)
        res["equiv_adam_committee"] = equivalence(
            "Adam", {"type": "Adam", "learning_rate": 1e-3}, 3, data, "fp32", {"strategy": name}, extra={"committee": 2}
        )
        strategy.teardown()
        return res

    return body


def scenario_deepspeed(data) -> dict:
    """ZeRO 1 and 2 with the MLIP; ZeRO 3 refuses the MLIP at setup and trains the plain-head model."""
    from hydragnn.train.errors import ConfigError
    from hydragnn.train.strategies.deepspeed_engine import DeepSpeedStrategy

    res = {}
    adam = {"type": "Adam", "learning_rate": 1e-3}
    sgd = {"type": "SGD", "learning_rate": 1e-3, "momentum": 0.9}
    for stage in (1, 2, 3):
        mlip = stage < 3
        par = {"strategy": "deepspeed", "zero_stage": stage, "timeout_s": 60}
        strategy = make_strategy({"Parallelism": par})
        res[f"train_z{stage}"] = train_and_checkpoint(strategy, data, f"deepspeed_z{stage}", mlip=mlip)
        for opt in (adam, sgd):
            res[f"equiv_{opt['type']}_z{stage}"] = equivalence(opt["type"], opt, 3, data, "fp32", par, mlip=mlip)
        strategy.teardown()
    try:
        make_strategy({"Parallelism": {"strategy": "deepspeed", "zero_stage": 3}}).setup(
            new_model(), build_optimizer_factory(adam)
        )
        res["z3_mlip_error"] = None
    except ConfigError as exc:
        res["z3_mlip_error"] = str(exc)
    # DeepSpeed's own default gradient_clipping (1.0) is what made it differ from torch from step 2
    default_clip = DeepSpeedStrategy({"zero_stage": 1, "deepspeed_config": {"gradient_clipping": 1.0}})
    res["equiv_Adam_z1_default_clipping"] = equivalence("Adam", adam, 3, data, "fp32", strategy=default_clip)
    # Training.clip_grad_norm reaches the engine's config: the same trajectory as torch's clipping
    clipped = DeepSpeedStrategy({"zero_stage": 1})
    res["equiv_SGD_z1_clipped"] = equivalence("SGD", sgd, 3, data, "fp32", strategy=clipped, clip=0.05)
    return res


def scenario_localsgd(data) -> dict:
    res = {}
    for policy in ("rank_local", "synchronized"):
        strategy = make_strategy(
            {
                "Parallelism": {"strategy": "ddp", "timeout_s": 60},
                "LocalSGD": {
                    "enabled": True,
                    "warmup_steps": 2,
                    "synchronization_period": 3,
                    "optimizer_state_policy": policy,
                },
            }
        )
        model = new_model()
        strategy.setup(model, build_optimizer_factory({"type": "Adam", "learning_rate": 5e-3}))
        r = strategy.rank
        steps = []
        for k in range(8):
            batch = collate(data[(2 * k + r) % len(data) : (2 * k + r) % len(data) + 1])
            loss, _ = strategy.unwrap().loss(strategy.forward(batch), batch)
            strategy.backward(loss)
            strategy.step()
            opt_vec = torch.cat(
                [
                    v.reshape(-1).double()
                    for s in strategy.optimizer.state.values()
                    for key, v in sorted(s.items())
                    if key != "step"
                ]
            )
            steps.append(
                {
                    "step": strategy.steps,
                    "synchronized": strategy.last_synchronized,
                    "param_diff": across_ranks_max_diff(flat_params(model)),
                    "opt_diff": across_ranks_max_diff(opt_vec),
                    "loss": float(loss.detach()),
                }
            )
        # one more (local) step: the replicas diverge; taking the state must average them first
        batch = collate(data[r : r + 1])
        loss, _ = strategy.unwrap().loss(strategy.forward(batch), batch)
        strategy.backward(loss)
        strategy.step()
        diverged = across_ranks_max_diff(flat_params(model))
        state = strategy.model_state_dict()
        plain = new_model(seed=1)
        plain.load_state_dict(state)
        steps.append(
            {
                "step": strategy.steps,
                "diverged_before_state": diverged,
                "param_diff_after_state": across_ranks_max_diff(flat_params(model)),
                "synchronized": False,
                "param_diff": diverged,
                "opt_diff": 0.0,
            }
        )
        res[policy] = steps
        strategy.teardown()
    return res


def _train_until_aborted(strategy, data, misbehave) -> dict:
    """Train the tiny MLIP step by step; rank 1 calls ``misbehave()`` at step 2 (dies or hangs).
    The surviving rank must end with :class:`TrainingAborted` (re-raised after a log line)."""
    model = new_model()
    strategy.setup(model, build_optimizer_factory({"type": "SGD", "learning_rate": 1e-3}))
    start = time.monotonic()
    for k in range(50):
        if k == 2 and strategy.rank == 1:
            misbehave()
        batch = collate(data[k % len(data) : k % len(data) + 1])
        try:
            loss, _ = strategy.unwrap().loss(strategy.forward(batch), batch)
            strategy.backward(loss)
            strategy.step()
        except TrainingAborted as exc:
            print(f"[rank {strategy.rank}] TrainingAborted after {time.monotonic() - start:.1f}s: {exc}", flush=True)
            raise
    return {"unexpected": "finished"}


def scenario_die(data) -> dict:
    def die() -> None:
        print("[rank 1] dying on purpose", flush=True)
        os._exit(1)

    return _train_until_aborted(make_strategy({"Parallelism": {"strategy": "ddp", "timeout_s": 20}}), data, die)


def scenario_hang(data) -> dict:
    """Rank 1 stops answering (sleeps) at step 3; rank 0 must give up after timeout_s = 10."""

    def hang() -> None:
        print("[rank 1] hanging on purpose", flush=True)
        time.sleep(float(os.environ.get("HYDRA_TEST_SLEEP_S", "120")))
        os._exit(1)

    return _train_until_aborted(make_strategy({"Parallelism": {"strategy": "ddp", "timeout_s": 10}}), data, hang)


SCENARIOS = {
    "hang": scenario_hang,
    "ddp": scenario_ddp,
    "fsdp": scenario_sharded("fsdp"),
    "fsdp2": scenario_sharded("fsdp2"),
    "deepspeed": scenario_deepspeed,
    "localsgd": scenario_localsgd,
    "global_attention": scenario_global_attention,
    "die": scenario_die,
}

if __name__ == "__main__":
    import faulthandler

    torch.set_num_threads(1)
    # a hang dumps every thread's stack and exits instead of waiting for the test's timeout
    faulthandler.dump_traceback_later(float(os.environ.get("HYDRA_TEST_HANG_S", "150")), exit=True)
    samples = load_data(DATA)
    run_main(SCENARIO, OUT, lambda: SCENARIOS[SCENARIO](samples))

"""The whole pipeline behind ``hydragnn-train``: config -> data -> model -> training -> run folder.

Run folder contents: ``config.json`` (the completed config), ``checkpoint.pt`` (latest training
state), ``model.hydra`` (the artifact of the best epoch), ``metrics.json`` (history, best epoch,
test errors per head in physical units), ``parity_<head>.png``, ``tensorboard/`` and
``test_set.pkl`` (the test split, so ``hydragnn-predict`` can reproduce the test errors).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from hydragnn.data import (
    Schema,
    add_edges,
    add_positional_encodings,
    create_dataloaders,
    open_dataset,
    prepare,
    write_dataset,
)
from hydragnn.models import ModelConfig, build_model, save_artifact

from .config import RunConfig, load_config
from .evaluate import mae_report
from .loop import train_validate_test
from .plots import parity_plots
from .progress import Progress
from .strategies import build_optimizer_factory, make_strategy

__all__ = [
    "build_scheduler",
    "cuau_samples",
    "degree_histogram",
    "fill_degree_histogram",
    "load_samples",
    "prepare_samples",
    "run_training",
    "split_indices",
]


# ----------------------------------------------------------------------------- data
def cuau_samples(n_structures: int, seed: int) -> list:
    """The EMT ``CuAu_32atoms`` reference set, with derived graph targets added:
    ``au_fraction [1, 1]`` (fraction of Au atoms), ``volume_per_atom [1, 1]`` (Å³) and
    ``pressure [1, 1]`` (``-trace(stress) / 3`` in eV/Å³)."""
    from hydragnn.data.reference import generate_cuau

    samples = generate_cuau(n_structures=n_structures, seed=seed)
    for s in samples:
        n = int(s.atomic_number.shape[0])
        s.au_fraction = (s.atomic_number == 79).sum().reshape(1, 1).to(s.pos.dtype) / n
        s.volume_per_atom = torch.linalg.det(s.cell.reshape(3, 3).double()).abs().reshape(1, 1).to(s.pos.dtype) / n
        s.pressure = -s.stress.reshape(-1)[:3].mean().reshape(1, 1)
    return samples


def _has_pe(data, pe_dim: int) -> bool:
    lap, rw = getattr(data, "lap_pe", None), getattr(data, "rw_pe", None)
    n = data.num_nodes
    return all(t is not None and tuple(t.shape) == (n, pe_dim) for t in (lap, rw))


def prepare_samples(raw: Sequence, schema: Schema, cutoff: float, pe_dim: int = 0) -> list:
    """Prepare against ``schema`` and build edges at ``cutoff`` where a sample has none.

    With ``pe_dim > 0`` (``Architecture.pe_dim``, GPS) every sample also gets the positional
    encodings ``lap_pe`` / ``rw_pe [N, pe_dim]`` of its edges
    (:func:`hydragnn.data.add_positional_encodings`), unless it already carries them with that
    width (a stored prepared dataset: nothing is recomputed).
    """
    out = []
    for i, sample in enumerate(raw):
        data = prepare(sample, schema, index=i)
        if getattr(data, "edge_index", None) is None:
            data = add_edges(data, cutoff)
        if pe_dim > 0 and not _has_pe(data, pe_dim):
            data = add_positional_encodings(data, pe_dim)
        out.append(data)
    return out


def load_samples(cfg: RunConfig) -> list:
    """The dataset of ``cfg.dataset`` (container or generator), prepared, with edges."""
    ds = cfg.dataset
    if ds.generator is not None:
        raw = cuau_samples(ds.generator.n_structures, ds.generator.seed)
    else:
        container = open_dataset(ds.path)
        raw = [container[i] for i in range(len(container))]
    return prepare_samples(raw, cfg.schema, float(ds.cutoff), cfg.model_config.pe_dim)


def degree_histogram(samples: Sequence) -> list[int]:
    """In-degree histogram of prepared samples: ``hist[k]`` = number of nodes with ``k`` incoming edges."""
    hist = torch.zeros(1, dtype=torch.long)
    for i, data in enumerate(samples):
        edge_index = getattr(data, "edge_index", None)
        if edge_index is None:
            raise ValueError(f"degree_histogram: sample {i} has no edge_index (prepare it with edges first)")
        deg = torch.bincount(edge_index[1], minlength=int(data.num_nodes))
        counts = torch.bincount(deg)
        if counts.numel() > hist.numel():
            hist = torch.cat([hist, hist.new_zeros(counts.numel() - hist.numel())])
        hist[: counts.numel()] += counts
    return hist.tolist()


def fill_degree_histogram(model_config: ModelConfig, trainset: Sequence) -> ModelConfig:
    """The model config with ``pna_deg`` set from the training set, for encoders that take one.

    The PNA family (``PNA``, ``PNAPlus``) normalises its degree scalers by the in-degree
    histogram of the training data. When the Architecture section leaves ``pna_deg`` unset, it
    is computed here from the training split (the same on every rank: every rank prepares the
    whole dataset) and written into the section, so the artifact rebuilds the same model.
    Other encoders, and a ``pna_deg`` given in the config, are left alone.
    """
    encoder = model_config.encoder
    if encoder is None or not dataclasses.is_dataclass(encoder):
        return model_config
    if "pna_deg" not in {f.name for f in dataclasses.fields(encoder)} or encoder.pna_deg is not None:
        return model_config
    return ModelConfig.from_dict({**model_config.raw, "pna_deg": degree_histogram(trainset)})


def split_indices(n: int, fractions: Sequence[float], seed: int) -> tuple[list[int], list[int], list[int]]:
    """A deterministic shuffled split of ``range(n)`` into train / val / test by fractions."""
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed)).tolist()
    n_val = int(round(fractions[1] * n))
    n_test = int(round(fractions[2] * n))
    if fractions[1] > 0:
        n_val = max(n_val, 1)
    if fractions[2] > 0:
        n_test = max(n_test, 1)
    n_train = n - n_val - n_test
    if n_train < 1:
        raise ValueError(f"Dataset.split: {n} samples leave no training sample for fractions {list(fractions)}")
    return perm[:n_train], perm[n_train : n_train + n_val], perm[n_train + n_val :]


# ----------------------------------------------------------------------------- training pieces
def build_scheduler(cfg: RunConfig, optimizer: torch.optim.Optimizer):
    """The LR scheduler of ``Training.Scheduler`` (or ``None``)."""
    sched = cfg.training.scheduler
    opts = dict(sched.options)
    if sched.type == "ReduceLROnPlateau":
        return torch.optim.lr_scheduler.ReduceLROnPlateau(
            optimizer,
            mode="min",
            factor=opts["factor"],
            patience=opts["patience"],
            min_lr=opts["min_lr"],
            threshold=opts["threshold"],
        )
    if sched.type == "CosineAnnealingLR":
        return torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=opts["T_max"], eta_min=opts["eta_min"])
    return None


def _writer(run_dir: Path, is_main: bool, progress: Progress):
    if not is_main:
        return None
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:  # tensorboard not installed
        progress.log(1, "tensorboard is not installed: no TensorBoard logs (pip install tensorboard)")
        return None
    return SummaryWriter(log_dir=str(run_dir / "tensorboard"))


def _jsonable(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


def format_errors(mae: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """``  energy     MAE 0.0041 eV/atom`` lines."""
    return [f"  {name:16s} MAE {r['mae']:.5g} {r['unit']}".rstrip() for name, r in mae.items()]


def run_training(
    config: str | os.PathLike | Mapping[str, Any] | RunConfig,
    run_dir: str | os.PathLike | None = None,
    *,
    resume: bool = False,
    verbosity: int | None = None,
) -> dict[str, Any]:
    """Run the whole pipeline of a config and fill the run folder.

    Args:
        config: the JSON config (path or dict) or a :class:`RunConfig`.
        run_dir: the run folder (default ``runs/<Dataset.name>``).
        resume: continue from ``<run_dir>/checkpoint.pt``.
        verbosity: override of ``Verbosity.level``.

    Returns:
        The metrics dict also written to ``metrics.json``, with ``paths`` (artifact, config,
        metrics, plots, tensorboard).
    """
    t_start = time.perf_counter()
    cfg = load_config(config)
    level = cfg.verbosity if verbosity is None else verbosity
    run_dir = Path(run_dir) if run_dir is not None else Path("runs") / cfg.dataset.name
    training_dict = cfg.training.to_dict()
    strategy = make_strategy(training_dict)  # may initialise the process group (before the loaders)
    progress = Progress(level, strategy.is_main)
    try:
        if strategy.is_main:
            run_dir.mkdir(parents=True, exist_ok=True)
            cfg.save(run_dir / "config.json")
        t0 = time.perf_counter()
        samples = load_samples(cfg)
        train_idx, val_idx, test_idx = split_indices(len(samples), cfg.dataset.split, cfg.dataset.seed)
        trainset = [samples[i] for i in train_idx]
        valset = [samples[i] for i in val_idx] or None
        testset = [samples[i] for i in test_idx] or None
        progress.log(
            1,
            f"dataset {cfg.dataset.name}: {len(samples)} samples ({len(trainset)} train, {len(val_idx)} val, "
            f"{len(test_idx)} test) prepared in {time.perf_counter() - t0:.1f} s",
        )
        tr = cfg.training
        train_loader, val_loader, test_loader = create_dataloaders(
            trainset, valset, testset, tr.batch_size, batching=tr.batching, seed=tr.seed
        )
        model_config = fill_degree_histogram(cfg.model_config, trainset)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(tr.seed)
            model = build_model(model_config, cfg.schema)
        n_params = sum(p.numel() for p in model.parameters())
        progress.log(
            1, f"model {cfg.model_config.mpnn_type}: {n_params} parameters, precision {cfg.model_config.precision}"
        )
        strategy.setup(model, build_optimizer_factory(training_dict["Optimizer"]))
        scheduler = build_scheduler(cfg, strategy.optimizer)
        writer = _writer(run_dir, strategy.is_main, progress)
        try:
            summary = train_validate_test(
                model,
                strategy.optimizer,
                train_loader,
                val_loader,
                test_loader,
                writer,
                scheduler,
                tr,
                cfg.dataset.name,
                level,
                strategy=strategy,
                run_dir=run_dir,
                resume=resume,
            )
        finally:
            if writer is not None:
                writer.close()
        trues = summary.pop("test_targets", None)
        preds = summary.pop("test_predictions", None)
        natoms = summary.pop("test_natoms", None)
        metrics: dict[str, Any] = {
            "dataset": cfg.dataset.name,
            "best_epoch": summary["best_epoch"],
            "best_val_loss": summary["best_val_loss"],
            "epochs_run": summary["epochs_run"],
            "stopped_early": summary["stopped_early"],
            "skipped_batches": summary["skipped_batches"],
            "test": summary["test"],
            "history": summary["history"],
            "num_parameters": n_params,
            "world_size": strategy.world_size,
        }
        paths: dict[str, Any] = {}
        if strategy.is_main:
            plain = strategy.unwrap()
            paths["artifact"] = str(
                save_artifact(
                    plain,
                    run_dir / "model.hydra",
                    species=_species(samples),
                    extra={
                        "best_epoch": summary["best_epoch"],
                        "best_val_loss": _jsonable(summary["best_val_loss"]),
                        "dataset": cfg.dataset.name,
                        "config": cfg.to_dict(),
                    },
                )
            )
            paths["config"] = str(run_dir / "config.json")
            paths["tensorboard"] = str(run_dir / "tensorboard") if writer is not None else None
            if testset is not None:
                paths["test_set"] = str(write_dataset(run_dir / "test_set.pkl", testset, "pickle", schema=cfg.schema))
            if trues:
                paths["plots"] = [
                    str(p) for p in parity_plots(trues, preds, run_dir, natoms=natoms, mae=summary["test"]["mae"])
                ]
            metrics["wall_s"] = time.perf_counter() - t_start
            metrics["paths"] = paths
            (run_dir / "metrics.json").write_text(json.dumps(_jsonable(metrics), indent=2) + "\n")
            paths["metrics"] = str(run_dir / "metrics.json")
            if summary["test"] is not None:
                progress.log(1, "test errors per head:")
                for line in format_errors(summary["test"]["mae"]):
                    progress.log(1, line)
            progress.log(1, f"best epoch {summary['best_epoch']}; artifact {paths['artifact']}")
        strategy.barrier()
        metrics["paths"] = paths
        return metrics
    finally:
        strategy.teardown()


def _species(samples: Sequence) -> list[int] | None:
    z = getattr(samples[0], "atomic_number", None) if samples else None
    if z is None:
        return None
    return sorted({int(v) for s in samples for v in s.atomic_number.reshape(-1).tolist()})


def predict(
    artifact: str | os.PathLike, dataset: str | os.PathLike, *, batch_size: int = 16
) -> tuple[dict[str, Any], dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """Evaluate a saved model on a dataset container.

    Returns:
        ``({"loss", "heads", "mae"}, targets, predictions)``.
    """
    from hydragnn.models import load_artifact

    from .evaluate import _as_strategy, evaluate_losses

    model = load_artifact(artifact)
    container = open_dataset(dataset)
    samples = prepare_samples(
        [container[i] for i in range(len(container))], model.schema, model.cutoff, model.config.pe_dim
    )
    _, _, loader = create_dataloaders(None, None, samples, batch_size)
    loss, heads, trues, preds, extras = evaluate_losses(_as_strategy(model), loader, collect=True)
    return {"loss": loss, "heads": heads, "mae": mae_report(trues, preds, extras.get("natoms"))}, trues, preds

"""Checkpoints: ``save_model`` / ``load_existing_model`` and the training-state checkpoint.

Files are written atomically (temporary file beside the target, ``fsync``, ``os.replace``) and
hold only tensors and plain containers, so they load with ``torch.load(weights_only=True)``.
"""

from __future__ import annotations

import os
import random
from collections.abc import Mapping
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch
from torch import nn

from hydragnn.data.io.atomic import atomic_write
from hydragnn.data.io.safe_load import load_tensors

from .errors import CheckpointError

__all__ = [
    "atomic_save",
    "get_rng_state",
    "load_checkpoint",
    "load_existing_model",
    "load_state_strict",
    "save_model",
    "set_rng_state",
]


def _plain_module(model: nn.Module) -> nn.Module:
    """The plain model inside a DDP / strategy wrapper."""
    unwrap = getattr(model, "unwrap", None)
    if callable(unwrap):
        return cast(nn.Module, unwrap())  # a strategy's unwrap(): the plain model
    return getattr(model, "module", model)


def atomic_save(obj: Any, path: str | os.PathLike) -> Path:
    """``torch.save(obj)`` to a temporary file beside ``path``, then ``os.replace``.

    A failure at any point leaves ``path`` as it was (absent or the previous file) and no
    temporary file behind (see :func:`hydragnn.data.io.atomic.atomic_write`: permissions follow the
    umask, temporaries of killed writers are removed by the next write).

    Raises:
        CheckpointError: the file cannot be written.
    """
    try:
        return atomic_write(path, lambda fh: torch.save(obj, fh))
    except Exception as exc:
        raise CheckpointError(f"{path}: cannot write the checkpoint: {exc}") from exc


def load_checkpoint(path: str | os.PathLike) -> dict[str, Any]:
    """``torch.load(path, weights_only=True)`` with errors as :class:`CheckpointError`."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: no such checkpoint")
    try:
        return load_tensors(path.read_bytes())
    except OSError as exc:
        raise CheckpointError(f"{path}: cannot read the checkpoint: {exc}") from None
    except ValueError as exc:
        raise CheckpointError(f"{path}: corrupted or unsafe checkpoint: {exc}") from None


def load_state_strict(model: nn.Module, state: Mapping[str, torch.Tensor], where: str) -> None:
    """``load_state_dict`` that names missing / unexpected / mis-shaped keys in a CheckpointError."""
    own = model.state_dict()
    missing = sorted(set(own) - set(state))
    unexpected = sorted(set(state) - set(own))
    shapes = sorted(
        f"{k}: checkpoint {tuple(state[k].shape)} != model {tuple(own[k].shape)}"
        for k in set(own) & set(state)
        if tuple(state[k].shape) != tuple(own[k].shape)
    )
    if missing or unexpected or shapes:
        parts = []
        if missing:
            parts.append(f"missing keys {missing}")
        if unexpected:
            parts.append(f"unexpected keys {unexpected}")
        if shapes:
            parts.append(f"shape mismatches {shapes}")
        hint = ""
        if missing and all(".input_norm." in k for k in missing):
            hint = (
                ". The checkpoint's graph heads have no input standardisation (written before hydra-models 0.3): "
                'set NeuralNetwork.Architecture.output_heads.graph.input_norm to "none" to continue it'
            )
        raise CheckpointError(
            f"{where}: checkpoint does not match the model (other architecture?): " + "; ".join(parts) + hint
        )
    model.load_state_dict(state, strict=True)


def save_model(model: nn.Module, optimizer: torch.optim.Optimizer | None, name: str, path: str = "./logs/") -> Path:
    """Write ``<path>/<name>/<name>.pt`` atomically: model state (+ optimizer state).

    Args:
        model: the model (a DDP-wrapped model or a strategy is unwrapped).
        optimizer: its optimizer, or ``None``.
        name: the run name (folder and file stem).
        path: the logs folder.

    Returns:
        The file written.
    """
    module = _plain_module(model)
    state: dict[str, Any] = {
        "model_state_dict": {k: v.detach().cpu().clone() for k, v in module.state_dict().items()},
    }
    if optimizer is not None:
        state["optimizer_state_dict"] = optimizer.state_dict()
    return atomic_save(state, Path(path) / name / f"{name}.pt")


def load_existing_model(
    model: nn.Module, name: str, path: str = "./logs/", optimizer: torch.optim.Optimizer | None = None
) -> nn.Module:
    """Load ``<path>/<name>/<name>.pt`` into ``model`` (and ``optimizer`` when given).

    Raises:
        CheckpointError: missing or corrupted file, a model of another architecture (naming the
            missing / unexpected keys), or an optimizer asked for but not stored.
    """
    file = Path(path) / name / f"{name}.pt"
    ckpt = load_checkpoint(file)
    if not isinstance(ckpt, dict) or "model_state_dict" not in ckpt:
        raise CheckpointError(f"{file}: not a save_model checkpoint (no 'model_state_dict')")
    module = _plain_module(model)
    load_state_strict(module, ckpt["model_state_dict"], str(file))
    if optimizer is not None:
        if "optimizer_state_dict" not in ckpt:
            raise CheckpointError(f"{file}: holds no optimizer state")
        try:
            optimizer.load_state_dict(ckpt["optimizer_state_dict"])
        except (ValueError, KeyError) as exc:
            raise CheckpointError(f"{file}: optimizer state does not fit the optimizer: {exc}") from exc
    return model


# ----------------------------------------------------------------------------- RNG state
def get_rng_state() -> dict[str, Any]:
    """torch, Python ``random`` and numpy global RNG states as tensors / plain containers."""
    py = random.getstate()
    name, keys, pos, has_gauss, gauss = np.random.get_state()
    return {
        "torch": torch.get_rng_state(),
        "python": [py[0], list(py[1]), py[2]],
        "numpy": {
            "name": str(name),
            "keys": torch.from_numpy(np.asarray(keys, dtype=np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "gauss": float(gauss),
        },
    }


def set_rng_state(state: Mapping[str, Any]) -> None:
    """Restore what :func:`get_rng_state` returned."""
    torch.set_rng_state(state["torch"])
    version, internal, gauss_next = state["python"]
    random.setstate((version, tuple(internal), gauss_next))
    n = state["numpy"]
    np.random.set_state((n["name"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["gauss"]))

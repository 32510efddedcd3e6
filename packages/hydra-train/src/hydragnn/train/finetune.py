"""Fine-tuning: a run that starts from a trained model artifact (``Training.init_from`` /
``--init-from``).

* ``Architecture`` may be left out: the artifact's (with its reference energies) is used. A
  given one must build the same trunk (encoder, global attention, conditioning): every trunk
  tensor is copied and a shape that differs is an error naming the tensor.
* ``FineTune.heads``: ``"keep"`` [default] copies every head tensor whose name and shape match
  (outputs of the same name keep their head; new outputs start fresh), ``"replace"`` starts
  every head fresh. Reference energies always come from the run's config.
* ``FineTune.freeze_encoder`` [false]: the trunk does not train (``requires_grad`` off); only
  the heads do.
* ``FineTune.new_species``: ``"refuse"`` [default] stops when the training data holds species
  the artifact was not trained on, naming them; ``"add"`` trains them from the untrained rows of
  the species embedding (it must be wide enough).
* The inputs of the schema must equal the artifact's (the features the trunk was trained on).
* Several energy heads (``Dataset.sources``) from a one-head artifact: every head starts as the
  artifact's energy readout, so "your data" and "replayed data" both begin from the trained model.
* A committee (``Architecture.committee``) is fine-tuned member by member: member k starts from
  the artifact's member k, so the run's committee must have the artifact's size (left out, it is).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from ase.data import chemical_symbols

from hydragnn.data.config_parse import parse_dataclass

from .errors import ConfigError

if TYPE_CHECKING:  # FineTuneConfig is parsed with the config, before torch is imported
    from torch import nn

__all__ = ["FineTuneConfig", "TRUNK", "initialise_from", "load_base"]

WHERE = "NeuralNetwork.Training.init_from"
TRUNK = ("encoder.", "global_stage.", "conditioning.")
"""State-dict prefixes of the shared trunk; everything else is a head."""
_SKIPPED = ("energy_head.reference",)  # reference energies come from the run's config
READOUT = "energy_head.atom.net"
"""The energy readout's last layer(s): one output row per energy head."""


@dataclass(frozen=True)
class FineTuneConfig:
    """``Training.FineTune``: heads ["keep" | "replace"], freeze_encoder [false],
    new_species ["refuse" | "add"] (see the module docstring)."""

    heads: Literal["keep", "replace"] = "keep"
    freeze_encoder: bool = False
    new_species: Literal["refuse", "add"] = "refuse"

    @classmethod
    def from_dict(cls, values: Any, where: str) -> FineTuneConfig:
        return parse_dataclass(cls, values, where, ConfigError)


_MEMBER = re.compile(r"members\.\d+\.")


def _local(key: str) -> str:
    """A state-dict key without a committee member's prefix (``members.2.encoder.x`` -> ``encoder.x``)."""
    match = _MEMBER.match(key)
    return key[match.end() :] if match else key


def _members(model: nn.Module) -> int:
    return len(getattr(model, "members", ())) or 1


def _readout_rows(key: str, other, tensor):
    """The artifact's energy readout for a model with another number of energy heads: each new
    head starts as the artifact's (default) head. Other tensors pass unchanged."""
    if other is None or not _local(key).startswith(READOUT) or other.dim() != tensor.dim() or other.dim() == 0:
        return other
    if tuple(other.shape[1:]) != tuple(tensor.shape[1:]) or other.shape[0] == tensor.shape[0]:
        return other
    return other[:1].expand(tensor.shape).clone()


def load_base(artifact: str | Path, schema: Any, config: FineTuneConfig, species: Sequence[int] | None) -> nn.Module:
    """Load the artifact to start from and check it fits the run (before anything is built).

    Args:
        artifact: the model artifact.
        schema: the run's schema (its inputs must be the artifact's).
        config: ``Training.FineTune``.
        species: atomic numbers of the training data.

    Returns:
        The artifact's model, with ``new_species`` (sorted atomic numbers it was not trained on).

    Raises:
        ConfigError: an unreadable artifact, other inputs, or new species under ``"refuse"``.
    """
    from hydragnn.models import ModelError, load_artifact

    try:
        base = load_artifact(artifact)
    except ModelError as exc:
        raise ConfigError(f"{WHERE}: {exc}") from None
    if tuple(base.schema.inputs) != tuple(schema.inputs):
        raise ConfigError(
            f"{WHERE}: the run's inputs {[v.to_dict() for v in schema.inputs]} differ from the artifact's "
            f"{[v.to_dict() for v in base.schema.inputs]}; the trunk only knows the artifact's features"
        )
    trained = set(base.manifest.get("species") or [])
    base.new_species = sorted(set(species or ()) - trained) if trained else []
    if base.new_species and config.new_species == "refuse":
        names = [f"{chemical_symbols[z]} (Z={z})" for z in base.new_species]
        raise ConfigError(
            f"{WHERE}: the training data holds species the artifact was not trained on: {names}; "
            'set NeuralNetwork.Training.FineTune.new_species to "add" to train them from scratch'
        )
    return base


def initialise_from(
    model: nn.Module, base: nn.Module, config: FineTuneConfig, log: Callable[[str], None] = lambda _: None
) -> dict[str, Any]:
    """Copy the weights of ``base`` (from :func:`load_base`) into ``model`` as ``config`` says, and
    freeze the trunk if asked.

    Returns:
        ``{"artifact", "copied", "fresh", "trainable_parameters", "new_species"}``.

    Raises:
        ConfigError: a trunk tensor of another shape, or new species beyond the species embedding.
    """
    if _members(model) != _members(base):
        raise ConfigError(
            f"{WHERE}: the artifact has {_members(base)} committee member(s), this model {_members(model)}: set "
            f"NeuralNetwork.Architecture.committee to {_members(base)} (each member starts from the artifact's own)"
        )
    new = list(getattr(base, "new_species", []))
    width = getattr(getattr(model, "dims", None), "num_species", 0)
    if new and width and max(new) >= width:
        raise ConfigError(f"{WHERE}: species {new} do not fit the species embedding of width {width}")
    source = base.state_dict()
    target = model.state_dict()
    copied, fresh = [], []
    for key, tensor in target.items():
        trunk = _local(key).startswith(TRUNK)
        if _local(key) in _SKIPPED or (not trunk and config.heads == "replace"):
            fresh.append(key)
            continue
        other = _readout_rows(key, source.get(key), tensor)
        if other is None or tuple(other.shape) != tuple(tensor.shape):
            if trunk:
                found = "absent" if other is None else f"shape {tuple(other.shape)}"
                raise ConfigError(
                    f"{WHERE}: trunk tensor {key!r} is {found} in the artifact, {tuple(tensor.shape)} in this "
                    "model: the Architecture does not build the artifact's encoder (leave Architecture out to use "
                    "the artifact's)"
                )
            fresh.append(key)
            continue
        target[key] = other.to(dtype=tensor.dtype)
        copied.append(key)
    model.load_state_dict(target)
    if config.freeze_encoder:
        for name, param in model.named_parameters():
            if _local(name).startswith(TRUNK):
                param.requires_grad_(False)
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in model.parameters())
    artifact = (getattr(base, "manifest", None) or {}).get("path")
    log(
        f"initialised from the artifact: {len(copied)} tensors copied, {len(fresh)} fresh"
        + (f" ({_names(fresh)})" if fresh else "")
        + (f"; trunk frozen ({trainable} of {total} parameters train)" if config.freeze_encoder else "")
        + (f"; new species {[chemical_symbols[z] for z in new]}" if new else "")
    )
    return {
        "artifact": artifact,
        "copied": len(copied),
        "fresh": fresh,
        "trainable_parameters": trainable,
        "new_species": new,
    }


def _names(keys: list[str], shown: int = 6) -> str:
    """The first ``shown`` tensor names, and how many more."""
    more = len(keys) - shown
    return ", ".join(keys[:shown]) + (f" and {more} more" if more > 0 else "")

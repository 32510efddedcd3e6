"""``Architecture.output_scaling``: a head predicts ``shift + scale * network(h)`` per column.

The shift and scale of each named head live in the config (hydra-train's
``Training.normalize_outputs`` fills them from the training split; artifacts keep them) and here
as buffers outside the state dict. The loss compares ``(prediction - target) / scale``
(:func:`~hydragnn.models.loss.compute_loss` ``scales``), so the head trains on normalised targets
and the model predicts in the data's units. An interatomic potential's energy, forces and stress
are refused: ``energy_shift`` / ``energy_scale`` are theirs.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import cast

import torch
from torch import nn

from hydragnn.data import Schema

from .config import ModelConfig
from .config_groups import ROOT
from .errors import ModelConfigError


class OutputScaling(nn.Module):
    """The affine of the heads named in ``config.output_scaling`` (checked against ``schema``;
    ``special``: the MLIP role -> output names, refused). Calling it rescales those outputs of a
    ``{name: [rows, dim]}`` dict in place and returns it."""

    def __init__(self, config: ModelConfig, schema: Schema, special: Mapping[str, str]) -> None:
        super().__init__()
        names = [v.name for v in schema.outputs]
        self.names: tuple[str, ...] = tuple(name for name, _, _ in config.output_scaling)
        for name, shift, scale in config.output_scaling:
            where = f"{ROOT}.output_scaling.{name}"
            if name not in names:
                raise ModelConfigError(f"{where}: not an output of Variables ({names})")
            if name in special.values():
                raise ModelConfigError(f"{where}: the interatomic potential's output; use energy_shift / energy_scale")
            if len(shift) != schema[name].dim:
                raise ModelConfigError(f"{where}: {len(shift)} columns, the output has dim {schema[name].dim}")
            self.register_buffer(f"shift_{name}", torch.tensor(shift, dtype=torch.float64), persistent=False)
            self.register_buffer(f"scale_{name}", torch.tensor(scale, dtype=torch.float64), persistent=False)

    def scales(self) -> dict[str, torch.Tensor]:
        """``{name: scale [dim]}`` of the scaled heads (for the loss)."""
        return {name: cast(torch.Tensor, getattr(self, f"scale_{name}")) for name in self.names}

    def forward(self, out: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        for name in self.names:
            value = out[name]
            shift = cast(torch.Tensor, getattr(self, f"shift_{name}")).to(value.dtype)
            scale = cast(torch.Tensor, getattr(self, f"scale_{name}")).to(value.dtype)
            out[name] = torch.addcmul(shift, value, scale)
        return out

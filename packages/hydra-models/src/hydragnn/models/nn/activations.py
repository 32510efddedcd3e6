"""Activations by name and the plain MLP used by heads and conditioning."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
from torch import nn
from torch.nn import functional as F

from ..config_names import ACTIVATION_NAMES
from ..errors import ModelConfigError


class ShiftedSoftplus(nn.Module):
    """``softplus(x) - log(2)``: smooth, zero at zero (SchNet's activation)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.softplus(x) - math.log(2.0)


ACTIVATIONS: dict[str, Callable[[], nn.Module]] = {
    "relu": nn.ReLU,
    "silu": nn.SiLU,
    "swish": nn.SiLU,
    "gelu": nn.GELU,
    "tanh": nn.Tanh,
    "sigmoid": nn.Sigmoid,
    "elu": nn.ELU,
    "leaky_relu": nn.LeakyReLU,
    "softplus": nn.Softplus,
    "shifted_softplus": ShiftedSoftplus,
}
"""Activation by name (``Architecture.activation``)."""
assert tuple(ACTIVATIONS) == ACTIVATION_NAMES, "config_names.ACTIVATION_NAMES must name ACTIVATIONS"


def make_activation(name: str) -> nn.Module:
    """A fresh activation module; unknown names raise :class:`ModelConfigError`."""
    try:
        return ACTIVATIONS[name]()
    except KeyError:
        raise ModelConfigError(
            f"NeuralNetwork.Architecture.activation: unknown activation {name!r}; known: {sorted(ACTIVATIONS)}"
        ) from None


def mlp(in_dim: int, hidden: Sequence[int], out_dim: int, activation: str) -> nn.Sequential:
    """``Linear -> act -> ... -> Linear``: ``[*, in_dim] -> [*, out_dim]`` with ``len(hidden)`` hidden layers."""
    layers: list[nn.Module] = []
    width = in_dim
    for h in hidden:
        layers += [nn.Linear(width, h), make_activation(activation)]
        width = h
    layers.append(nn.Linear(width, out_dim))
    return nn.Sequential(*layers)

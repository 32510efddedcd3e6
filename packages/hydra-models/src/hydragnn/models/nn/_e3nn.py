"""The e3nn 0.6 classes the MACE blocks build on, as the type checker should see them.

e3nn ships no type information a checker can follow here: its ``@compile_mode`` class decorator
is unannotated, so every decorated class (``o3.TensorProduct``, ``o3.Linear``) reads as a bare
``nn.Module`` with none of its attributes, and ``o3.Irreps``' constructor and ``__getitem__``
are annotated ``_MulIr | Irreps`` whatever they are given. At run time the classes below are
e3nn's own (the same objects, ``TensorProduct is o3.TensorProduct``); under ``TYPE_CHECKING``
they are declarations of the attributes and signatures this package uses. :func:`irreps` and
:func:`mul_ir` are ``o3.Irreps(spec)`` and ``irreps[i]`` with their actual types.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, cast

from e3nn import o3

if TYPE_CHECKING:
    import torch
    from e3nn.o3._irreps import _MulIr
    from e3nn.o3._tensor_product._instruction import Instruction
    from torch import nn

    class TensorProduct(nn.Module):
        """``e3nn.o3.TensorProduct``."""

        irreps_in1: o3.Irreps
        irreps_in2: o3.Irreps
        irreps_out: o3.Irreps
        instructions: list[Instruction]
        shared_weights: bool
        internal_weights: bool
        weight_numel: int
        weight: torch.Tensor

        def __init__(
            self,
            irreps_in1: o3.Irreps,
            irreps_in2: o3.Irreps,
            irreps_out: o3.Irreps,
            instructions: list[tuple[Any, ...]],
            *,
            internal_weights: bool | None = None,
            shared_weights: bool | None = None,
        ) -> None: ...
        def forward(self, x: torch.Tensor, y: torch.Tensor, weight: torch.Tensor | None = None) -> torch.Tensor: ...

    class FullyConnectedTensorProduct(TensorProduct):
        """``e3nn.o3.FullyConnectedTensorProduct``."""

        def __init__(self, irreps_in1: o3.Irreps, irreps_in2: o3.Irreps, irreps_out: o3.Irreps) -> None: ...

    class Linear(nn.Module):
        """``e3nn.o3.Linear``."""

        irreps_in: o3.Irreps
        irreps_out: o3.Irreps
        shared_weights: bool
        internal_weights: bool
        weight_numel: int
        bias_numel: int
        weight: torch.Tensor

        def __init__(self, irreps_in: o3.Irreps, irreps_out: o3.Irreps) -> None: ...
        def forward(
            self, features: torch.Tensor, weight: torch.Tensor | None = None, bias: torch.Tensor | None = None
        ) -> torch.Tensor: ...

else:
    TensorProduct = o3.TensorProduct
    FullyConnectedTensorProduct = o3.FullyConnectedTensorProduct
    Linear = o3.Linear

__all__ = ["FullyConnectedTensorProduct", "Linear", "TensorProduct", "irreps", "mul_ir"]


def irreps(spec: str | Iterable[tuple[int, tuple[int, int] | o3.Irrep]]) -> o3.Irreps:
    """``o3.Irreps(spec)``."""
    return cast(o3.Irreps, o3.Irreps(spec))


def mul_ir(irreps: o3.Irreps, i: int) -> _MulIr:
    """``irreps[i]``: its ``i``-th ``(mul, ir)`` entry (``.mul``, ``.ir``)."""
    return cast("_MulIr", irreps[i])

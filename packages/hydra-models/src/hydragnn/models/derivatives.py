"""Forces, virial and stress as a module around a potential's energy (NequIP's ``ForceStressOutput``).

:class:`EnergyDerivatives` takes an energy function ``potential(pos, displacement) ->
(energy sum, aux)`` of the positions ``pos [N, 3]`` and a strain ``displacement [B, 3, 3]`` (zero:
the derivative at the unstrained cell), and returns ``(aux, forces, virial)`` with forces
``-dE/dpos [N, 3]`` and virial ``dE/d(strain) [B, 3, 3]`` (:func:`~.mlip.stress_from_virial` makes
stress of it). The equations are written once, in the potential; the module only chooses the
derivative engine, an execution choice (:mod:`hydragnn.models.execution`):

* ``"autograd"`` (default): ``torch.autograd.grad``, with ``create_graph`` while training so the
  loss differentiates the forces again;
* ``"func"``: ``torch.func.grad`` of the same function: the derivative is part of the forward, so
  ``torch.compile`` compiles a whole training step on forces (a compiled backward differentiated
  again is not supported by torch).

Both give the same forces and parameter gradients (the conformance suite checks every encoder).
The module holds no parameters: state-dict keys do not change.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from .errors import ModelError
from .mlip import derivatives

__all__ = ["DERIVATIVES", "EnergyDerivatives", "set_derivatives"]

DERIVATIVES = ("autograd", "func")
"""The derivative engines (:attr:`EnergyDerivatives.engine`)."""

Potential = Callable[[torch.Tensor, torch.Tensor | None], tuple[torch.Tensor, Any]]
"""``potential(pos, displacement) -> (sum of the energies, aux)``."""


def _check(engine: str) -> str:
    if engine not in DERIVATIVES:
        raise ModelError(f"derivatives: expected one of {list(DERIVATIVES)}, found {engine!r}")
    return engine


class EnergyDerivatives(nn.Module):
    """The derivatives of a potential's energy by one engine (see the module docstring)."""

    def __init__(self, engine: str = "autograd") -> None:
        super().__init__()
        self.engine = _check(engine)

    def extra_repr(self) -> str:
        return f"engine={self.engine!r}"

    def forward(
        self,
        potential: Potential,
        pos: torch.Tensor,
        displacement: torch.Tensor | None,
        *,
        wanted: bool,
        create_graph: bool,
        retain_graph: bool,
    ) -> tuple[Any, torch.Tensor | None, torch.Tensor | None]:
        """``(aux, forces, virial)`` of ``potential`` at ``pos`` (``displacement``: zero strain
        ``[B, 3, 3]`` for the virial, else ``None``); ``forces`` and ``virial`` are ``None`` when
        not ``wanted``. ``create_graph``: derivatives differentiable (training on forces);
        ``retain_graph``: keep the energy's graph for a later backward (autograd only)."""
        if wanted and self.engine == "func":
            argnums = (0, 1) if displacement is not None else (0,)
            grads, aux = torch.func.grad(potential, argnums=argnums, has_aux=True)(pos, displacement)
            return aux, -grads[0], (grads[1] if displacement is not None else None)
        if wanted and not pos.requires_grad:
            pos = pos.detach().requires_grad_(True)
        if displacement is not None:
            displacement = displacement.requires_grad_(True)
        total, aux = potential(pos, displacement)
        if not wanted:
            return aux, None, None
        forces, virial = derivatives(total, pos, displacement, create_graph=create_graph, retain_graph=retain_graph)
        return aux, forces, virial


def set_derivatives(model: nn.Module, how: str) -> None:
    """Set the derivative engine of every :class:`EnergyDerivatives` in ``model`` (a potential, a
    committee's members, a wrapper's module) to ``how`` (one of :data:`DERIVATIVES`).

    Raises:
        ModelError: an unknown ``how``.
    """
    _check(how)
    for module in model.modules():
        if isinstance(module, EnergyDerivatives):
            module.engine = how

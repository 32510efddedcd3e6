"""``compile_model=True``: the compiled energy region, energy+forces around it, and what counts as a
compile failure (the calculator then runs eager, see ``HydraCalculator._compile_failed``)."""

from __future__ import annotations

from typing import Any

import hydragnn.data.pyg_import  # noqa: F401 (PyG as HydraGNN needs it)

import torch
from torch_geometric.data import Batch

from hydragnn.models import HydraModel

from .model_info import ModelInfo


def compiled_energy_forces(
    compiled_energy: Any, named_tensors: list[tuple[str, torch.Tensor]], batch: Batch, info: ModelInfo
) -> dict[str, torch.Tensor]:
    """Compile mode with forces: the compiled forward computes the energy, autograd the forces.

    Inside ``torch.compile``, the model's own ``torch.autograd.grad`` (and the
    ``requires_grad_`` on its positions) break the graph, which made compiled energy+forces
    slower than eager. Here the positions require grad before the compiled call, the compiled
    region is energy-only (AOTAutograd compiles its backward too) and the gradient is taken
    outside it. The weights enter as detached inputs (``functional_call``), so the compiled
    backward computes the position gradient only, not the (unused) weight gradients.
    """
    pos = batch.pos.detach().requires_grad_(True)  # pyright: ignore[reportAttributeAccessIssue]  # a PyG Batch is a Data at runtime
    batch.pos = pos  # pyright: ignore[reportAttributeAccessIssue]  # (DynamicInheritance hides the base from the checker)
    weights = {name: t.detach() for name, t in named_tensors}
    with torch.enable_grad():
        out = compiled_energy(weights, batch)
        energy = out[info.energy]
        (grad,) = torch.autograd.grad(energy.sum(), [pos], allow_unused=True)
    result = {k: v.detach() for k, v in out.items()}
    result[info.forces] = -grad if grad is not None else torch.zeros_like(pos)
    return result


def is_compile_failure(exc: BaseException) -> bool:
    """Whether ``exc`` comes from torch.compile's machinery (Dynamo, AOTAutograd, Inductor), not the model."""
    for cls in type(exc).__mro__:
        module = getattr(cls, "__module__", "") or ""
        if module.startswith(("torch._dynamo", "torch._inductor", "torch._functorch")):
            return True
    return False


def compile_failure_message(exc: BaseException) -> str:
    """The one warning of a failed compile: the first lines of ``exc``, and what happens next."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip() and not line.startswith("Set TORCH")]
    first = " ".join(lines[:2])[:300]
    return (
        f"torch.compile failed on this model ({type(exc).__name__}: {first}); this calculator runs the eager "
        "model from now on (results are unchanged, only slower)"
    )


def energy_only(model: HydraModel) -> Any:
    """``f(weights, batch) -> outputs`` without forces: ``model`` called with ``weights`` swapped in."""

    def energy(weights: dict[str, torch.Tensor], batch: Batch) -> dict[str, torch.Tensor]:
        return torch.func.functional_call(
            model, weights, (batch,), {"compute_forces": False, "compute_stress": False}, strict=False
        )

    return energy

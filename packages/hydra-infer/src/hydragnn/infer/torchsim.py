"""``HydraTorchSimModel``: a :class:`HydraCalculator` as a torch-sim ``ModelInterface``.

Needs the optional extra ``hydra-infer[torchsim]`` (``torch-sim-atomistic``). torch-sim's cell
holds lattice vectors as columns; the calculator takes rows (``state.row_vector_cell``).
Returns ``energy [B]`` (eV), ``forces [N, 3]`` (eV/Å) and ``stress [B, 3, 3]`` (eV/Å³, periodic
states) in the model's dtype on its device. :func:`check_model` checks any torch-sim model on
structures of its own species (torch-sim's ``validate_model_outputs`` needs Si and Fe).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from hydragnn.data.pyg_compat import torchscript_quietly

from .calculator import HydraCalculator, md_calculator
from .errors import InferenceError
from .finite import require_finite
from .uncertainty import UncertaintyLimit, md_uncertainty

try:
    with torchscript_quietly():  # torch-sim scripts functions at import (deprecated by torch >= 2.14)
        import torch_sim as ts
        from torch_sim.models.interface import ModelInterface
except ImportError as exc:  # pragma: no cover - depends on the optional extra
    raise ImportError(
        "HydraTorchSimModel needs torch-sim: pip install 'hydra-infer[torchsim]' (torch-sim-atomistic)"
    ) from exc

from .neighbors import md_skin  # noqa: E402
from .torchsim_checks import check_interface  # noqa: E402  (after the friendly ImportError above)


class HydraTorchSimModel(ModelInterface):
    """torch-sim model around a :class:`HydraCalculator`.

    Args:
        calc_or_path: a :class:`HydraCalculator`, a ``HydraModel`` or an artifact path.
        compute_forces: return forces.
        compute_stress: return stress (periodic states only).
        skin: Verlet skin (Å) of the neighbour list, as for :class:`~.ase.HydraASECalculator`:
            ``None`` keeps a given calculator's own and gives one built here 0.5 Å where reuse
            applies (:func:`~.neighbors.md_skin`); 0 searches on every step. Each system of a
            batched state keeps its list until one of its atoms moved more than half the skin
            (positions wrapped back into the cell do not count; a strained cell, NPT, uses up
            part of the skin; see :mod:`.neighbors`), with the outputs of a fresh search.
            Counters: ``model.hydra.neighbor_stats``.
        uncertainty_limit: a :class:`~.uncertainty.UncertaintyLimit` (or a threshold in eV/Å:
            stop) applied on every call to the force uncertainty of all systems together; needs
            a committee (a calculator passed in must have been built with ``uncertainty=True``).
            With a committee served that way the outputs also hold ``energy_uncertainty [B]``
            and ``forces_uncertainty [N]``.
        **calculator_kwargs: passed to :class:`HydraCalculator` when it is built here.
    """

    def __init__(
        self,
        calc_or_path: Any,
        *,
        compute_forces: bool = True,
        compute_stress: bool = True,
        skin: float | None = None,
        uncertainty_limit: UncertaintyLimit | float | None = None,
        **calculator_kwargs: Any,
    ) -> None:
        super().__init__()
        self.uncertainty_limit = md_uncertainty(calc_or_path, uncertainty_limit, calculator_kwargs)
        self.hydra = md_calculator(calc_or_path, skin, **calculator_kwargs)
        if compute_forces and self.hydra.info.forces is None:
            raise InferenceError("compute_forces: the model predicts no forces")
        if compute_stress and self.hydra.info.stress is None:
            raise InferenceError("compute_stress: the model predicts no stress")
        self._device = self.hydra.device
        self._dtype = self.hydra.model.geometry_dtype
        self._compute_forces = bool(compute_forces)
        self._compute_stress = bool(compute_stress)
        self._memory_scales_with = "n_atoms_x_density"
        self.calls = 0  # forward() calls so far (named when an output is not finite)

    def forward(self, state: Any, **kwargs: Any) -> dict[str, torch.Tensor]:
        """Energies, forces and stress of a ``SimState`` (or its dict form)."""
        if isinstance(state, dict):
            state = ts.SimState(**state, masses=torch.ones_like(state["positions"][:, 0]))
        pbc = bool(state.pbc) if not isinstance(state.pbc, torch.Tensor) else bool(state.pbc.any())
        cell = state.row_vector_cell if pbc else None
        stress = self._compute_stress and pbc
        out = self.hydra(
            state.positions,
            state.atomic_numbers,
            cell=cell,
            pbc=state.pbc if isinstance(state.pbc, torch.Tensor) else None,
            forces=self._compute_forces,
            stress=stress,
            mol_idx=state.system_idx,
        )
        self.calls += 1
        require_finite(
            f"HydraTorchSimModel, call {self.calls}",
            {"forces": out.get("forces"), "forces uncertainty": out.get("forces_uncertainty")},
            {"energy": out["energy"], "stress": out.get("stress")},
        )
        if self.uncertainty_limit is not None and "forces_uncertainty" in out:
            self.uncertainty_limit.check(f"HydraTorchSimModel, call {self.calls}", out["forces_uncertainty"])
        n_systems = int(state.n_systems)
        result = {"energy": out["energy"][:n_systems].to(self._dtype)}
        if "energy_uncertainty" in out:
            result["energy_uncertainty"] = out["energy_uncertainty"][:n_systems].to(self._dtype)
        if "forces_uncertainty" in out and self._compute_forces:
            result["forces_uncertainty"] = out["forces_uncertainty"].to(self._dtype)
        if self._compute_forces:
            result["forces"] = out["forces"].to(self._dtype)
        if stress:
            result["stress"] = out["stress"].to(self._dtype)
        return result


def as_torchsim_model(model: Any) -> ModelInterface:
    """``model`` as a torch-sim model: a ``ModelInterface`` as it is, else a
    :class:`HydraTorchSimModel` around it (a :class:`HydraCalculator` keeps its own skin; a model
    or an artifact path gets the MD skin, as ``HydraTorchSimModel(path)`` gives), with forces and
    stress where the model predicts them."""
    if isinstance(model, ModelInterface):
        return model
    if isinstance(model, HydraCalculator):
        calc, skin = model, None
    else:
        calc = HydraCalculator(model)
        skin = md_skin(calc, None)
    return HydraTorchSimModel(
        calc, compute_forces=calc.info.forces is not None, compute_stress=calc.info.stress is not None, skin=skin
    )


def check_model(
    model: Any,
    *,
    species: Sequence[int] | None = None,
    spacing: float | None = None,
    seed: int = 0,
    step: float | None = None,
    atol: float | None = None,
    rtol: float | None = None,
) -> dict[str, Any]:
    """What torch-sim relies on, checked on structures of the model's own species
    (:func:`~.torchsim_checks.check_interface`, whose arguments, report and ``InferenceError``
    these are), for any torch-sim model or what :class:`HydraTorchSimModel` takes (a
    ``HydraCalculator``, ``HydraModel`` or artifact path: :func:`as_torchsim_model`)."""
    return check_interface(
        as_torchsim_model(model), species=species, spacing=spacing, seed=seed, step=step, atol=atol, rtol=rtol
    )


__all__ = ["HydraTorchSimModel", "as_torchsim_model", "check_model"]

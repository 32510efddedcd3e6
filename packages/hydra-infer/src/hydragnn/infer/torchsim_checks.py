"""The checks of ``check_model`` (:mod:`.torchsim`): what torch-sim relies on, checked on structures
made of the model's own species, for any torch-sim ``ModelInterface``.

torch-sim's ``validate_model_outputs`` builds Si and Fe cells, so a model trained on other
elements cannot pass it. :func:`check_interface` builds a batch of two molecules and a batch of two
(triclinic) periodic cells from the model's species and checks, stopping at the first failure:

* ``interface``: the ``device``, ``dtype``, ``compute_forces`` and ``compute_stress`` attributes;
* ``outputs``: ``energy [B]``, ``forces [N, 3]``, ``stress [B, 3, 3]`` (periodic batches, when
  computed), finite, in the model's dtype, on its device;
* ``state``: the state's tensors are left unchanged;
* ``batch``: each system alone gives its rows of the batched outputs;
* ``forces``: ``forces = -dE/dR`` (central differences);
* ``stress``: ``stress = (1/V) dE/d(strain)`` (central differences, symmetric strain; ASE's sign).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, cast

import numpy as np
import torch
import torch_sim as ts
from ase import Atoms
from torch_sim.models.interface import ModelInterface

from .calculator import HydraCalculator
from .errors import InferenceError

#: Per dtype: finite-difference step (Å, and strain), absolute floor (eV/Å), relative tolerance.
_DEFAULTS = {torch.float64: (1e-4, 1e-6, 1e-4), torch.float32: (1e-2, 1e-3, 1e-2)}
#: Relative tolerance of batch == per-system, per dtype.
_BATCH_RTOL = {torch.float64: 1e-8, torch.float32: 1e-4}


def _fail(check: str, message: str) -> InferenceError:
    return InferenceError(f"check_model: {check}: {message}")


def _species(model: ModelInterface, species: Sequence[int] | None) -> list[int]:
    if species is None and hasattr(model, "hydra"):
        info = cast(HydraCalculator, model.hydra).info  # HydraTorchSimModel's calculator
        if info.species is not None:
            species = sorted(info.species)
        else:
            species = [z for z in (1, 6, 8) if info.max_species is None or z < info.max_species] or [1]
    if species is None:
        raise _fail("species", "give the atomic numbers your model accepts (species=[...])")
    zs = [int(z) for z in species]
    if not zs or min(zs) < 1:
        raise _fail("species", f"expected atomic numbers >= 1, found {list(species)!r}")
    return zs


def _structures(zs: list[int], spacing: float, seed: int) -> dict[str, list[Atoms]]:
    """Two molecules (3 and 5 atoms) and two triclinic cells (4 and 2 atoms), rattled, species cycled."""
    rng = np.random.default_rng(seed)
    grid = spacing * np.array([[i, j, k] for i in range(2) for j in range(2) for k in range(2)], dtype=float)

    def numbers(n: int, offset: int) -> list[int]:
        return [zs[(i + offset) % len(zs)] for i in range(n)]

    def rattled(pos: np.ndarray, amount: float) -> np.ndarray:
        return pos + rng.uniform(-amount, amount, size=pos.shape) * spacing

    shear = np.eye(3) + np.array([[0.0, 0.05, 0.02], [0.0, 0.0, -0.04], [0.03, 0.0, 0.0]])
    a = spacing * math.sqrt(2)
    fcc = a * np.array([[0, 0, 0], [0.5, 0.5, 0], [0.5, 0, 0.5], [0, 0.5, 0.5]]) @ shear
    tall = np.diag([spacing, spacing, 2 * spacing]) @ shear
    return {
        "molecules": [
            Atoms(numbers=numbers(3, 0), positions=rattled(grid[:3], 0.1)),
            Atoms(numbers=numbers(5, 1), positions=rattled(grid[[0, 1, 2, 4, 7]], 0.1)),
        ],
        "periodic cells": [
            Atoms(numbers=numbers(4, 2), positions=rattled(fcc, 0.05), cell=a * shear, pbc=True),
            Atoms(
                numbers=numbers(2, 3),
                positions=rattled(np.array([[0, 0, 0], [0.5, 0.5, 0.5]]) @ tall, 0.05),
                cell=tall,
                pbc=True,
            ),
        ],
    }


def _same_device(a: torch.device, b: torch.device) -> bool:
    return a.type == b.type and (a.index is None or b.index is None or a.index == b.index)


def _snapshot(state: Any) -> dict[str, Any]:
    return {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in vars(state).items()}


def _moved(state: Any, positions: torch.Tensor, row_cell: torch.Tensor | None = None) -> Any:
    new = state.clone()
    new.positions = positions
    if row_cell is not None:
        new.cell = row_cell.mT.contiguous()
    return new


def _outputs(model: ModelInterface, state: Any, where: str) -> dict[str, torch.Tensor]:
    before = _snapshot(state)
    out = model(state)
    for key, value in before.items():
        now = getattr(state, key, None)
        same = torch.equal(cast(torch.Tensor, now), value) if isinstance(value, torch.Tensor) else now == value
        if not same:
            raise _fail("state", f"the model changed state.{key} ({where})")
    b, n = state.n_systems, state.n_atoms
    want: dict[str, tuple[int, ...]] = {"energy": (b,)}
    if model.compute_forces:
        want["forces"] = (n, 3)
    if model.compute_stress and bool(state.pbc):
        want["stress"] = (b, 3, 3)
    for key, shape in want.items():
        if key not in out:
            raise _fail("outputs", f"no {key!r} in the outputs ({where}; found {sorted(out)})")
        value = out[key]
        if tuple(value.shape) != shape:
            raise _fail("outputs", f"{key}: expected shape {list(shape)}, found {list(value.shape)} ({where})")
        if value.dtype != model.dtype or not _same_device(value.device, torch.device(model.device)):
            raise _fail(
                "outputs",
                f"{key}: expected {model.dtype} on {model.device}, found {value.dtype} on {value.device} ({where})",
            )
        if not bool(torch.isfinite(value).all()):
            raise _fail("outputs", f"{key}: NaN or inf ({where})")
    return {k: out[k].detach().to(torch.float64) for k in want}


def _batch(model: ModelInterface, systems: list[Atoms], out: dict[str, torch.Tensor], where: str) -> None:
    rtol = _BATCH_RTOL.get(model.dtype, 1e-4)
    start = 0
    for i, atoms in enumerate(systems):
        alone = _outputs(model, ts.io.atoms_to_state([atoms], model.device, model.dtype), where)
        rows = {"energy": slice(i, i + 1), "forces": slice(start, start + len(atoms)), "stress": slice(i, i + 1)}
        for key, value in alone.items():
            batched = out[key][rows[key]]
            err = float((value - batched).abs().max()) if value.numel() else 0.0
            if err > rtol * max(1.0, float(batched.abs().max())):
                raise _fail(
                    "batch", f"{key} of system {i} alone differs from its rows in the batch by {err:.3g} ({where})"
                )
        start += len(atoms)


def _force_error(
    model: ModelInterface, state: Any, out: dict, step: float, atol: float, rtol: float, where: str
) -> float:
    pos, counts = state.positions, state.n_atoms_per_system.tolist()
    starts = np.cumsum([0, *counts[:-1]])
    fd = torch.zeros_like(out["forces"])
    for k in range(max(counts)):
        rows = torch.tensor([s + k for s, c in zip(starts, counts, strict=True) if c > k], device=pos.device)
        for d in range(3):
            plus, minus = pos.clone(), pos.clone()
            plus[rows, d] += step
            minus[rows, d] -= step
            e_plus = model(_moved(state, plus))["energy"].detach().to(torch.float64)
            e_minus = model(_moved(state, minus))["energy"].detach().to(torch.float64)
            h = (plus[rows, d] - minus[rows, d]).to(torch.float64)
            fd[rows, d] = -(e_plus - e_minus)[state.system_idx[rows]] / h
    energy = float(out["energy"].abs().max())
    tol = atol + 50 * torch.finfo(model.dtype).eps * max(1.0, energy) / step + rtol * float(out["forces"].abs().max())
    err = (fd - out["forces"]).abs()
    if float(err.max()) > tol:
        i, d = divmod(int(err.argmax()), 3)
        raise _fail(
            "forces",
            f"forces[{i}, {d}] = {float(out['forces'][i, d]):.6g} but -dE/dR = {float(fd[i, d]):.6g} "
            f"by central differences (step {step:g} Å; tolerance {tol:.3g} eV/Å; {where})",
        )
    return float(err.max())


def _stress_error(model: ModelInterface, state: Any, out: dict, step: float, atol: float, rtol: float) -> float:
    row_cell = state.row_vector_cell
    volume = torch.linalg.det(row_cell.to(torch.float64)).abs()
    virial = out["stress"] * volume.view(-1, 1, 1)  # V * stress = dE/d(strain)
    fd = torch.zeros_like(virial)
    eye = torch.eye(3, dtype=row_cell.dtype, device=row_cell.device)
    for a in range(3):
        for b in range(a, 3):
            energies = []
            for sign in (1.0, -1.0):
                strain = eye.clone()
                strain[a, b] += sign * step
                if a != b:
                    strain[b, a] += sign * step
                moved = state.positions @ strain
                energies.append(model(_moved(state, moved, row_cell @ strain))["energy"].detach().to(torch.float64))
            fd[:, a, b] = fd[:, b, a] = (energies[0] - energies[1]) / (2 * step) / (1 if a == b else 2)
    sym = (virial + virial.mT) / 2
    length = float(volume.max()) ** (1 / 3)
    energy = float(out["energy"].abs().max())
    eps = torch.finfo(model.dtype).eps
    tol = atol * length + 50 * eps * max(1.0, energy) / step + rtol * float(sym.abs().max())
    err = (fd - sym).abs()
    if float(err.max()) > tol:
        s, a, b = np.unravel_index(int(err.argmax()), tuple(err.shape))
        raise _fail(
            "stress",
            f"V * stress[{s}][{a}, {b}] = {float(sym[s, a, b]):.6g} eV but dE/d(strain) = "
            f"{float(fd[s, a, b]):.6g} eV by central differences (strain step {step:g}; tolerance {tol:.3g} eV)",
        )
    return float((err / volume.view(-1, 1, 1)).max())


def check_interface(
    model: ModelInterface,
    *,
    species: Sequence[int] | None = None,
    spacing: float | None = None,
    seed: int = 0,
    step: float | None = None,
    atol: float | None = None,
    rtol: float | None = None,
) -> dict[str, Any]:
    """Check that ``model`` gives torch-sim what it relies on, on structures of its own species.

    Args:
        model: a torch-sim ``ModelInterface`` (such as :class:`~.torchsim.HydraTorchSimModel`;
            :func:`hydragnn.infer.torchsim.check_model` also takes what that class takes).
        species: atomic numbers to build the structures from (cycled over 14 atoms). Default: a
            HydraGNN model's species; other models must give them.
        spacing: nearest-neighbour distance (Å); default ``min(2.5, 0.6 * cutoff)``, 2.5 without a cutoff.
        seed: seed of the rattled positions.
        step: finite-difference step (Å; also the strain step): default 1e-4 (float64), 1e-2 (float32).
        atol: absolute tolerance of forces (eV/Å): default 1e-6 (float64), 1e-3 (float32), plus the
            rounding of the energy over the step.
        rtol: tolerance relative to the largest force (stress): default 1e-4 (float64), 1e-2 (float32).

    Returns:
        ``{"checks": [...], "skipped": {check: reason}, "species": [...], "dtype", "device",
        "max_force_error" (eV/Å), "max_stress_error" (eV/Å³)}`` (errors ``None`` when skipped).

    Raises:
        InferenceError: ``"check_model: <check>: ..."`` naming the first check that failed.
    """
    for attr in ("device", "dtype", "compute_forces", "compute_stress"):
        if not hasattr(model, attr):
            raise _fail("interface", f"model.{attr} is not set (torch-sim's ModelInterface)")
    zs = _species(model, species)
    if spacing is None:
        cutoff = getattr(getattr(model, "hydra", None), "cutoff", None)
        spacing = 2.5 if cutoff is None else min(2.5, 0.6 * float(cutoff))
    default_step, default_atol, default_rtol = _DEFAULTS.get(model.dtype, _DEFAULTS[torch.float32])
    step, atol, rtol = step or default_step, default_atol if atol is None else atol, rtol or default_rtol
    report: dict[str, Any] = {
        "checks": [],
        "skipped": {},
        "species": zs,
        "dtype": str(model.dtype),
        "device": str(model.device),
        "max_force_error": None,
        "max_stress_error": None,
    }
    force_errors, stress_errors = [], []
    for where, systems in _structures(zs, spacing, seed).items():
        state = ts.io.atoms_to_state(systems, model.device, model.dtype)
        out = _outputs(model, state, where)
        _batch(model, systems, out, where)
        if model.compute_forces:
            force_errors.append(_force_error(model, state, out, step, atol, rtol, where))
        if "stress" in out:
            stress_errors.append(_stress_error(model, state, out, step, atol, rtol))
    report["checks"] = ["interface", "outputs", "state", "batch"]
    if force_errors:
        report["checks"].append("forces")
        report["max_force_error"] = max(force_errors)
    else:
        report["skipped"]["forces"] = "compute_forces is False"
    if stress_errors:
        report["checks"].append("stress")
        report["max_stress_error"] = max(stress_errors)
    else:
        report["skipped"]["stress"] = "compute_stress is False"
    return report


__all__ = ["check_interface"]

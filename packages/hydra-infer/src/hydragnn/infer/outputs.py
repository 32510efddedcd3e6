"""Model predictions -> calculator results: units (normalization undone) and layout.

Layouts follow the input: per-structure values are ``[B]`` (or ``[B, dim]``), per-atom values
``[N, dim]`` for the single and flat layouts and ``[B, Nmax, dim]`` (zeros at padding) for the
dense one; a trailing dimension of 1 is dropped (``energy [B]``, ``energies [N]``). Stress is
the full ``[B, 3, 3]`` tensor (eV/Å³). Every tensor is a detached copy the caller owns.
"""

from __future__ import annotations

from typing import Protocol, cast

import torch

from hydragnn.models.committee import SPREAD_SUFFIX

from .model_info import ModelInfo, energy_scale


class CallLayout(Protocol):
    """What :func:`convert` reads of a call (:class:`~.inputs.CallInputs` has it; so does an
    exported model's one-structure layout, whose ``counts`` is built without ``bincount``)."""

    @property
    def counts(self) -> torch.Tensor: ...  # [B] atoms per structure

    @property
    def batch(self) -> torch.Tensor: ...  # [N] structure of each atom

    @property
    def layout(self) -> str: ...  # "single", "dense" or "flat"

    @property
    def mask(self) -> torch.Tensor | None: ...  # [B, Nmax] real-atom mask of the dense layout


VOIGT_TO_FULL = (0, 5, 4, 5, 1, 3, 4, 3, 2)
"""Index into Voigt ``(xx, yy, zz, yz, xz, xy)`` for each entry of the row-major 3x3 tensor."""


def _squeeze(t: torch.Tensor) -> torch.Tensor:
    return t.squeeze(-1) if t.dim() >= 2 and t.shape[-1] == 1 else t


def _per_atom_layout(t: torch.Tensor, call: CallLayout) -> torch.Tensor:
    if call.layout != "dense":
        return t
    mask = cast(torch.Tensor, call.mask)  # the dense layout has a mask
    out = t.new_zeros((*mask.shape, *t.shape[1:]))
    out[mask] = t
    return out


def full_stress(stress: torch.Tensor) -> torch.Tensor:
    """``[B, 6]`` Voigt or ``[B, 9]`` row-major -> ``[B, 3, 3]``."""
    if stress.shape[-1] == 6:
        stress = stress[:, list(VOIGT_TO_FULL)]
    return stress.reshape(-1, 3, 3)


def _uncertainty(
    results: dict[str, torch.Tensor],
    name: str,
    spread: torch.Tensor,
    call: CallLayout,
    info: ModelInfo,
    scale: torch.Tensor | None,
) -> None:
    """A committee's spread of the energy, forces or per-atom energies as ``energy_uncertainty [B]``
    (eV, the members' standard deviation), ``forces_uncertainty [N]`` (eV/Å, the root mean square
    deviation of the members' force vectors from their mean, per atom) or
    ``atomic_energy_uncertainty [N]`` (eV, the members' standard deviation of each atom's energy:
    metatomic's per-atom ``energy_uncertainty``); other outputs' spreads are not served."""
    if name == info.atomic_energy:
        value = spread.to(torch.float64).reshape(-1)
        if scale is not None:
            value = value * scale[call.batch]
        results["atomic_energy_uncertainty"] = _per_atom_layout(value.to(spread.dtype), call)
    elif name == info.energy:
        value = spread.to(torch.float64).reshape(-1)
        results["energy_uncertainty"] = (value * scale if scale is not None else value).to(spread.dtype)
    elif name == info.forces:
        value = spread.to(torch.float64).square().sum(-1).sqrt()
        if scale is not None:
            value = value * scale[call.batch]
        results["forces_uncertainty"] = _per_atom_layout(value.to(spread.dtype), call)


def convert(
    raw: dict[str, torch.Tensor], call: CallLayout, info: ModelInfo, *, detach: bool = True
) -> dict[str, torch.Tensor]:
    """Results in eV / Å units and the call's layout (see the module docstring).

    Args:
        raw: the model's outputs on the flattened batch of ``call``.
        call: the validated call (or any :class:`CallLayout`).
        info: the model's facts (output roles, normalization).
        detach: return detached copies (the calculator); ``False`` keeps the graph to the inputs
            (an exported energy that engines differentiate).

    Returns:
        ``{name: tensor}``: ``energy``, ``forces`` and ``stress`` under those names whatever the
        model calls them, every other head under its own name, and a committee's
        ``energy_uncertainty`` / ``forces_uncertainty`` when it returned its spread.
    """
    counts = call.counts
    scale = energy_scale(info, counts)
    norm = info.normalizer
    results: dict[str, torch.Tensor] = {}
    for name, value in raw.items():
        value = value.detach() if detach else value
        dtype = value.dtype
        if name.endswith(SPREAD_SUFFIX):
            _uncertainty(results, name[: -len(SPREAD_SUFFIX)], value, call, info, scale)
        elif name == info.energy:
            if norm is not None and name in norm:
                value = norm.invert(value.to(torch.float64), name, num_nodes=counts).to(dtype)
            results["energy"] = value.reshape(-1).clone()
        elif name == info.forces:
            if scale is not None:
                value = (value.to(torch.float64) * scale[call.batch].unsqueeze(-1)).to(dtype)
            results["forces"] = _per_atom_layout(value, call).clone()
        elif name == info.stress:
            if scale is not None:
                value = (value.to(torch.float64) * scale.unsqueeze(-1)).to(dtype)
            results["stress"] = full_stress(value).clone()
        elif name == info.atomic_energy:
            if norm is not None and info.energy in norm:
                st = norm.stats[info.energy]
                # E = scale_b * sum_i a_i + shift_b (scale_b, shift_b include N_b for per-atom stats)
                shift = torch.full(counts.shape, float(st.shift[0]), dtype=torch.float64, device=counts.device)
                if not st.per_atom:
                    shift = shift / counts.clamp_min(1).to(torch.float64)
                value = (
                    value.to(torch.float64) * cast(torch.Tensor, scale)[call.batch].unsqueeze(-1)
                    + shift[call.batch].unsqueeze(-1)
                ).to(dtype)
            results[name] = _squeeze(_per_atom_layout(value, call)).clone()
        elif name in info.node_outputs:
            if norm is not None and name in norm:
                value = norm.invert(value, name)
            results[name] = _squeeze(_per_atom_layout(value, call)).clone()
        elif name in info.graph_outputs:
            if norm is not None and name in norm:
                value = norm.invert(value, name, num_nodes=counts)
            results[name] = _squeeze(value).clone()
        # edge outputs are dropped: the caller never sees the calculator's edges
    return results

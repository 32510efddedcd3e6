"""One structure's energy, forces, virial and heads as a traced aten graph: what every format exports.

The exported function (:func:`potential_function`) takes an engine's inputs, never a PyG batch::

    f(positions [N, 3], numbers [N] int64, cell [3, 3], pbc [3] bool,
      edge_index [2, E] int64, cell_shifts [E, 3]) -> {name: tensor}

``edge_index`` is a full neighbour list (both ``i -> j`` and ``j -> i``, no self pair) in ASE's
``neighbor_list("ijS")`` convention: row 0 the centre ``i``, row 1 the neighbour ``j``, and the
pair vector ``positions[j] - positions[i] + cell_shifts @ cell`` (integer-valued shifts, in the
dtype of the positions). A molecule passes a zero cell and ``pbc`` all false. Outputs: ``energy``
``[]`` (eV), ``forces [N, 3]`` (eV/Å), ``stress [3, 3]`` (eV/Å³, ``(1/V) dE/d(strain)``, ASE's
sign) and ``virial [3, 3]`` (eV, ``-V * stress``, LAMMPS's ``sum r f``), both zero without a cell
volume; the per-atom energies and every other head, per atom ``[N]`` / ``[N, dim]`` and per
structure ``[]`` / ``[dim]``, in the units :class:`~hydragnn.infer.HydraCalculator` returns. A
committee exported with ``uncertainty`` adds the members' spread as the calculator serves it
(``energy_uncertainty []``, ``forces_uncertainty [N]`` with gradients, ``atomic_energy_uncertainty
[N]`` for a model with per-atom energies): each member's energy is differentiated once, and the
mean forces and stress are the members' means (the derivative of the mean energy, by linearity).

The equations are the model's own (:func:`hydragnn.models.mlip.apply_strain` and
:func:`~hydragnn.models.mlip.derivatives` around ``HydraModel.forward``, units from
:func:`hydragnn.infer.outputs.convert`), traced by ``make_fx(tracing_mode="symbolic")``: autograd
is recorded as explicit backward ops, the atom and edge counts stay symbolic, the weights become
constants, and device and dtype are those of the trace. ``torch.export`` cannot take the
``autograd.grad`` itself; it takes this graph.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import torch
from torch.fx.experimental.proxy_tensor import make_fx

from hydragnn.models import Committee, HydraModel
from hydragnn.models.committee import SPREAD_SUFFIX
from hydragnn.models.mlip import apply_strain, derivatives

from ..batching import model_batch
from ..model_info import ModelInfo
from ..outputs import convert

INPUT_NAMES = ("positions", "numbers", "cell", "pbc", "edge_index", "cell_shifts")


class ExportError(ValueError):
    """A model that cannot be exported (with the reason), or an export that failed its check."""


@dataclass(frozen=True)
class OneStructure:
    """The :class:`~hydragnn.infer.outputs.CallLayout` of one structure of ``N`` atoms (``counts`` without ``bincount``)."""

    batch: torch.Tensor
    layout: str = "single"
    mask: torch.Tensor | None = None

    @property
    def counts(self) -> torch.Tensor:
        return self.batch.new_full((1,), self.batch.shape[0])


def export_problems(model: HydraModel, info: ModelInfo, graph_inputs: dict[str, float]) -> list[str]:
    """Why ``model`` cannot be exported as a function of an engine's neighbour list (empty: it can).

    ``graph_inputs`` holds the fixed values given for the model's charge / spin inputs.
    """
    problems = []
    if info.energy is None or info.forces is None:
        problems.append(
            "the model is not an interatomic potential with forces (enable_interatomic_potential and "
            "compute_grad_energy); an MD engine needs the energy and its gradient"
        )
    if info.max_neighbours is not None:
        problems.append(
            f"max_neighbours={info.max_neighbours} keeps each atom's nearest neighbours only; an engine passes every "
            "pair within the cutoff, so the exported model would not compute what was trained"
        )
    if model.config.mlip.dynamic_graph:
        problems.append("the model builds its own edges (mlip.dynamic_graph); an exported model takes the engine's")
    if model.config.attention.pe_dim:
        problems.append(
            f"the model reads positional encodings (pe_dim={model.config.attention.pe_dim}), computed from the whole "
            "graph by an eigensolver that cannot be traced"
        )
    for role in info.graph_inputs:
        if role not in graph_inputs:
            problems.append(
                f"the model reads a total {role}, which MD engines do not pass: give its value (--{role} / {role}=) "
                "to fix it in the exported file"
            )
    for role in graph_inputs:
        if role not in info.graph_inputs:
            problems.append(f"a {role} was given, but the model has no {role} input")
    if model.dtype == torch.bfloat16:
        problems.append("the model is bf16; export it in float32 or float64 (dtype=)")
    return problems


def potential_function(
    model: HydraModel, info: ModelInfo, graph_attr: torch.Tensor | None, *, gradients: bool, uncertainty: bool = False
) -> Callable:
    """The exported function (module docstring) of ``model`` in eval mode.

    Args:
        model: the model, on the export device and dtype.
        info: its :func:`~hydragnn.infer.model_info.model_info`.
        graph_attr: ``[1, G]`` fixed graph inputs (charge / spin), or ``None``.
        gradients: compute forces, stress and virial in the graph (AOTInductor, TorchScript);
            ``False`` gives the energy and heads only, differentiable by the caller (metatomic,
            whose engines take forces and stress by autograd).
        uncertainty: ``model`` is a :class:`~hydragnn.models.Committee`; add its spread.
    """

    def structure(positions, numbers, cell, pbc, edge_index, cell_shifts):
        batch = torch.zeros_like(numbers)
        cells = cell.unsqueeze(0)
        source_target = torch.stack([edge_index[1], edge_index[0]])  # the model's (source j, target i)
        pos, strained, displacement = positions, cells, None
        if gradients:
            pos = positions.detach().requires_grad_(True)
            strained_pos, strained_cell, _, displacement = apply_strain(pos, batch, 1, cells, source_target, None)
            strained = cast(torch.Tensor, strained_cell)  # a cell in, a strained cell out
        else:
            strained_pos = positions
        shift = cell_shifts.to(strained.dtype) @ strained[0]
        b = model_batch(
            model,
            pos=strained_pos,
            numbers=numbers,
            batch=batch,
            edge_index=source_target,
            num_graphs=1,
            graph_attr=graph_attr,
            edge_shift=shift,
            cell=strained,
            pbc=pbc.unsqueeze(0),
        )
        energies: list[torch.Tensor] = []
        raw: dict[Any, torch.Tensor]  # keyed by the model's names (info.stress may be None: never read)
        if uncertainty:
            raw, energies = _committee_outputs(cast(Committee, model), b, info)
        else:
            raw = model(b, compute_forces=False, compute_stress=False)
        volume = _volume(cell)
        if gradients:
            if uncertainty:  # each member's derivatives: the spread of the forces, the mean of both
                per_member = [
                    derivatives(e, pos, displacement, create_graph=False, retain_graph=k < len(energies) - 1)
                    for k, e in enumerate(energies)
                ]
                member_forces = torch.stack([f for f, _ in per_member])
                forces = member_forces.mean(0)
                raw[cast(str, info.forces) + SPREAD_SUFFIX] = member_forces.std(0, correction=0)
                de_dstrain = torch.stack([cast(torch.Tensor, d) for _, d in per_member]).mean(0)
            else:
                forces, de_dstrain = derivatives(
                    raw[info.energy], pos, displacement, create_graph=False, retain_graph=False
                )
            raw[info.forces] = forces
            safe = torch.where(volume > 0, volume, torch.ones_like(volume))
            raw[info.stress] = (cast(torch.Tensor, de_dstrain) / safe * (volume > 0).to(safe.dtype)).reshape(1, 9)
        out = convert(raw, OneStructure(batch), info, detach=gradients)
        out["energy"] = out["energy"].reshape(())
        if "energy_uncertainty" in out:
            out["energy_uncertainty"] = out["energy_uncertainty"].reshape(())
        for name in info.graph_outputs:
            out[name] = out[name].reshape(out[name].shape[1:]) if out[name].dim() > 1 else out[name].reshape(())
        if gradients:
            out["stress"] = out["stress"][0]
            out["virial"] = -out["stress"] * volume
        return out

    return structure


def _committee_outputs(
    committee: Committee, b: Any, info: ModelInfo
) -> tuple[dict[str, torch.Tensor], list[torch.Tensor]]:
    """The members' mean of every output (``Committee.forward``'s), the spread of the energy and of
    the per-atom energies under ``"<name>@spread"``, and each member's energy ``[1, 1]``."""
    members = committee.member_outputs(b, compute_forces=False, compute_stress=False)
    raw = {name: torch.stack([m[name] for m in members]).mean(0) for name in members[0]}
    for name in (info.energy, info.atomic_energy):
        if name is not None:
            raw[name + SPREAD_SUFFIX] = torch.stack([m[name] for m in members]).std(0, correction=0)
    return raw, [m[cast(str, info.energy)] for m in members]


def _volume(cell: torch.Tensor) -> torch.Tensor:
    """``|det(cell)|`` written out (AOTInductor has no C shim for ``linalg.det``)."""
    a, b, c = cell[0], cell[1], cell[2]
    cross = torch.stack([b[1] * c[2] - b[2] * c[1], b[2] * c[0] - b[0] * c[2], b[0] * c[1] - b[1] * c[0]])
    return (a * cross).sum().abs()


def fcc_lattice(cutoff: float) -> float:
    """The fcc lattice constant of the trace's and the checks' cells, Å: 3.6, or smaller where the
    model's cutoff would leave its nearest neighbours (a / sqrt(2)) without edges; an edgeless
    example fixes the edge count in the trace (a 2 Å model failed to export)."""
    return min(3.6, 1.2 * cutoff)


def check_species(info: ModelInfo) -> list[int]:
    """Two atomic numbers the model accepts (its trained species when listed)."""
    if info.species:
        chosen = sorted(info.species)
    else:
        top = (info.max_species or 119) - 1
        chosen = [z for z in (29, 79, 6, 8, 1) if z <= top] or [1]
    return (chosen * 2)[:2]


def trace(fn: Callable, example: tuple[torch.Tensor, ...]) -> torch.fx.GraphModule:
    """``make_fx`` of ``fn`` with symbolic atom and edge counts; the weights become constants.

    Raises:
        ExportError: the model does something the tracer cannot follow (named in the message).
    """
    try:
        with torch.enable_grad():
            gm = make_fx(fn, tracing_mode="symbolic", _allow_non_fake_inputs=True)(*example)
    except Exception as exc:  # the tracer raises many types; the reason is in the message
        first = " ".join(str(exc).split())[:400]
        raise ExportError(f"the model could not be traced ({type(exc).__name__}: {first})") from exc
    check_sizes_stay_symbolic(gm)
    return gm


def check_sizes_stay_symbolic(gm: torch.fx.GraphModule) -> None:
    """Refuse a trace that holds only for the example's atom or edge count.

    A Python branch on a size (``if rows * channels <= limit``) makes the tracer record a guard
    on it, or fix it to the example's value, and follow one side; the graph is then wrong for
    other sizes, with nothing at run time to say so. Any guard on the atom or edge count is
    such a branch.

    Raises:
        ExportError: the guards, as the tracer wrote them (``s0``: atoms, ``s1``: edges).
    """
    inputs = [n.meta.get("val") for n in gm.graph.nodes if n.op == "placeholder"]
    sizes = {"atoms": inputs[0].shape[0], "edges": inputs[4].shape[1]}
    problems = [f"the {name} count was fixed" for name, size in sizes.items() if not isinstance(size, torch.SymInt)]
    symbolic = {name: size.node for name, size in sizes.items() if isinstance(size, torch.SymInt)}
    watched: dict[Any, str] = {}
    for name, node in symbolic.items():
        now = node.shape_env.replace(node._expr)  # the symbol, or what the tracer fixed it to
        if now.is_number:
            problems.append(f"the {name} count was fixed to {now} (the example's)")
        watched.update({symbol: name for symbol in node._expr.free_symbols})
    if symbolic:
        for guard in next(iter(symbolic.values())).shape_env.guards:
            if guard.expr.free_symbols & set(watched):
                text = str(guard.expr)
                for symbol, name in watched.items():
                    text = text.replace(str(symbol), name)
                problems.append(f"a branch on a size: {text}")
    if problems:
        raise ExportError(
            "the model's forward depends on the example's sizes, so a traced graph would be wrong for other "
            "structures: " + "; ".join(dict.fromkeys(problems))
        )

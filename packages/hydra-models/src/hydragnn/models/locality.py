"""Energies that are sums of local atomic terms: what a domain-decomposed MD engine needs.

An engine that splits the box over ranks (LAMMPS under ``mpiexec``) gives each rank its own atoms
and a shell of ghost atoms (copies of neighbouring ranks' atoms and periodic images). A model whose
energy is ``sum_i e_i`` with each ``e_i`` depending only on the atoms within a finite distance of
atom ``i``, its :func:`receptive_field`, is then evaluated exactly on every rank: the model runs
on local + ghost atoms without periodicity, the rank's energy is the sum over its local atoms,
and the forces on ghost atoms go back to their owners. :func:`locality_problems` names what breaks
that (attention over every atom, whole-graph positional encodings, per-structure inputs, a
neighbour cap); :func:`atomic_energies` gives the ``e_i`` of a prepared batch, and
:func:`local_energy` the energy of a rank's own atoms from what an engine's pair list holds
(species, pairs, pair vectors), differentiable in the pair vectors: the pair forces of ML-IAP.

The receptive field is ``hops * radius``: ``num_conv_layers`` shells of the encoder, plus the
encoder's :attr:`~hydragnn.models.encoders.base.Encoder.hops_beyond_layers` and the energy head's
own convolutions (the ``conv`` node-head layout). :func:`hydragnn.models.testing.check_locality`
proves it per encoder against a periodic evaluation, with a shell one radius short as the
negative control.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

import hydragnn.data.pyg_import  # noqa: F401 (PyG as HydraGNN needs it)

import torch
from torch_geometric.data import Data

from .errors import ModelError

if TYPE_CHECKING:
    from .committee import Committee
    from .model import HydraModel

__all__ = ["atomic_energies", "local_energy", "locality_problems", "receptive_field"]


def _members(model: HydraModel | Committee) -> list[HydraModel]:
    members = getattr(model, "members", None)
    return list(members) if members is not None else [cast("HydraModel", model)]


def _extra_hops(member: HydraModel) -> int | None:
    """The encoder's declared shells beyond its layers (``None``: unbounded, or not declared)."""
    return getattr(type(member.encoder), "hops_beyond_layers", None)


def locality_problems(model: HydraModel | Committee) -> list[str]:
    """Why ``model``'s energy is not a sum of atomic terms of finite reach (empty: it is)."""
    problems: list[str] = []
    for member in _members(model)[:1]:  # members share one config
        config = member.config
        if member.energy_head is None:
            problems.append("the model is not an interatomic potential (no energy head)")
        if config.attention.engine is not None:
            problems.append(
                f"global attention ({config.attention.engine}) makes every atom's energy depend on every other atom"
            )
        if config.attention.pe_dim:
            problems.append(
                f"positional encodings (pe_dim={config.attention.pe_dim}) are computed from the whole graph"
            )
        if config.mlip.dynamic_graph:
            problems.append("the model builds its own edges (mlip.dynamic_graph) from the whole structure")
        if member.dims.graph_in:
            problems.append("the model reads per-structure inputs (graph_attr: total charge / spin)")
        if config.max_neighbours is not None:
            problems.append(
                f"max_neighbours={config.max_neighbours} keeps each atom's nearest neighbours, which differ where "
                "the structure is cut"
            )
        if _extra_hops(member) is None:
            problems.append(f"the {config.mpnn_type} encoder has no finite receptive field declared")
    return problems


def receptive_field(model: HydraModel | Committee) -> float:
    """The distance (Å) within which atoms determine an atom's energy: ``hops * radius``.

    Raises:
        ModelError: the model is not local (:func:`locality_problems`, named in the message).
    """
    problems = locality_problems(model)
    if problems:
        raise ModelError("the model's energy is not a sum of local atomic terms: " + "; ".join(problems))
    reach = 0.0
    for member in _members(model):
        energy_head = cast(Any, member.energy_head)
        hops = member.config.num_conv_layers + int(_extra_hops(member) or 0)
        hops += len(energy_head.atom.convs)
        reach = max(reach, hops * float(member.config.radius))
    return reach


def atomic_energies(model: HydraModel | Committee, batch: Any, *, members: bool = False) -> torch.Tensor:
    """``[N]`` per-atom energies of a prepared batch, in the model's energy units: each
    structure's sum is the model's energy output (a committee's: the members' mean). With
    ``members``, ``[K, N]``: each member's (``K = 1`` for a single model), for their spread.

    Differentiable with respect to ``batch.pos`` (give it ``requires_grad`` for forces). The
    batch's own edges are used (``edge_index``, ``edge_shift``); a cut-out cluster passes none
    (no ``cell``).
    """
    terms = []
    for member in _members(model):
        if member.energy_head is None:
            raise ModelError("atomic_energies: the model is not an interatomic potential (no energy head)")
        pos = cast(torch.Tensor, batch.pos).to(member.geometry_dtype)
        node_batch = getattr(batch, "batch", None)
        if node_batch is None:
            node_batch = torch.zeros(pos.shape[0], dtype=torch.long, device=pos.device)
        _, (_, atomic, _) = member._potential(
            batch,
            pos,
            None,
            node_batch,
            getattr(batch, "cell", None),
            batch.edge_index,
            getattr(batch, "edge_shift", None),
        )
        terms.append(atomic.reshape(-1))
    if members:
        return torch.stack(terms)
    return terms[0] if len(terms) == 1 else torch.stack(terms).mean(0)


def local_energy(
    model: HydraModel | Committee,
    species: torch.Tensor,
    edge_index: torch.Tensor,
    edge_vec: torch.Tensor,
    n_local: int,
    *,
    members: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(energy, atomic [N])``: the energy of atoms ``0 .. n_local - 1`` and every atom's energy,
    in the model's energy units, from an engine's pair list; differentiable in ``edge_vec``, so
    ``autograd.grad(energy, edge_vec)`` gives the pair forces ``dE/d r_ij``. With ``members``,
    ``atomic`` is each committee member's ``[K, N]`` (the energy is still their mean's).

    Args:
        species: ``[N]`` atomic numbers of the local atoms (first ``n_local``) and the ghosts.
        edge_index: ``[2, E]`` (source ``j``, target ``i``): every pair within the cutoff, both
            directions, ghost-ghost pairs included (an atom ``hops`` shells from the local ones
            still passes messages inwards).
        edge_vec: ``[E, 3]`` ``r_j - r_i`` (Å), images included.
        n_local: how many leading atoms are the rank's own.

    The encoders of a local model read geometry only through the edge vectors, so the model
    runs with zero positions and the vectors as image shifts (``r_j - r_i = 0 - 0 + shift``).

    Raises:
        ModelError: a model that is not local (:func:`locality_problems`) or whose node input is
            more than the atomic number.
    """
    problems = locality_problems(model)
    if problems:
        raise ModelError("local_energy: the model's energy is not a sum of local atomic terms: " + "; ".join(problems))
    first = _members(model)[0]
    if first.dims.node_in != 1:
        raise ModelError(
            f"local_energy: the model reads {first.dims.node_in} node inputs; it takes the atomic number only"
        )
    n = int(species.shape[0])
    geometry = edge_vec.dtype
    batch = Data(
        x=species.reshape(n, 1).to(first.dtype),
        pos=torch.zeros(n, 3, dtype=geometry, device=edge_vec.device),
        edge_index=edge_index,
        edge_shift=edge_vec,
        batch=torch.zeros(n, dtype=torch.long, device=edge_vec.device),
    )
    atomic = atomic_energies(model, batch, members=members)
    mean = atomic.mean(0) if members else atomic
    return mean[:n_local].sum(), atomic

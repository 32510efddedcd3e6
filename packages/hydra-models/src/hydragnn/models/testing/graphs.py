"""Test data for hydra-models: tiny EMT Cu-Au structures and a brute-force neighbor list.

Everything is deterministic and cached per process. Edges come from :func:`brute_force_edges`
(an O(N^2 * images) reference implementation) so the model tests do not depend on
``hydragnn.data.neighbors``.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, cast

import hydragnn.data.pyg_import  # noqa: F401 (PyG as HydraGNN needs it)

import numpy as np
import torch
from ase import Atoms
from ase.build import bulk
from ase.calculators.emt import EMT
from ase.calculators.singlepoint import SinglePointCalculator
from torch_geometric.data import Batch, Data

from hydragnn.data import Schema
from hydragnn.data.emt import CUAU_VARIABLES
from hydragnn.data.io.ase_io import atoms_to_sample
from hydragnn.data.neighbors import brute_force_radius_graph
from hydragnn.data.prepare import prepare

VARIABLES = {
    "inputs": CUAU_VARIABLES["inputs"],
    "outputs": [
        {"name": "energy", "level": "graph", "dim": 1},
        {"name": "gap", "level": "graph", "dim": 2},
        {"name": "atomic_energy", "level": "node", "dim": 1},
        {"name": "forces", "level": "node", "dim": 3},
        {"name": "charge", "level": "node", "dim": 1},
        {"name": "stress", "level": "graph", "dim": 6},
    ],
}
"""An MLIP schema with an extra graph output (``gap``) and node output (``charge``)."""
SCHEMA = Schema.from_dict(VARIABLES)
CLUSTER_SCHEMA = Schema.from_dict(
    {"inputs": VARIABLES["inputs"], "outputs": [v for v in VARIABLES["outputs"] if v["name"] != "stress"]}
)


def brute_force_edges(
    pos: torch.Tensor, cutoff: float, cell: torch.Tensor | None = None, pbc: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """All pairs closer than ``cutoff`` over periodic images, from hydra-data's brute-force reference.

    Args:
        pos: ``[N, 3]``; cell: ``[3, 3]`` rows (or ``[1, 3, 3]``); pbc: ``[3]`` bool.

    Returns:
        ``edge_index [2, E]`` (row 0 source j, row 1 target i) and Cartesian ``edge_shift [E, 3]``.
    """
    if cell is not None:
        cell = cell.detach().reshape(3, 3)
        pbc = torch.ones(3, dtype=torch.bool) if pbc is None else torch.as_tensor(pbc).reshape(3)
    return brute_force_radius_graph(pos.detach(), cutoff, cell=cell, pbc=pbc)


def with_edges(data: Data, cutoff: float) -> Data:
    """A copy of ``data`` with brute-force ``edge_index`` / ``edge_shift``."""
    out = data.clone()
    cell = getattr(data, "cell", None)
    pos = cast(torch.Tensor, data.pos)  # a sample with positions
    out.edge_index, out.edge_shift = brute_force_edges(pos, cutoff, cell, getattr(data, "pbc", None))
    return out


def _label(atoms: Atoms) -> Data:
    """Run EMT, attach synthetic ``gap``/``charge`` targets, return a raw sample (float32)."""
    atoms.calc = EMT()
    atoms.get_potential_energy()
    keys = ("energy", "energies", "forces") + (("stress",) if atoms.pbc.any() else ())
    atoms.calc = SinglePointCalculator(atoms, **{k: atoms.calc.results[k] for k in keys})
    sample = atoms_to_sample(atoms, dtype=torch.float32)
    z = sample.atomic_number.to(torch.float32)
    sample.gap = torch.tensor([[float((z == 79).float().mean()), float(len(atoms))]])
    sample.charge = (z - z.mean()) / 50.0
    return sample


@functools.cache
def periodic_atoms(count: int = 12, seed: int = 0) -> tuple[Atoms, ...]:
    """``count`` rattled, strained fcc Cu-Au cells of 4 or 8 atoms (periodic, unlabelled)."""
    rng = np.random.default_rng(seed)
    out = []
    for index in range(count):
        frac = (0.0, 0.25, 0.5, 0.75, 1.0)[index % 5]
        atoms = bulk("Cu", "fcc", a=3.59 * (1 - frac) + 4.056 * frac, cubic=True).repeat((1 + index % 2, 1, 1))
        numbers = np.full(len(atoms), 29)
        numbers[rng.permutation(len(atoms))[: int(round(frac * len(atoms)))]] = 79
        atoms.numbers = numbers
        eps = rng.uniform(-0.02, 0.02, (3, 3))
        atoms.set_cell(atoms.cell.array @ (np.eye(3) + 0.5 * (eps + eps.T)), scale_atoms=True)
        atoms.positions += rng.normal(0.0, 0.05, (len(atoms), 3))
        out.append(atoms)
    return tuple(out)


@functools.cache
def periodic_samples(cutoff: float, count: int = 12) -> tuple[Data, ...]:
    """Prepared periodic samples (schema :data:`SCHEMA`) with edges within ``cutoff``.

    Built in float32 whatever the caller's default dtype: the result is cached for every later caller.
    """
    with default_dtype(torch.float32):
        return tuple(
            with_edges(prepare(_label(a.copy()), SCHEMA, index=i), cutoff) for i, a in enumerate(periodic_atoms(count))
        )


@functools.cache
def lattice_samples(cutoff: float, count: int = 3) -> tuple[Data, ...]:
    """Prepared ideal fcc Cu-Au cells of 8 atoms (schema :data:`SCHEMA`, periodic, not rattled:
    edge lengths repeat, as in alloy data), species drawn per cell, in float32 (cached)."""
    rng = np.random.default_rng(2)
    out = []
    for index in range(count):
        atoms = bulk("Cu", "fcc", a=3.7, cubic=True).repeat((2, 1, 1))
        atoms.numbers = rng.choice([29, 79], size=len(atoms))
        with default_dtype(torch.float32):
            out.append(with_edges(prepare(_label(atoms), SCHEMA, index=index), cutoff))
    return tuple(out)


@functools.cache
def cluster_samples(cutoff: float, count: int = 3) -> tuple[Data, ...]:
    """Prepared non-periodic Cu-Au clusters of 5-7 atoms (schema :data:`CLUSTER_SCHEMA`), in float32
    whatever the caller's default dtype (the result is cached)."""
    rng = np.random.default_rng(1)
    out = []
    for index in range(count):
        atoms = bulk("Cu", "fcc", a=3.7, cubic=True).repeat((2, 2, 1))[: 5 + index]
        atoms.numbers = rng.choice([29, 79], size=len(atoms))
        atoms.pbc = False
        atoms.cell = np.zeros((3, 3))
        atoms.positions += rng.normal(0.0, 0.05, (len(atoms), 3))
        with default_dtype(torch.float32):
            out.append(with_edges(prepare(_label(atoms), CLUSTER_SCHEMA, index=index), cutoff))
    return tuple(out)


def supercell_sample(cutoff: float, repeat: tuple[int, int, int] = (2, 1, 1), index: int = 0) -> tuple[Data, Data]:
    """A periodic sample and the same crystal as a ``repeat`` supercell (both with edges)."""
    atoms = periodic_atoms()[index]
    small = with_edges(prepare(_label(atoms.copy()), SCHEMA), cutoff)
    big = with_edges(prepare(_label(atoms.repeat(repeat)), SCHEMA), cutoff)
    return small, big


def collate(samples: Iterable[Data]) -> Data:
    """``Batch.from_data_list`` of the samples (a ``Batch``: typed as the ``Data`` it is at run time,
    which PyG's ``DynamicInheritance`` hides from a type checker)."""
    return cast(Data, Batch.from_data_list(list(samples)))


def to_dtype(batch: Data, dtype: torch.dtype) -> Data:
    """A copy with every floating tensor in ``dtype``."""
    out = batch.clone()
    for key, value in cast(Iterable[tuple[str, Any]], out):  # (key, value) pairs; PyG types __iter__ loosely
        if isinstance(value, torch.Tensor) and value.is_floating_point():
            out[key] = value.to(dtype)
    return out


@contextlib.contextmanager
def default_dtype(dtype: torch.dtype) -> Iterator[None]:
    """Temporarily change torch's default dtype (restored even on failure)."""
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(old)


def assert_outputs_close(
    a: Mapping[str, torch.Tensor],
    b: Mapping[str, torch.Tensor],
    rtol: float = 1e-4,
    atol: float = 1e-5,
    keys: Iterable[str] | None = None,
) -> None:
    for key in keys or sorted(a):
        torch.testing.assert_close(a[key], b[key], rtol=rtol, atol=atol, msg=lambda m, k=key: f"output {k!r}: {m}")


def random_rotation(seed: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """A proper rotation ``[3, 3]`` (det +1) from a seeded QR."""
    g = torch.Generator().manual_seed(seed)
    q, r = torch.linalg.qr(torch.randn(3, 3, generator=g, dtype=torch.float64))
    q = q * torch.sign(torch.diagonal(r))
    if torch.det(q) < 0:
        q[:, 0] = -q[:, 0]
    return q.to(dtype)


def voigt_to_matrix(v: torch.Tensor) -> torch.Tensor:
    """``[B, 6]`` Voigt (xx, yy, zz, yz, xz, xy) -> ``[B, 3, 3]``."""
    xx, yy, zz, yz, xz, xy = v.unbind(-1)
    return torch.stack(
        [torch.stack([xx, xy, xz], -1), torch.stack([xy, yy, yz], -1), torch.stack([xz, yz, zz], -1)], -2
    )

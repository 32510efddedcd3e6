"""Synthetic binary-alloy structures in the LSMS raw format, for tests and demonstrations.

Not physics: plausible numbers in the real layout (:func:`hydragnn.data.named.lsms.format_lsms`), made
deterministically from a seed, so the whole named-data-set path (archive, download, parsing,
preparation, training) can be exercised without the published data. A structure is a body-centred
tetragonal supercell (``repeat`` conventional cells of two sites, 32 atoms by default) with the
second element on a random fraction of the sites, positions rattled; the total energy is a sum
of per-element values (Rydberg, of the size LSMS all-electron totals have) plus a mixing term and
noise; each atom's electronic charge and magnetic moment depend on the number of unlike nearest
neighbours, so a model has something local to learn.
"""

from __future__ import annotations

from typing import cast

import numpy as np

from .lsms import format_lsms

__all__ = ["synthetic_alloy"]

_ENERGY = {14: -578.7, 26: -2545.6, 29: -3304.4, 78: -37022.4, 79: -38111.2}
"""Per-element total energies (Rydberg), of the right size for all-electron LSMS totals."""
_MOMENT = {26: 2.9, 78: 0.35, 14: -0.05, 29: 0.0, 79: 0.0}


def synthetic_alloy(
    n_structures: int,
    seed: int = 0,
    elements: tuple[int, int] = (26, 78),
    repeat: tuple[int, int, int] = (2, 2, 4),
    a: float = 5.45,
    c: float = 7.15,
) -> list[tuple[str, str]]:
    """``[(file name, LSMS text), ...]``: ``out_0``, ``out_1``, ... as upstream names its files.

    Args:
        n_structures: how many structures.
        seed: the random seed (the same seed gives the same text).
        elements: the two atomic numbers.
        repeat: conventional cells along a, b, c (two sites each: ``2 * prod(repeat)`` atoms).
        a, c: the tetragonal lattice constants (Bohr).
    """
    rng = np.random.default_rng(seed)
    cells = np.array([(i, j, k) for i in range(repeat[0]) for j in range(repeat[1]) for k in range(repeat[2])], float)
    frac = np.concatenate([cells, cells + 0.5])
    scale = np.array([a, a, c])
    sites = frac * scale
    n = len(sites)
    box = np.array(repeat, float) * scale
    diff = sites[:, None, :] - sites[None, :, :]
    diff -= box * np.round(diff / box)
    near = (np.linalg.norm(diff, axis=2) < 0.95 * np.sqrt(2 * (a / 2) ** 2 + (c / 2) ** 2)) & ~np.eye(n, dtype=bool)
    out = []
    for k in range(n_structures):
        share = ((5 * k) % (n + 1)) / n  # spread over the composition range, pure ends included
        numbers = np.full(n, elements[0])
        numbers[rng.permutation(n)[: int(round(share * n))]] = elements[1]
        unlike = (near & (numbers[:, None] != numbers[None, :])).sum(1) / np.maximum(near.sum(1), 1)
        charge = numbers + np.where(numbers == elements[0], -0.12, 0.12) * unlike + rng.normal(0, 0.005, n)
        moment = np.array([_MOMENT.get(int(z), 0.0) for z in numbers]) * (1 + 0.1 * unlike) + rng.normal(0, 0.01, n)
        x = share if 0 < share < 1 else 0.0
        energy = (
            sum(_ENERGY.get(int(z), cast(float, -100.0 * z)) for z in numbers)
            - 0.02 * x * (1 - x) * n
            + rng.normal(0, 1e-3)
        )
        pos = sites + rng.normal(0, 0.02, sites.shape)
        out.append((f"out_{k}", format_lsms(energy, numbers.tolist(), pos.tolist(), charge.tolist(), moment.tolist())))
    return out

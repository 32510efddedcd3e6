"""Splitting a data set into train / validation / test parts: shuffled, or stratified by
composition (``Dataset.compositional_stratified_splitting``)."""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import hydragnn.data.pyg_import  # noqa: F401 (PyG as HydraGNN needs it)

import torch
from torch_geometric.data import Data

from hydragnn.data import DataError

__all__ = ["composition", "split_indices"]


def split_indices(
    n: int, fractions: Sequence[float], seed: int, categories: Sequence[Hashable] | None = None
) -> tuple[list[int], list[int], list[int]]:
    """A deterministic shuffled split of ``range(n)`` into train / val / test by fractions.

    The validation and test parts get ``round(fraction * n)`` samples (at least one where the
    fraction is not 0). With ``categories`` (one per sample: ``Dataset.compositional_stratified_splitting``
    passes :func:`composition`), the split is stratified: each category is shuffled on its own and
    contributes to each part in proportion to its size, the parts' sizes kept by giving the
    leftover seats to the largest remainders (Hamilton's method); no sample is duplicated (upstream
    HydraGNN copies a category's only sample into several parts), so a category of one sample
    lands in one part, the training part unless a seat is left there for it.
    """
    n_val = int(round(fractions[1] * n))
    n_test = int(round(fractions[2] * n))
    if fractions[1] > 0:
        n_val = max(n_val, 1)
    if fractions[2] > 0:
        n_test = max(n_test, 1)
    n_train = n - n_val - n_test
    if n_train < 1:
        raise ValueError(f"Dataset.split: {n} samples leave no training sample for fractions {list(fractions)}")
    gen = torch.Generator().manual_seed(seed)
    if categories is None:
        perm = torch.randperm(n, generator=gen).tolist()
        return perm[:n_train], perm[n_train : n_train + n_val], perm[n_train + n_val :]
    groups: dict[Hashable, list[int]] = {}
    for i, category in enumerate(categories):
        groups.setdefault(category, []).append(i)
    members = [groups[key] for key in sorted(groups, key=repr)]
    members = [[group[j] for j in torch.randperm(len(group), generator=gen).tolist()] for group in members]
    val_seats = _apportion([len(g) for g in members], n_val)
    test_seats = _apportion([len(g) - v for g, v in zip(members, val_seats, strict=True)], n_test)
    parts: tuple[list[int], list[int], list[int]] = ([], [], [])
    for group, val, test in zip(members, val_seats, test_seats, strict=True):
        parts[1].extend(group[:val])
        parts[2].extend(group[val : val + test])
        parts[0].extend(group[val + test :])
    return parts


def _apportion(sizes: Sequence[int], total: int) -> list[int]:
    """``total`` (at most ``sum(sizes)``) seats over groups of ``sizes`` in proportion (Hamilton's
    largest remainders; ties to the larger, then the earlier group): never more than a group's size."""
    n = sum(sizes)
    quotas = [total * size / n for size in sizes]
    seats = [int(q) for q in quotas]
    order = sorted(range(len(sizes)), key=lambda g: (-(quotas[g] - seats[g]), -sizes[g], g))
    for g in order[: total - sum(seats)]:
        seats[g] += 1
    return [min(s, size) for s, size in zip(seats, sizes, strict=True)]


def composition(sample: Data, index: int) -> tuple[tuple[int, int], ...]:
    """A sample's composition, ``((Z, count), ...)`` sorted by Z, from its ``atomic_number [N, 1]``.

    Raises:
        DataError: the sample has no ``atomic_number``.
    """
    numbers = getattr(sample, "atomic_number", None)
    if numbers is None:
        raise DataError(
            f"Dataset.compositional_stratified_splitting: sample {index} has no atomic_number; the split by "
            "composition needs the atoms' species (atomistic data)"
        )
    values, counts = torch.unique(numbers.reshape(-1), return_counts=True)
    return tuple(zip(values.tolist(), counts.tolist(), strict=True))

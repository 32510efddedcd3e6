"""The LSMS raw format: one structure per text file, read into a sample of the project's schema.

The format, as upstream HydraGNN reads it (``preprocess/lsms_raw_dataset_loader.py``,
``examples/lsms/lsms_preprocess.py``)::

    E  [further graph values]                       line 1: total energy (Rydberg) first
    Z  k  x  y  z  q  m  [further columns]          one line per atom
    ...

Column 1 is not read; positions stay in the file's unit (LSMS: atomic units). Blank lines are
ignored; anything that does not parse, a non-finite value or a ``Z`` outside 1..118 is an error
naming the file and the line.

:func:`parse_lsms` builds (``N`` atoms, float64 unless ``dtype`` says otherwise):

=================================  ==========  =====================================================
``atomic_number``                  ``[N, 1]``  int64, column 0
``num_of_protons``                 ``[N, 1]``  column 0 (upstream's input feature)
``pos``                            ``[N, 3]``  columns 2-4
``electronic_charge``              ``[N, 1]``  column 5
``charge_density``                 ``[N, 1]``  column 5 minus column 0 (upstream's charge transfer)
``magnetic_moment``                ``[N, 1]``  column 6
``free_energy``                    ``[1, 1]``  line 1, column 0 (total, Rydberg)
``free_energy_scaled_num_nodes``   ``[1, 1]``  ``free_energy / N`` (upstream's ``lsms.json`` target)
``free_energy_per_atom``           ``[1, 1]``  the same value, under upstream's newer name
=================================  ==========  =====================================================

No cell (the files carry none). :func:`iter_lsms` reads every file of an archive or folder
(:func:`hydragnn.data.io.archives.iter_files`: bounded, no extraction, links and escaping paths
refused), skipping documentation (:data:`SKIPPED_SUFFIXES`, ``README*``, ``LICENSE*``).
"""

from __future__ import annotations

import math
import os
from collections.abc import Collection, Iterator, Sequence
from pathlib import PurePosixPath

import hydragnn.data.pyg_import  # noqa: F401 (PyG as HydraGNN needs it)

import torch
from torch_geometric.data import Data

from ..errors import DataError, clip
from ..io.archives import DEFAULT_LIMITS, Limits, iter_files
from .datasets import LSMS_VARIABLES

__all__ = [
    "CHARGE_COLUMN",
    "LSMS_VARIABLES",
    "MIN_COLUMNS",
    "MOMENT_COLUMN",
    "SKIPPED_SUFFIXES",
    "format_lsms",
    "iter_lsms",
    "parse_lsms",
]

Z_COLUMN, POS_COLUMNS, CHARGE_COLUMN, MOMENT_COLUMN = 0, (2, 3, 4), 5, 6
MIN_COLUMNS = 7
"""Columns every atom line needs (0..6)."""
MAX_ATOMS = 1_000_000
"""Most atom lines one file may hold."""
SKIPPED_SUFFIXES = (".md", ".rst", ".pdf", ".json", ".yaml", ".yml", ".py", ".sh", ".png", ".jpg", ".ipynb", ".html")
"""Files in an archive that are documentation or scripts, not structures."""


def _number(token: str, where: str, column: int) -> float:
    try:
        value = float(token)
    except ValueError:
        raise DataError(f"{where}: column {column}: expected a number, found {clip(token, 40)!r}") from None
    if not math.isfinite(value):
        raise DataError(f"{where}: column {column}: expected a finite number, found {token!r}")
    return value


def _text(content: str | bytes, where: str) -> str:
    if isinstance(content, str):
        return content
    try:
        return content.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DataError(f"{where}: not LSMS text (not UTF-8 at byte {exc.start})") from None


def parse_lsms(
    content: str | bytes,
    where: str,
    *,
    n_atoms: int | None = None,
    elements: Collection[int] | None = None,
    dtype: torch.dtype = torch.float64,
) -> Data:
    """One LSMS file as a sample (see the module docstring for the columns and the attributes).

    Args:
        content: the file's text (bytes are decoded as UTF-8).
        where: how errors name the file (``archive.tar.gz: output_files/out_12``).
        n_atoms: the atom count every structure must have (``None``: any).
        elements: the atomic numbers a structure may hold (``None``: any).
        dtype: the floating dtype of the tensors.

    Returns:
        A ``Data`` with the attributes of the module docstring (N atoms).

    Raises:
        DataError: naming ``where``, the line and the column: no energy line, no atom line, a line
            with fewer than :data:`MIN_COLUMNS` values, a value that is not a finite number, an
            atomic number outside 1..118 or not in ``elements``, a count other than ``n_atoms``.
    """
    text = _text(content, where)
    rows = [(k, line.split()) for k, line in enumerate(text.splitlines(), 1) if line.strip()]
    if not rows:
        raise DataError(f"{where}: empty; an LSMS file holds the energy line, then one line per atom")
    first_line, head = rows[0]
    energy = _number(head[0], f"{where}: line {first_line}", 0)
    atoms = rows[1:]
    if not atoms:
        raise DataError(f"{where}: no atom line after the energy line")
    if len(atoms) > MAX_ATOMS:
        raise DataError(f"{where}: {len(atoms)} atom lines, more than {MAX_ATOMS}")
    if n_atoms is not None and len(atoms) != n_atoms:
        raise DataError(f"{where}: {len(atoms)} atoms, expected {n_atoms} in every structure of this data set")
    allowed = set(elements) if elements is not None else None
    z, pos, charge, moment = [], [], [], []
    for k, cols in atoms:
        at = f"{where}: line {k}"
        if len(cols) < MIN_COLUMNS:
            raise DataError(
                f"{at}: {len(cols)} values, expected at least {MIN_COLUMNS} (Z, index, x, y, z, charge, magnetic moment)"
            )
        number = _number(cols[Z_COLUMN], at, Z_COLUMN)
        if number != int(number) or not 1 <= number <= 118:
            raise DataError(f"{at}: column 0: expected an atomic number 1..118, found {cols[Z_COLUMN]!r}")
        if allowed is not None and int(number) not in allowed:
            raise DataError(f"{at}: atomic number {int(number)}, expected one of {sorted(allowed)} in this data set")
        z.append(int(number))
        pos.append([_number(cols[c], at, c) for c in POS_COLUMNS])
        charge.append(_number(cols[CHARGE_COLUMN], at, CHARGE_COLUMN))
        moment.append(_number(cols[MOMENT_COLUMN], at, MOMENT_COLUMN))
    n = len(z)
    numbers = torch.tensor(z, dtype=torch.long).reshape(n, 1)
    protons = numbers.to(dtype)
    electrons = torch.tensor(charge, dtype=dtype).reshape(n, 1)
    total = torch.tensor([[energy]], dtype=dtype)
    return Data(
        atomic_number=numbers,
        num_of_protons=protons,
        pos=torch.tensor(pos, dtype=dtype).reshape(n, 3),
        electronic_charge=electrons,
        charge_density=electrons - protons,
        magnetic_moment=torch.tensor(moment, dtype=dtype).reshape(n, 1),
        free_energy=total,
        free_energy_scaled_num_nodes=total / n,
        free_energy_per_atom=total / n,
    )


def format_lsms(
    energy: float,
    numbers: Sequence[int],
    positions: Sequence[Sequence[float]],
    charges: Sequence[float],
    moments: Sequence[float],
) -> str:
    """One structure as LSMS text (what :func:`parse_lsms` reads back): the energy line, then per
    atom ``Z index x y z charge moment``, values with 10 significant digits.

    Args:
        energy: the total energy (Rydberg).
        numbers: ``N`` atomic numbers.
        positions: ``(N, 3)`` positions.
        charges: ``N`` electronic charges (column 5; the charge density is this minus ``Z``).
        moments: ``N`` magnetic moments (column 6).
    """
    n = len(numbers)
    if not (len(positions) == len(charges) == len(moments) == n):
        raise DataError(
            f"format_lsms: expected N={n} positions, charges and moments, found {len(positions)}, {len(charges)}, {len(moments)}"
        )
    lines = [f"{energy:.10g}"]
    for k, (z, (x, y, zz), q, m) in enumerate(zip(numbers, positions, charges, moments, strict=True)):
        lines.append(f"{int(z)}\t{k}\t{x:.10g}\t{y:.10g}\t{zz:.10g}\t{q:.10g}\t{m:.10g}")
    return "\n".join(lines) + "\n"


def _structure_file(name: str) -> bool:
    leaf = PurePosixPath(name).name
    return not (leaf.lower().endswith(SKIPPED_SUFFIXES) or leaf.upper().startswith(("README", "LICENSE")))


def iter_lsms(
    source: str | os.PathLike[str],
    *,
    n_atoms: int | None = None,
    elements: Collection[int] | None = None,
    dtype: torch.dtype = torch.float64,
    limits: Limits = DEFAULT_LIMITS,
) -> Iterator[tuple[str, Data]]:
    """``(where, sample)`` for every LSMS file of a tar / zip archive or a folder.

    Args:
        source: the archive or folder.
        n_atoms, elements, dtype: as for :func:`parse_lsms`, checked on every file.
        limits: the archive bounds (:class:`hydragnn.data.io.archives.Limits`).

    Yields:
        ``(where, sample)`` in the archive's order (a folder's sorted by path); ``where`` is
        ``"<source>: <member>"``.

    Raises:
        ArchiveError: see :func:`hydragnn.data.io.archives.iter_files`.
        DataError: a file that is not LSMS (see :func:`parse_lsms`), or no LSMS file at all.
    """
    count = 0
    for name, content in iter_files(source, limits):
        if not _structure_file(name):
            continue
        where = f"{os.fspath(source)}: {name}"
        yield where, parse_lsms(content, where, n_atoms=n_atoms, elements=elements, dtype=dtype)
        count += 1
    if count == 0:
        raise DataError(f"{os.fspath(source)}: no LSMS structure file in it")

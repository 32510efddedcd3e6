"""Samples from any file ASE reads: extxyz, xyz, traj, ASE db, VASP OUTCAR / vasprun, ...

An :class:`AseSource` names one file, the frames to take (``index`` slicing as in
``ase.io.read``, ``config_types`` filters) and which file label fills which output
(``energy_key``, ``forces_key``, ``stress_key`` and ``extra_keys`` for any other head).

Labels are searched, in this order, in the calculator results (never a new calculation; results
of a calculator whose geometry no longer matches are ignored), ``atoms.info`` and
``atoms.arrays``; for an ASE database also in each row's key-value pairs and ``data``. A label an
output needs but a frame lacks is a :class:`~hydragnn.data.SchemaError` naming the file, the
frame and the labels that frame has.

Frames whose config type (``atoms.info[config_type_key]``) is ``IsolatedAtom`` (MACE's
convention) are never samples: they carry the energies of free atoms, returned apart as
reference energies (see :mod:`hydragnn.data.atomic_references`).

The schema is inferred when none is given: inputs ``atomic_number`` (node, 1) and ``pos``
(position), outputs ``energy`` (graph, 1), ``forces`` (node, 3), ``stress`` (graph, 6, Voigt
``xx, yy, zz, yz, xz, xy`` in ASE's sign convention) and every extra key, each present when the
first sample frame carries its label. A key given explicitly must be present; a default key
(``energy``, ``forces``, ``stress``) is optional; ``None`` drops that output.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, cast

import numpy as np
from ase import Atoms

from ..errors import ContainerError, SchemaError, clip
from .ase_io import STRUCTURE_KEYS

if TYPE_CHECKING:
    from ase.db.row import AtomsRow

__all__ = [
    "DEFAULT_CONFIG_TYPE",
    "ISOLATED_ATOM",
    "MLIP_OUTPUTS",
    "AseSource",
    "Frame",
    "iter_frames",
]

ISOLATED_ATOM = "IsolatedAtom"
"""Config type of the frames holding the energy of one free atom."""
DEFAULT_CONFIG_TYPE = "Default"
"""Config type of a frame without one."""
MLIP_OUTPUTS: tuple[str, ...] = ("energy", "forces", "stress")
"""Outputs with a dedicated key option, in schema order."""


@dataclass(frozen=True)
class AseSource:
    """One file ASE reads, the frames to take and the labels to read.

    Attributes:
        path: the file.
        energy_key ["energy"], forces_key ["forces"], stress_key ["stress"]: the file labels of
            the outputs ``energy``, ``forces`` and ``stress``; ``None`` leaves the output out.
        extra_keys: ``(output name, file label)`` pairs for any other head.
        explicit: output names whose key was given by the user (those labels must exist).
        index [":"]: frames to read, as ``ase.io.read``'s ``index`` (``":100"``, ``"::2"``, ``"-5:"``).
        config_types [None: all]: config types to keep (``IsolatedAtom`` frames are always read,
            as reference energies).
        config_type_key ["config_type"]: the ``atoms.info`` key of the config type.
        format [None: from the file]: an ASE format name (``"extxyz"``, ``"vasp-out"``, ...).
    """

    path: Path
    energy_key: str | None = "energy"
    forces_key: str | None = "forces"
    stress_key: str | None = "stress"
    extra_keys: tuple[tuple[str, str], ...] = ()
    explicit: frozenset[str] = frozenset()
    index: str = ":"
    config_types: tuple[str, ...] | None = None
    config_type_key: str = "config_type"
    format: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "path", Path(self.path))
        names = [name for name, _ in self.extra_keys]
        clash = sorted({n for n in names if n in MLIP_OUTPUTS or n in STRUCTURE_KEYS or names.count(n) > 1})
        if clash:
            raise SchemaError(
                f"{self.path}: extra keys {clash} clash with {list(MLIP_OUTPUTS)} (use energy_key / forces_key / "
                f"stress_key), with the structure attributes {list(STRUCTURE_KEYS)}, or with each other"
            )

    def candidates(self) -> list[tuple[str, str]]:
        """``(output name, file label)`` of every output this source may fill, in schema order."""
        mlip = zip(MLIP_OUTPUTS, (self.energy_key, self.forces_key, self.stress_key), strict=True)
        return [(name, key) for name, key in mlip if key is not None] + list(self.extra_keys)

    def key_of(self, name: str) -> str | None:
        """The file label of output ``name`` (the name itself when no key maps it)."""
        if name in MLIP_OUTPUTS:
            return {"energy": self.energy_key, "forces": self.forces_key, "stress": self.stress_key}[name]
        return dict(self.extra_keys).get(name, name)

    def fingerprint(self) -> dict[str, Any]:
        """What decides the samples besides the file's bytes (JSON)."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "path"}
        out["extra_keys"] = [list(p) for p in self.extra_keys]
        out["explicit"] = sorted(self.explicit)
        out["config_types"] = list(self.config_types) if self.config_types is not None else None
        return out


# ----------------------------------------------------------------------------- frames
@dataclass(frozen=True)
class Frame:
    """One frame read from a source: ``number`` is its position in the file (``None`` when the
    selection counts from the end), ``where`` names it in messages, ``config_type`` its type."""

    atoms: Atoms
    number: int | None
    where: str
    config_type: str

    @property
    def isolated(self) -> bool:
        return self.config_type == ISOLATED_ATOM


class _RowDatabase(Protocol):
    """What :func:`_db_frames` uses of the database ``ase.db.connect`` opens (a context manager)."""

    def __enter__(self) -> _RowDatabase: ...

    def __exit__(self, *exc: object) -> object: ...

    def count(self) -> int: ...

    def select(self, *, offset: int, limit: int) -> Iterator[AtomsRow]: ...


def _selection(index: str) -> int | slice:
    """``index`` parsed as ``ase.io.read`` does: one frame or a slice.

    Raises:
        ValueError: ``index`` is neither an integer nor a slice.
    """
    from ase.utils import string2index

    sel = string2index(index)
    if isinstance(sel, str):
        raise ValueError(f"not an integer or a slice: {sel!r}")
    return sel


def _numbering(index: str) -> tuple[int, int] | None:
    """``(start, step)`` turning a selection position into a file frame number, when known."""
    sel = _selection(index)
    if isinstance(sel, int):
        return (sel, 1) if sel >= 0 else None
    start, step = sel.start or 0, sel.step or 1
    return (start, step) if start >= 0 and step > 0 else None


def _db_frames(path: Path, index: str) -> Iterator[Atoms]:
    """Rows of an ASE database as atoms, key-value pairs in ``info``, ``data`` in arrays / info."""
    import ase.db

    sel = _selection(index)
    with cast(_RowDatabase, ase.db.connect(str(path), serial=True)) as db:
        count = db.count()
        if isinstance(sel, int):
            sel = slice(sel, sel + 1 or None)
        start, stop, step = sel.indices(count)
        if start >= stop:
            return
        for k, row in enumerate(db.select(offset=start, limit=stop - start)):
            if k % step:
                continue
            atoms = row.toatoms()
            atoms.info.update(row.key_value_pairs)
            for key, value in (row.get("data") or {}).items():
                arr = np.asarray(value)
                if arr.ndim and arr.shape[0] == len(atoms):
                    atoms.arrays[key] = arr
                else:
                    atoms.info[key] = value
            yield atoms


def _check_declared_sizes(path: Path, index: str) -> None:
    """Refuse frames whose declared atom count the file cannot hold before ASE reads a line
    per declared atom (:mod:`hydragnn.data.io.xyz_scan`), as far into the file as ASE indexes for
    ``index``; repeated comment-line keys are warned about there."""
    from ase.io.formats import get_compression, open_with_compression

    from .xyz_scan import scan_xyz

    sel = _selection(index)
    stop = sel if isinstance(sel, int) else sel.stop
    last_frame = stop if stop is not None and stop >= 0 else None
    try:
        if get_compression(str(path))[1] is None:
            scan_xyz(path, last_frame=last_frame, size=path.stat().st_size)
        else:
            scan_xyz(path, last_frame=last_frame, opener=lambda p: open_with_compression(str(p), "rb"))
    except ContainerError:
        raise
    except Exception as exc:  # a damaged compressed stream: OSError, EOFError, LZMAError, ...
        raise ContainerError(f"{path}: cannot read it ({type(exc).__name__}: {clip(exc)})") from None


def iter_frames(source: AseSource, skipped: dict[str, int] | None = None) -> Iterator[Frame]:
    """Stream the selected frames of ``source`` (one at a time; the file is never read whole).

    ``config_types`` filtering is applied here (``IsolatedAtom`` frames always pass); frames
    left out are counted by config type in ``skipped`` when given.

    Raises:
        ContainerError: the file is missing, not a format ASE reads, a frame cannot be parsed, or
            an (ext)xyz frame declares more atoms than the file holds (naming the file and the frame).
    """
    import ase.io
    from ase.io.formats import UnknownFileTypeError, filetype, ioformats

    path = source.path
    if not path.is_file():
        raise ContainerError(f"{path}: no such file")
    try:
        fmt = source.format or filetype(str(path))
    except (UnknownFileTypeError, OSError, EOFError, ValueError) as exc:  # EOFError: a truncated .gz
        fmt, why = None, clip(exc)
    else:
        why = f"found {fmt!r}"
    if fmt not in ioformats or not ioformats[fmt].can_read:
        raise ContainerError(
            f"{path}: not a structure file ASE reads ({why}); name its format with the 'format' option "
            "(an ase.io format such as 'extxyz', 'traj', 'db', 'vasp-out', 'vasp-xml')"
        )
    try:
        numbering = _numbering(source.index)
    except ValueError as exc:
        raise ContainerError(f"{path}: invalid index {source.index!r}: {exc}") from None
    if fmt in ("extxyz", "xyz"):
        _check_declared_sizes(path, source.index)
    frames = _db_frames(path, source.index) if fmt == "db" else ase.io.iread(str(path), index=source.index, format=fmt)
    k = 0
    while True:
        number = numbering[0] + k * numbering[1] if numbering is not None else None
        where = f"{path}: frame {number}" if number is not None else f"{path}: frame {k} of index {source.index!r}"
        try:
            atoms = next(frames)
        except StopIteration:
            return
        except Exception as exc:  # ASE's parsers raise anything from ValueError to IndexError
            raise ContainerError(f"{where}: ASE cannot read it ({type(exc).__name__}: {clip(exc)})") from None
        k += 1
        config_type = str(atoms.info.get(source.config_type_key, DEFAULT_CONFIG_TYPE))
        if config_type != ISOLATED_ATOM and source.config_types is not None and config_type not in source.config_types:
            if skipped is not None:
                skipped[config_type] = skipped.get(config_type, 0) + 1
            continue
        yield Frame(atoms=atoms, number=number, where=where, config_type=config_type)

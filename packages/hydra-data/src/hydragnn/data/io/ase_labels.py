"""The labels of a frame ASE read: which outputs a source's labels fill (:func:`resolve_outputs`)
and each frame's structure and labels as checked arrays (:func:`frame_arrays`) or a raw sample
(:func:`labelled_sample`), for :mod:`.ase_source` and the conversion.

Labels are searched in the calculator results (a calculator whose geometry no longer matches is
ignored), ``atoms.info`` and ``atoms.arrays``; known outputs take their level and width from their
name, others from where the label sits and its shape.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import hydragnn.data.pyg_import  # noqa: F401 (PyG as HydraGNN needs it)

import numpy as np
import torch
from ase import Atoms
from ase.data import chemical_symbols
from ase.stress import voigt_6_to_full_3x3_stress
from torch_geometric.data import Data

from ..errors import SchemaError, clip
from ..schema import Level, Schema, Variable
from .ase_io import arrays_sample, stress_voigt, structure_arrays

if TYPE_CHECKING:
    from .ase_source import AseSource

__all__ = ["SCHEMA_INPUTS", "FrameLabels", "frame_arrays", "labelled_sample", "resolve_outputs"]

SCHEMA_INPUTS: tuple[Variable, ...] = (
    Variable(name="atomic_number", level="node", dim=1),
    Variable(name="pos", level="node", dim=3, role="position"),
)
"""The inputs of a schema inferred from a file: atomic numbers and positions."""

_PER_ATOM_RESULTS = frozenset({"forces", "energies", "stresses", "charges", "magmoms"})
_KNOWN_LEVELS: dict[str, tuple[Level, int]] = {"energy": ("graph", 1), "forces": ("node", 3), "stress": ("graph", 6)}


@dataclass(frozen=True)
class FrameLabels:
    """Every label of one frame: ``{name: (where, value)}``, ``where`` in calc / info / arrays."""

    values: Mapping[str, tuple[str, Any]]

    @classmethod
    def of(cls, atoms: Atoms) -> FrameLabels:
        values: dict[str, tuple[str, Any]] = {}
        for key, value in atoms.arrays.items():
            if key not in ("numbers", "positions"):
                values[key] = ("arrays", value)
        for key, value in atoms.info.items():
            values[key] = ("info", value)
        calc = atoms.calc
        results = dict(getattr(calc, "results", None) or {}) if calc is not None else {}
        if results and calc is not None and getattr(calc, "atoms", None) is not None and hasattr(calc, "check_state"):
            if calc.check_state(atoms):
                results = {}
        for key, value in results.items():
            values[key] = ("calc", value)
        return cls(values)

    def describe(self) -> str:
        """``calculator results [...], info [...], arrays [...]`` for error messages."""
        parts = []
        for where, label in (("calc", "calculator results"), ("info", "info keys"), ("arrays", "arrays")):
            names = sorted(k for k, (w, _) in self.values.items() if w == where)
            parts.append(f"{label} {clip(names)}")
        return ", ".join(parts)


def _variable(name: str, where: str, value: Any, natoms: int) -> Variable:
    """The output variable a label implies: known outputs by name, others by where and shape."""
    if name in _KNOWN_LEVELS:
        level, dim = _KNOWN_LEVELS[name]
        return Variable(name=name, level=level, dim=dim)
    arr = np.asarray(value)
    per_atom = where == "arrays" or (where == "calc" and name in _PER_ATOM_RESULTS)
    if per_atom and natoms and arr.size % natoms == 0 and arr.shape[:1] == (natoms,):
        return Variable(name=name, level="node", dim=max(arr.size // natoms, 1))
    return Variable(name=name, level="graph", dim=max(int(arr.size), 1))


def resolve_outputs(
    source: AseSource, atoms: Atoms, schema: Schema | None, where: str
) -> tuple[Schema, tuple[tuple[Variable, str], ...]]:
    """The schema and the ``(output, file label)`` pairs of a source.

    Args:
        source: the source.
        atoms: its first sample frame (outputs are inferred from the labels it carries).
        schema: an explicit schema (it wins; each output is read from its mapped label, or the
            label of its own name), or ``None`` to infer one.
        where: ``"<file>: frame <k>"`` for errors.

    Raises:
        SchemaError: an explicit key missing from the frame, no label at all, or a schema
            output whose key was set to ``None``.
    """
    labels = FrameLabels.of(atoms)
    if schema is not None:
        pairs = []
        for var in schema.outputs:
            key = source.key_of(var.name)
            if key is None:
                raise SchemaError(
                    f"{source.path}: the schema has output {var.name!r} but its file key is null; give its key"
                )
            pairs.append((var, key))
        return schema, tuple(pairs)
    outputs: list[tuple[Variable, str]] = []
    for name, key in source.candidates():
        if key not in labels.values:
            if name in source.explicit:
                raise SchemaError(f"{where}: no label {key!r} for output {name!r}; this frame has {labels.describe()}")
            continue
        place, value = labels.values[key]
        outputs.append((_variable(name, place, value, len(atoms)), key))
    if not outputs:
        looked = ", ".join(f"{name} {key!r}" for name, key in source.candidates())
        raise SchemaError(
            f"{where}: no label to train on (looked for {looked}); this frame has {labels.describe()}. "
            "Map the file's labels with energy_key / forces_key / stress_key (e.g. 'REF_energy')"
        )
    return Schema(inputs=SCHEMA_INPUTS, outputs=tuple(v for v, _ in outputs)), tuple(outputs)


def _label_array(var: Variable, key: str, value: Any, natoms: int, where: str) -> np.ndarray:
    label = f"{where}: label {key!r} (output {var.name!r}, {var.level}, dim {var.dim})"
    try:
        arr = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError):
        raise SchemaError(f"{label}: expected numbers, found {type(value).__name__} {value!r:.80}") from None
    if var.level == "graph":
        if var.dim == 6 and arr.shape == (3, 3):
            arr = stress_voigt(arr)
        elif var.dim == 9 and arr.shape == (6,):
            arr = voigt_6_to_full_3x3_stress(arr)
        if arr.size != var.dim:
            raise SchemaError(f"{label}: expected {var.dim} value(s), found shape {arr.shape}")
        arr = arr.reshape(1, var.dim)
    else:
        if arr.size != natoms * var.dim or (arr.ndim and arr.shape[0] != natoms):
            raise SchemaError(f"{label}: expected shape ({natoms}, {var.dim}) for {natoms} atoms, found {arr.shape}")
        arr = arr.reshape(natoms, var.dim)
    if not np.isfinite(arr).all():
        raise SchemaError(f"{label}: holds non-finite values (NaN or inf)")
    return np.array(arr, dtype=np.float64, copy=True)


def frame_arrays(atoms: Atoms, outputs: Sequence[tuple[Variable, str]], where: str) -> dict[str, np.ndarray]:
    """One frame's structure (:func:`~hydragnn.data.io.ase_io.structure_arrays`) and one float64
    array per output (named by the output, ``(N, dim)`` or ``(1, dim)``), checked.

    Raises:
        SchemaError: a missing label (naming the labels the frame has), a wrong shape,
            non-finite positions or labels, or an atomic number outside 1..118.
    """
    numbers = atoms.numbers
    if len(numbers) and (numbers.min() < 1 or numbers.max() >= len(chemical_symbols)):
        raise SchemaError(
            f"{where}: atomic numbers must be in 1..{len(chemical_symbols) - 1}, found {clip(sorted(set(numbers.tolist())))}"
        )
    if not np.isfinite(atoms.positions).all() or not np.isfinite(atoms.cell.array).all():
        raise SchemaError(f"{where}: positions or cell hold non-finite values")
    arrays = structure_arrays(atoms)
    labels = FrameLabels.of(atoms)
    for var, key in outputs:
        if key not in labels.values:
            raise SchemaError(f"{where}: no label {key!r} for output {var.name!r}; this frame has {labels.describe()}")
        arrays[var.name] = _label_array(var, key, labels.values[key][1], len(atoms), where)
    return arrays


def labelled_sample(
    atoms: Atoms, outputs: Sequence[tuple[Variable, str]], where: str, *, dtype: torch.dtype = torch.float64
) -> Data:
    """One frame as a raw sample: its structure and one tensor per output (named by the output),
    the arrays of :func:`frame_arrays` as tensors (floating ones in ``dtype``).

    Raises:
        SchemaError: as :func:`frame_arrays`.
    """
    return arrays_sample(frame_arrays(atoms, outputs, where), dtype)

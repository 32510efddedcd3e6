"""Score a model on labelled structures: ``hydragnn-evaluate model.hydra data.extxyz``.

The production path, with hydra-infer alone: structures from any file ASE reads (extxyz, traj,
ASE db, VASP, ...; streamed, never read whole) or a list of ``Atoms`` are predicted by a
:class:`~.calculator.HydraCalculator` (what is served), ``batch_size`` structures per call as one
flat ``mol_idx`` batch, and compared with their labels. The errors are those of
:mod:`hydragnn.models.metrics`, the ones ``hydragnn-predict`` (hydra-train) reports, in the same
table: per head MAE, RMSE and count, energy in eV/atom (row ``energy``) and eV (row
``energy_total``), forces in eV/Å over every component, stress in eV/Å³ (Voigt ``xx, yy, zz,
yz, xz, xy``, ASE's sign convention), every other head in its own unit.

Labels are read from each frame's calculator results (a ``SinglePointCalculator``, never a new
calculation), ``atoms.info`` and ``atoms.arrays`` (:class:`hydragnn.data.FrameLabels`), under
the keys the model was trained with (its artifact's training config,
:func:`hydragnn.models.metrics.training_label_keys`; ``energy``, ``forces``, ``stress`` and each
head's own name otherwise) unless the caller names them. The first frame decides which heads
are scored: a head whose label it lacks is left out, unless its key was given explicitly; from
then on every frame must carry every scored label (a :class:`~hydragnn.data.SchemaError` names
the key, the frame and the labels the frame has). ``IsolatedAtom`` frames (reference energies
of free atoms) are skipped, as in training.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np
from ase import Atoms

from .errors import InferenceError

if TYPE_CHECKING:
    from hydragnn.data import Variable
    from hydragnn.models import HydraModel
    from hydragnn.models.metrics import ErrorStats

    from .calculator import HydraCalculator

__all__ = ["PREFIX", "EvaluationReport", "evaluate"]

PREFIX = "hydragnn_"
"""Prefix of the predictions in the written structures: ``info["hydragnn_energy"]`` (eV),
``arrays["hydragnn_forces"]`` (eV/Å), ``info["hydragnn_stress"]`` (Voigt, eV/Å³), other heads
under ``hydragnn_<head>`` (per-atom heads in ``arrays``, per-structure heads in ``info``)."""


@dataclass(frozen=True)
class EvaluationReport:
    """A model's errors on a set of structures.

    Attributes:
        errors: ``{head: {"mae", "rmse", "unit", "count"}}`` (see :mod:`hydragnn.models.metrics`).
        labels: ``{head: file label}`` of every scored head.
        structures: structures scored.
        atoms: atoms in them.
        skipped: ``IsolatedAtom`` frames left out.
        predictions: copies of the structures with the predictions (:data:`PREFIX`), when asked.
    """

    errors: dict[str, dict[str, Any]]
    labels: dict[str, str]
    structures: int
    atoms: int
    skipped: int = 0
    predictions: list[Atoms] | None = field(default=None, repr=False)

    def table(self) -> list[str]:
        """The errors table, as ``hydragnn-predict`` prints it."""
        from hydragnn.models.metrics import format_errors

        return format_errors(self.errors)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (non-finite errors as ``None``); the errors under ``mae`` as in ``hydragnn-predict --json``."""
        from hydragnn.models.metrics import jsonable

        return jsonable(
            {
                "structures": self.structures,
                "atoms": self.atoms,
                "skipped": self.skipped,
                "labels": self.labels,
                "mae": self.errors,
            }
        )


@dataclass(frozen=True)
class _Head:
    """A scored head: its schema variable, its file label and its interatomic-potential role
    (``"energy"``, ``"forces"``, ``"stress"``, the calculator's name for it) or ``None``."""

    var: Variable
    key: str
    role: str | None

    @property
    def result(self) -> str:
        """Its name in the calculator's results."""
        return self.role or self.var.name


def evaluate(
    model: str | os.PathLike | HydraModel | HydraCalculator,
    structures: str | os.PathLike | Atoms | Sequence[Atoms],
    *,
    energy_key: str | None = None,
    forces_key: str | None = None,
    stress_key: str | None = None,
    extra_keys: Sequence[tuple[str, str]] = (),
    index: str | None = None,
    head: str | None = None,
    device: str | None = None,
    batch_size: int = 16,
    keep_predictions: bool = False,
    progress: Callable[[int], object] | None = None,
) -> EvaluationReport:
    """Errors per head of ``model`` on labelled structures (see the module docstring).

    Args:
        model: an artifact path, a ``HydraModel`` or a :class:`~.calculator.HydraCalculator`.
        structures: a file ASE reads, one ``Atoms`` or a sequence of them.
        energy_key, forces_key, stress_key: file labels of the heads ``energy``, ``forces`` and
            ``stress`` (``None``: the training key; a key given must be on the first frame).
        extra_keys: ``(head, label)`` pairs for other heads (default: the training keys, else the
            head's name).
        index: frames to take, as ``ase.io.read``'s index (``":100"``, ``"::2"``, ``"-5:"``);
            ``None``: all.
        head: the energy head of a model trained on several sources (default: the first).
        device: where to run (``"cpu"``, ``"cuda"``, ``"cuda:1"``; default CPU).
        batch_size: structures per calculator call (>= 1).
        keep_predictions: return copies of the structures with the predictions (:data:`PREFIX`).
        progress: called with the number of structures done after each calculator call.

    Returns:
        An :class:`EvaluationReport`.

    Raises:
        InferenceError: bad options, a structure the calculator refuses (naming the frame), no
            label to score, or no structure selected.
        hydragnn.data.DataError: an unreadable file or frame, a missing or malformed label.
        hydragnn.models.ModelError: an unreadable artifact.
    """
    from hydragnn.data import AseSource
    from hydragnn.models.metrics import ErrorStats, head_units, training_label_keys

    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise InferenceError(f"batch_size: expected an integer >= 1, found {batch_size!r}")
    if isinstance(structures, (str, os.PathLike)) and not Path(structures).is_file():
        raise InferenceError(f"{structures}: no such file")
    calc = _calculator(model, head, device)
    given = {"energy_key": energy_key, "forces_key": forces_key, "stress_key": stress_key}
    keys = {**training_label_keys(calc.model), **{k: v for k, v in given.items() if v is not None}}
    explicit = {k.removesuffix("_key") for k, v in given.items() if v is not None} | {n for n, _ in extra_keys}
    if extra_keys:
        keys["extra_keys"] = tuple({**dict(keys.get("extra_keys", ())), **dict(extra_keys)}.items())
    path = Path(structures) if isinstance(structures, (str, os.PathLike)) else Path("<structures>")
    source = AseSource(path, index=index or ":", explicit=frozenset(explicit), **keys)
    skipped: list[int] = [0]
    frames = _frames(source, structures, skipped)
    first = next(frames, None)
    if first is None:
        raise InferenceError(f"{path}: no structure to score (index {source.index!r})")
    heads = _plan(calc, source, *first)
    units = head_units(calc.model)
    stats = ErrorStats(units, totals=[h.var.name for h in heads if units[h.var.name][1]])
    kept: list[Atoms] | None = [] if keep_predictions else None
    done = atoms = 0
    batch: list[tuple[Atoms, str]] = [first]
    for item in frames:
        if len(batch) == batch_size:
            atoms += _score(calc, heads, batch, stats, kept)
            done += len(batch)
            batch = []
            if progress is not None:
                progress(done)
        batch.append(item)
    atoms += _score(calc, heads, batch, stats, kept)
    done += len(batch)
    if progress is not None:
        progress(done)
    return EvaluationReport(
        errors=stats.report(),
        labels={h.var.name: h.key for h in heads},
        structures=done,
        atoms=atoms,
        skipped=skipped[0],
        predictions=kept,
    )


def _calculator(model: Any, head: str | None, device: str | None) -> HydraCalculator:
    """The :class:`HydraCalculator` to score with (one passed in is used as it is)."""
    import torch

    from .calculator import HydraCalculator

    if isinstance(model, HydraCalculator):
        if head is not None or device is not None:
            raise InferenceError("head / device: give them to the HydraCalculator you pass, not to evaluate")
        return model
    if device is not None:
        try:
            dev = torch.device(device)
        except (RuntimeError, TypeError) as exc:
            raise InferenceError(f"device: {device!r} is not a torch device ({exc})") from None
        if dev.type == "cuda" and not torch.cuda.is_available():
            raise InferenceError(f"device: {device!r} asked for, but torch sees no CUDA device")
    return HydraCalculator(model, device=device, head=head)


def _frames(source: Any, structures: Any, skipped: list[int]) -> Iterator[tuple[Atoms, str]]:
    """``(atoms, where)`` of every selected structure but ``IsolatedAtom`` frames (counted in ``skipped[0]``)."""
    from hydragnn.data.io.ase_source import ISOLATED_ATOM, iter_frames

    if isinstance(structures, (str, os.PathLike)):
        items: Iterator[tuple[Atoms, str, str]] = ((f.atoms, f.where, f.config_type) for f in iter_frames(source))
    else:
        from ase.utils import string2index

        listed = [structures] if isinstance(structures, Atoms) else list(structures)
        try:
            sel = string2index(source.index)
        except ValueError as exc:
            raise InferenceError(f"index: {source.index!r} is not an ase.io.read index ({exc})") from None
        numbers = range(len(listed))[cast("int | slice", sel)]  # a key (str) raises TypeError here, as before
        numbers = [numbers] if isinstance(numbers, int) else list(numbers)
        items = ((listed[k], f"structure {k}", str(listed[k].info.get(source.config_type_key, ""))) for k in numbers)
    for atoms, where, config_type in items:
        if not isinstance(atoms, Atoms):
            raise InferenceError(f"{where}: expected an ase.Atoms, found {type(atoms).__name__}")
        if config_type == ISOLATED_ATOM:
            skipped[0] += 1
            continue
        yield atoms, where


def _plan(calc: HydraCalculator, source: Any, atoms: Atoms, where: str) -> list[_Head]:
    """The heads to score: those whose label the first frame carries, or whose key was given."""
    from hydragnn.data.io.ase_labels import FrameLabels

    info = calc.info
    roles = {
        name: role
        for name, role in ((info.energy, "energy"), (info.forces, "forces"), (info.stress, "stress"))
        if name is not None
    }
    served = {*info.node_outputs, *info.graph_outputs, info.atomic_energy}
    present = FrameLabels.of(atoms)
    heads, looked = [], []
    for var in calc.model.schema.outputs:
        key = source.key_of(var.name)
        if key is None or (var.name not in roles and var.name not in served):
            continue  # a head left out of training, or one the calculator does not return (edge heads)
        looked.append(f"{var.name} {key!r}")
        if key in present.values or var.name in source.explicit:
            heads.append(_Head(var, key, roles.get(var.name)))
    if not heads:
        raise InferenceError(
            f"{where}: no label to score (looked for {', '.join(looked) or 'nothing: the model has no head'}); "
            f"this frame has {present.describe()}. Name the file's labels with energy_key / forces_key / "
            "stress_key / extra_keys (hydragnn-evaluate --energy-key REF_energy --key HEAD=LABEL)"
        )
    return heads


def _score(
    calc: HydraCalculator, heads: list[_Head], batch: list[tuple[Atoms, str]], stats: ErrorStats, kept: list | None
) -> int:
    """Predict ``batch`` in one calculator call, add its errors to ``stats``; returns its atoms."""
    import torch

    from hydragnn.data.io.ase_labels import labelled_sample

    outputs = [(h.var, h.key) for h in heads]
    labels = [labelled_sample(atoms, outputs, where) for atoms, where in batch]  # SchemaError names the frame
    want_stress = any(h.role == "stress" for h in heads)
    if want_stress:
        for atoms, where in batch:
            if not atoms.pbc.any():
                raise InferenceError(f"{where}: a stress label on a structure without a periodic cell")
    out = _predict(calc, batch, forces=any(h.role == "forces" for h in heads), stress=want_stress)
    natoms = torch.tensor([len(atoms) for atoms, _ in batch])
    trues, preds = {}, {}
    for h in heads:
        trues[h.var.name] = torch.cat([s[h.var.name] for s in labels])
        preds[h.var.name] = _as_rows(out[h.result], h)
    stats.add(trues, preds, natoms)
    if kept is not None:
        kept.extend(_with_predictions(batch, out, calc.info))
    return int(natoms.sum())


def _predict(calc: HydraCalculator, batch: list[tuple[Atoms, str]], *, forces: bool, stress: bool) -> dict[str, Any]:
    """One calculator call on ``batch`` as a flat ``mol_idx`` batch; a refused structure is
    found by calling again structure by structure, and named."""
    try:
        return calc(**_call_inputs(calc, [a for a, _ in batch]), forces=forces, stress=stress)
    except InferenceError as exc:
        if len(batch) == 1:
            raise InferenceError(f"{batch[0][1]}: {exc}") from None
        for atoms, where in batch:
            try:
                calc(**_call_inputs(calc, [atoms]), forces=forces, stress=stress)
            except InferenceError as one:
                raise InferenceError(f"{where}: {one}") from None
        raise


def _call_inputs(calc: HydraCalculator, frames: list[Atoms]) -> dict[str, Any]:
    """Calculator arguments of ``frames``: ``coord [N, 3]``, ``numbers [N]``, ``mol_idx [N]``,
    ``cell [B, 3, 3]`` / ``pbc [B, 3]`` when any is periodic, ``charge`` / ``spin [B]`` from
    ``atoms.info`` for models that read them (0 when absent)."""
    args: dict[str, Any] = {
        "coord": np.concatenate([a.positions for a in frames]),
        "numbers": np.concatenate([a.numbers for a in frames]),
        "mol_idx": np.repeat(np.arange(len(frames)), [len(a) for a in frames]),
    }
    if any(a.pbc.any() for a in frames):
        args["cell"] = np.stack([a.cell.array for a in frames])
        args["pbc"] = np.stack([a.pbc for a in frames])
    for role in ("charge", "spin"):
        if role in calc.info.graph_inputs:
            args[role] = np.array([float(a.info.get(role, 0.0)) for a in frames])
    return args


def _as_rows(value: Any, h: _Head) -> Any:
    """A calculator result as the label's rows: ``[B, dim]`` or ``[N, dim]``; stress ``[B, 3, 3]``
    becomes Voigt ``[B, 6]`` (or ``[B, 9]``) as the schema holds it."""
    if h.role == "stress" and h.var.dim == 6:
        import torch
        from ase.stress import full_3x3_to_voigt_6_stress

        return torch.from_numpy(full_3x3_to_voigt_6_stress(value.detach().cpu().double().numpy()))
    return value.reshape(-1, h.var.dim)


def _with_predictions(batch: list[tuple[Atoms, str]], out: dict[str, Any], info: Any) -> list[Atoms]:
    """Copies of the structures (labels kept) with every prediction under :data:`PREFIX`."""
    from ase.calculators.singlepoint import SinglePointCalculator
    from ase.stress import full_3x3_to_voigt_6_stress

    counts = [len(a) for a, _ in batch]
    starts = np.concatenate([[0], np.cumsum(counts)])
    result = {k: v.detach().cpu().double().numpy() for k, v in out.items()}
    node = {"forces", *info.node_outputs, info.atomic_energy}
    copies = []
    for b, (atoms, _) in enumerate(batch):
        copy = atoms.copy()
        if atoms.calc is not None and getattr(atoms.calc, "results", None):
            copy.calc = SinglePointCalculator(copy, **atoms.calc.results)
        for name, value in result.items():
            if name in node:
                copy.arrays[PREFIX + name] = value[starts[b] : starts[b + 1]]
            elif name == "stress" and info.stress is not None:
                copy.info[PREFIX + name] = full_3x3_to_voigt_6_stress(value[b])
            else:
                row = value[b]
                copy.info[PREFIX + name] = float(row) if np.ndim(row) == 0 else row
        copies.append(copy)
    return copies

"""``export_model``: a HydraGNN potential as a file that MD engines load without hydragnn.

Steps: the model (an artifact or a ``HydraModel``, copied) in the export dtype and device, the
reasons it cannot be exported (:func:`.graph.export_problems`, refused before any work), the
traced graph (:mod:`.graph`), the file written beside its destination under a temporary name
(:mod:`.formats`, :mod:`.metatomic`), then the check: the written file, loaded as its users load
it, against :class:`~hydragnn.infer.HydraCalculator` on a molecule and a triclinic periodic cell
of other sizes than the trace's. Only a file that passes replaces ``path``; nothing is left
behind otherwise, so an export either gives a file that computes what the calculator computes
or an :class:`~.graph.ExportError` saying why.
"""

from __future__ import annotations

import copy
import io
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hydragnn.data.io.atomic import destination_problem
from hydragnn.models import Committee, HydraModel, load_artifact
from hydragnn.models.execution import Execution

from ..calculator import HydraCalculator
from ..errors import InferenceError
from ..model_info import ModelInfo, model_info
from .formats import FORMATS, metadata, write_aoti, write_torchscript
from .graph import ExportError, check_species, export_problems, fcc_lattice, potential_function, trace
from .runtime import example_inputs, file_sha256

DTYPES = {"float32": torch.float32, "float64": torch.float64}

TOLERANCE = {torch.float64: 1e-7, torch.float32: 2e-4}
"""Largest accepted difference from the calculator, relative to the largest magnitude of each
output (at least 1). The file and the calculator sum the same terms in other orders (their
neighbour lists are ordered differently): float64 exports agree to 1e-15 for most encoders, to
2e-8 where an encoder computes in float32 inside a float64 model (AllScAIP's pair geometry);
float32 exports to a few ulps of a sum. An export error (a missing periodic shift, a wrong
sign) is orders of magnitude larger."""


@dataclass
class ExportReport:
    """What an export produced and measured.

    Attributes:
        path: the written file; format: its format; dtype / device: the export's.
        size_bytes: the file's size.
        seconds: ``{"trace", "write", "check"}`` wall times (``write`` includes the AOTInductor compile).
        errors: ``{output: largest absolute difference from the calculator}`` over the check structures.
        tolerance: the relative tolerance the check applied.
        sha256: the written file's SHA-256: record it, and load the file with ``sha256=`` to
            refuse any other (an exported file runs code).
    """

    path: Path
    format: str
    dtype: str
    device: str
    size_bytes: int
    seconds: dict[str, float] = field(default_factory=dict)
    errors: dict[str, float] = field(default_factory=dict)
    tolerance: float = 0.0
    sha256: str = ""

    def summary(self) -> str:
        """Two lines for a terminal: where, how big, how long; and the check's largest differences."""
        times = ", ".join(f"{k} {v:.1f} s" for k, v in self.seconds.items())
        checks = ", ".join(f"{k} {v:.1e}" for k, v in self.errors.items())
        return (
            f"{self.path} ({self.format}, {self.dtype}, {self.device}): {self.size_bytes / 1e6:.2f} MB; {times}\n"
            f"checked against HydraCalculator (molecule + triclinic cell), largest differences: {checks}\n"
            f"SHA-256 {self.sha256} (an exported file runs code: load it with sha256= this to refuse any other)"
        )


def format_for(path: str | os.PathLike, fmt: str | None) -> str:
    """``fmt``, or the format a path's suffix implies (``.pt2``: AOTInductor, ``.pt``: TorchScript)."""
    if fmt is not None:
        if fmt not in FORMATS:
            raise ExportError(f"format: expected one of {sorted(FORMATS)}, found {fmt!r}")
        return fmt
    suffix = Path(path).suffix
    by_suffix = {".pt2": "aoti", ".pt": "torchscript"}
    if suffix not in by_suffix:
        raise ExportError(f"{path}: give --format (one of {sorted(FORMATS)}); the suffix {suffix!r} does not say")
    return by_suffix[suffix]


def export_model(
    model_or_artifact: HydraModel | str | os.PathLike,
    path: str | os.PathLike,
    *,
    format: str | None = None,  # noqa: A002 (the CLI's --format)
    dtype: str | None = None,
    device: str = "cpu",
    head: str | None = None,
    charge: float | None = None,
    spin: float | None = None,
    uncertainty: bool = False,
    progress: Callable[[str], None] | None = None,
) -> ExportReport:
    """Export an interatomic potential to ``path`` and check the file against the calculator.

    Args:
        model_or_artifact: a ``.hydra`` artifact path or a :class:`~hydragnn.models.HydraModel`
            (not modified: a copy is exported).
        path: destination; replaced only by a file that passed the check (its folder is created;
            a folder there, an unwritable folder, a full disk or a file-size limit is an
            ``ExportError`` and leaves no file behind).
        format: ``"aoti"`` (AOTInductor ``.pt2``), ``"torchscript"`` or ``"metatomic"``; default
            from the suffix (``.pt2`` / ``.pt``).
        dtype: ``"float32"`` or ``"float64"`` (default: the model's).
        device: ``"cpu"`` or ``"cuda"``: where the file runs (the trace fixes it).
        head: the energy head to export, for a model with several.
        charge, spin: fixed values of the model's total-charge / spin inputs (engines pass none).
        uncertainty: the model is a committee (``Architecture.committee`` >= 2, or
            :class:`~hydragnn.models.Committee`); the file also gives its spread as
            :class:`~hydragnn.infer.HydraCalculator` serves it with ``uncertainty=True``
            (``energy_uncertainty``, ``forces_uncertainty [N]``, ``atomic_energy_uncertainty [N]``;
            metatomic: its ``energy_uncertainty`` output, per atom when the model has per-atom
            energies, which metatomic's ASE calculator and LAMMPS pair style compare with their
            ``uncertainty_threshold``).
        progress: called with a line per step (the CLI prints them).

    Raises:
        ExportError: the model cannot be exported (every reason listed), a format's dependency
            is missing, or the written file does not compute what the calculator computes.
    """
    fmt = format_for(path, format)
    if Path(path).suffix == ".hydra":
        raise ExportError(
            f"{path}: .hydra names model artifacts; an exported file runs code and keeps its own name (.pt / .pt2)"
        )
    if (problem := destination_problem(path)) is not None:  # before the trace: a refusal costs no compile
        raise ExportError(f"{path}: {problem}")
    say = progress or (lambda line: None)
    model = _prepared(model_or_artifact, dtype, device, head)
    try:
        info = model_info(model)
    except InferenceError as exc:
        raise ExportError(f"cannot export this model: {exc}") from None
    fixed = {k: float(v) for k, v in (("charge", charge), ("spin", spin)) if v is not None}
    problems = export_problems(model, info, fixed)
    if uncertainty and not isinstance(model, Committee):
        problems.append(
            "uncertainty needs a committee (Architecture.committee >= 2): a single model has no spread to serve"
        )
    if problems:
        raise ExportError("cannot export this model:\n  - " + "\n  - ".join(problems))
    spec = FORMATS[fmt]
    meta = _metadata(model, info, fmt, fixed, head, model_or_artifact, uncertainty)
    references = check_references(
        model, info, fixed, uncertainty=uncertainty
    )  # before the trace: a refusal costs no compile
    if fmt == "metatomic":
        from .metatomic import metatomic_torch

        metatomic_torch()  # a missing extra fails before the trace
    seconds: dict[str, float] = {}
    start = time.perf_counter()
    graph_attr = _graph_attr(info, fixed, model)
    example = example_inputs(info, model.geometry_dtype, torch.device(device))
    if not spec["gradients"]:
        # the engine differentiates the energy: trace the path a gradient flows through (without a
        # gradient, geometry takes shortcuts that are not differentiable at zero length: safe_norm)
        example[0].requires_grad_(True)
    gm = trace(
        potential_function(model, info, graph_attr, gradients=spec["gradients"], uncertainty=uncertainty), example
    )
    seconds["trace"] = time.perf_counter() - start
    say(
        f"traced in {seconds['trace']:.1f} s; writing {fmt}"
        + (" (AOTInductor compile, about a minute)" if fmt == "aoti" else "")
    )
    path = Path(path)
    tmp = path.with_name(f".{path.stem}.{os.getpid()}.tmp{path.suffix}")  # AOTInductor wants its suffix
    try:
        start = time.perf_counter()
        _write_file(_serialised(fmt, gm, example, meta), tmp, path)
        seconds["write"] = time.perf_counter() - start
        start = time.perf_counter()
        tolerance = TOLERANCE[model.geometry_dtype]
        errors = check_file(tmp, fmt, model, info, references=references, tolerance=tolerance, uncertainty=uncertainty)
        seconds["check"] = time.perf_counter() - start
        try:
            os.replace(tmp, path)
        except OSError as exc:
            raise ExportError(f"{path}: cannot replace it with the exported file: {exc.strerror or exc}") from None
    finally:
        tmp.unlink(missing_ok=True)
    return ExportReport(
        path=path,
        format=fmt,
        dtype=meta["dtype"],
        device=meta["device"],
        size_bytes=path.stat().st_size,
        seconds=seconds,
        errors=errors,
        tolerance=tolerance,
        sha256=file_sha256(path),
    )


def _serialised(fmt: str, gm: torch.fx.GraphModule, example: tuple[torch.Tensor, ...], meta: dict[str, Any]) -> bytes:
    """The file of format ``fmt``, built in memory (its writer never touches the destination)."""
    buffer = io.BytesIO()
    if fmt == "aoti":
        write_aoti(gm, example, buffer, meta)
    elif fmt == "torchscript":
        write_torchscript(gm, buffer, meta)
    else:
        from .metatomic import write_metatomic

        write_metatomic(gm, buffer, meta)
    return buffer.getvalue()


def _write_file(data: bytes, tmp: Path, path: Path) -> None:
    """``data`` to the temporary file ``tmp`` beside ``path``; an ``OSError`` (a full disk, a
    file-size limit) becomes an ``ExportError`` naming ``path`` (the caller removes ``tmp``)."""
    try:
        with open(tmp, "wb") as fh:
            fh.write(data)
    except OSError as exc:
        raise ExportError(
            f"{path}: cannot write the exported file ({len(data)} bytes): {exc.strerror or exc}; nothing was written"
        ) from None


def _prepared(model_or_artifact: Any, dtype: str | None, device: str, head: str | None) -> HydraModel:
    """A frozen eval-mode copy of the model in the export dtype, on the export device, serving
    ``head``, on the stock path (an export is the reference equations: no backend switched in)."""
    if isinstance(model_or_artifact, (HydraModel, Committee)):
        model = copy.deepcopy(model_or_artifact)
        Execution.reference().switch_in(model)
    else:
        model = load_artifact(Path(model_or_artifact), device="cpu")
    if dtype is not None:
        if dtype not in DTYPES:
            raise ExportError(f"dtype: expected one of {sorted(DTYPES)}, found {dtype!r}")
        model = model.to(DTYPES[dtype])
    try:
        model = model.to(torch.device(device))
    except (RuntimeError, AssertionError) as exc:
        raise ExportError(f"device: {device!r} is not usable here ({exc})") from None
    if head is not None:
        try:
            model.select_head(head)
        except Exception as exc:  # ModelError for an unknown head, AttributeError without energy heads
            raise ExportError(f"head: {exc}") from None
    return model.eval().requires_grad_(False)


def _graph_attr(info: ModelInfo, fixed: Mapping[str, float], model: HydraModel) -> torch.Tensor | None:
    if not info.graph_inputs:
        return None
    values = [fixed[role] for role in info.graph_inputs]
    return torch.tensor([values], dtype=model.dtype, device=next(model.parameters()).device)


def _metadata(
    model: HydraModel,
    info: ModelInfo,
    fmt: str,
    fixed: Mapping[str, float],
    head: str | None,
    source: Any,
    uncertainty: bool = False,
) -> dict[str, Any]:
    from hydragnn.infer import __version__

    manifest = getattr(model, "manifest", None) or {}
    species = sorted(info.species) if info.species else list(range(1, info.max_species or 119))
    outputs = {"energy": "structure", "forces": "atom", "stress": "structure", "virial": "structure"}
    if info.atomic_energy:
        outputs[info.atomic_energy] = "atom"
    outputs.update({n: "atom" for n in info.node_outputs})
    outputs.update({n: "structure" for n in info.graph_outputs})
    if uncertainty:
        outputs |= {"energy_uncertainty": "structure", "forces_uncertainty": "atom"}
        outputs |= {"atomic_energy_uncertainty": "atom"} if info.atomic_energy else {}
    if FORMATS[fmt]["gradients"] is False:
        outputs = {"energy": "structure"} | ({"atomic_energy": "atom"} if info.atomic_energy else {})
        if uncertainty:  # metatomic's energy_uncertainty, per atom when it can be
            outputs["energy_uncertainty"] = "atom" if info.atomic_energy else "structure"
    heads = model.energy_head_names
    attention = model.config.attention.engine
    return metadata(
        format=fmt,
        hydra_infer_version=__version__,
        source=str(source) if not isinstance(source, (HydraModel, Committee)) else None,
        weights_sha256=manifest.get("weights_sha256"),
        architecture=model.config.mpnn_type,
        cutoff=info.cutoff,
        interaction_range=float("inf") if attention else info.cutoff * model.config.num_conv_layers,
        species=species,
        dtype=str(model.geometry_dtype).removeprefix("torch."),
        device=next(model.parameters()).device.type,
        energy_head=head or (heads[model.energy_head.default_head] if len(heads) > 1 else None),
        fixed_inputs=dict(fixed),
        outputs=outputs,
        per_atom_energy=info.atomic_energy is not None,
        uncertainty=uncertainty,
        atomic_energy_name=info.atomic_energy,
        name=f"HydraGNN {model.config.mpnn_type}",
    )


def check_structures(info: ModelInfo) -> list[Any]:
    """A 7-atom molecule and a 12-atom triclinic periodic cell (the trace used a 32-atom cubic one).

    Every atom is one of :func:`.graph.check_species` (the model's training species when it lists
    them), so a model trained on any chemistry can be checked.
    """
    from ase import Atoms
    from ase.build import bulk

    first, second = check_species(info)
    rng = np.random.default_rng(7)
    molecule = Atoms(
        numbers=[first, second, first, first, second, first, second],
        positions=rng.normal(scale=1.2, size=(7, 3)) + np.array([0.0, 0.0, 0.0]),
    )
    periodic = bulk("Cu", "fcc", a=fcc_lattice(info.cutoff)) * (2, 2, 3)  # the primitive fcc cell: triclinic
    periodic.numbers[:] = first
    periodic.numbers[::3] = second  # every atom one of the model's species, whatever they are
    periodic.rattle(0.08, seed=3)
    return [molecule, periodic]


def _reference(
    model: HydraModel, info: ModelInfo, atoms: Any, fixed: Mapping[str, float], uncertainty: bool
) -> dict[str, np.ndarray]:
    calc = HydraCalculator(model, skin=0.0, uncertainty=uncertainty)
    periodic = bool(atoms.pbc.any())
    out = calc(
        atoms.positions,
        atoms.numbers,
        cell=atoms.cell.array if periodic else None,
        pbc=atoms.pbc if periodic else None,
        forces=True,
        stress=periodic,
        charge=fixed.get("charge"),
        spin=fixed.get("spin"),
    )
    result = {k: v.detach().cpu().double().numpy() for k, v in out.items()}
    for name in ("energy", *info.graph_outputs, *(["stress"] if periodic else [])):
        result[name] = result[name][0]  # one structure: drop the batch dimension, as the file does
    if "energy_uncertainty" in result:
        result["energy_uncertainty"] = result["energy_uncertainty"][0]
    return result


def _exported(
    path: Path, fmt: str, atoms: Any, info: ModelInfo, device: str, uncertainty: bool = False
) -> dict[str, np.ndarray]:
    """The written file's outputs for ``atoms``, loaded as its users load it."""
    if fmt == "metatomic":
        from .pyg_patch import pyg_index_select_restored

        with pyg_index_select_restored():
            from metatomic_ase import MetatomicCalculator

            calc = MetatomicCalculator(str(path), device=device)  # the device the file was exported for
            atoms = atoms.copy()
            atoms.calc = calc
            out = {"energy": np.array(atoms.get_potential_energy()), "forces": atoms.get_forces()}
            if atoms.pbc.any():
                from ase.stress import voigt_6_to_full_3x3_stress

                out["stress"] = voigt_6_to_full_3x3_stress(atoms.get_stress())
            if uncertainty:
                out.update(_metatomic_uncertainty(calc, atoms, info.atomic_energy is not None))
            return out
    from .runtime import ExportedModel, structure_inputs

    exported = ExportedModel(path)
    raw = exported.run(*structure_inputs(atoms, info.cutoff, exported.dtype, exported.device))
    out = {k: v.detach().cpu().double().numpy() for k, v in raw.items()}
    if not atoms.pbc.any():
        out.pop("stress", None)
    out.pop("virial", None)
    return out


def _metatomic_uncertainty(calc: Any, atoms: Any, per_atom: bool) -> dict[str, np.ndarray]:
    """The file's ``energy_uncertainty`` under the calculator's name (``atomic_energy_uncertainty``
    per atom, ``energy_uncertainty`` per structure)."""
    from metatomic.torch import ModelOutput

    request = {"energy_uncertainty": ModelOutput(unit="eV", sample_kind="atom" if per_atom else "system")}
    values = calc.run_model(atoms, request)["energy_uncertainty"].block().values.detach().cpu().double().numpy()
    return {"atomic_energy_uncertainty": values.reshape(-1)} if per_atom else {"energy_uncertainty": values.reshape(())}


def check_references(
    model: HydraModel, info: ModelInfo, fixed: Mapping[str, float], *, uncertainty: bool = False
) -> list[tuple[Any, dict[str, np.ndarray]]]:
    """:func:`check_structures` with the calculator's outputs for each, computed before any file is written.

    Raises:
        ExportError: the calculator refuses a check structure (the message says why).
    """
    pairs = []
    for atoms in check_structures(info):
        try:
            pairs.append((atoms, _reference(model, info, atoms, fixed, uncertainty)))
        except InferenceError as exc:
            raise ExportError(f"export check: the calculator refuses the check structure ({exc})") from None
    return pairs


def check_file(
    path: Path,
    fmt: str,
    model: HydraModel,
    info: ModelInfo,
    *,
    references: list[tuple[Any, dict[str, np.ndarray]]],
    tolerance: float,
    uncertainty: bool = False,
) -> dict[str, float]:
    """Largest differences between the file and the calculator's ``references`` (:func:`check_references`).

    Raises:
        ExportError: an output missing from the file, or differing by more than ``tolerance``
            (relative to the output's largest magnitude, at least 1).
    """
    worst: dict[str, float] = {}
    for atoms, ref in references:
        kind = "periodic cell" if atoms.pbc.any() else "molecule"
        try:
            got = _exported(path, fmt, atoms, info, next(model.parameters()).device.type, uncertainty)
        except Exception as exc:  # the file's runtime raises its own types; the message says what
            first = " ".join(str(exc).split())[-400:]
            raise ExportError(
                f"export check ({kind}): the written file fails ({type(exc).__name__}: ...{first}); it was not kept"
            ) from exc
        for name, value in got.items():
            if name not in ref:
                continue
            expected = ref[name]
            if value.shape != expected.shape:
                raise ExportError(
                    f"export check ({kind}): {name} has shape {value.shape}, the calculator's {expected.shape}"
                )
            diff = float(np.abs(value - expected).max()) if value.size else 0.0
            scale = max(1.0, float(np.abs(expected).max()) if expected.size else 0.0)
            if not diff <= tolerance * scale:
                raise ExportError(
                    f"export check ({kind}): {name} differs from the calculator's by {diff:.3g} "
                    f"(tolerance {tolerance * scale:.3g}); the file was not written"
                )
            worst[name] = max(worst.get(name, 0.0), diff)
        required = ["energy", "forces"]
        if uncertainty:
            required.append("atomic_energy_uncertainty" if info.atomic_energy else "energy_uncertainty")
        for name in required:
            if name not in got:
                raise ExportError(f"export check ({kind}): the file gives no {name}")
    return worst

"""``export_model``: a HydraGNN potential as a file that MD engines load without hydragnn.

Steps: the model (an artifact or a ``HydraModel``, copied) in the export dtype and device, the
reasons it cannot be exported (:func:`.graph.export_problems`, refused before any work), the
traced graph (:mod:`.graph`), the file written beside its destination under a temporary name
(:mod:`.formats`, :mod:`.metatomic`), then the check: the written file, loaded as its users load
it, against :class:`~hydragnn.infer.HydraCalculator` on a molecule and a triclinic periodic cell
of other sizes than the trace's (:mod:`.check`). Only a file that passes replaces ``path``; nothing is left
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

import torch

from hydragnn.data.io.atomic import destination_problem
from hydragnn.models import Committee, HydraModel, load_artifact
from hydragnn.models.execution import Execution

from ..errors import InferenceError
from ..model_info import ModelInfo, model_info
from .check import check_file, check_references
from .formats import FORMATS, metadata, write_aoti, write_torchscript
from .graph import ExportError, export_problems, potential_function, trace
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
    _refuse_problems(model, info, fixed, uncertainty)
    meta = _metadata(model, info, fmt, fixed, head, model_or_artifact, uncertainty)
    # before the trace: a refusal costs no compile
    references = check_references(model, info, fixed, uncertainty=uncertainty)
    if fmt == "metatomic":
        from .metatomic import metatomic_torch

        metatomic_torch()  # a missing extra fails before the trace
    seconds: dict[str, float] = {}
    start = time.perf_counter()
    gm, example = _traced(model, info, fixed, fmt, device, uncertainty)
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


def _refuse_problems(model: HydraModel, info: ModelInfo, fixed: Mapping[str, float], uncertainty: bool) -> None:
    """Raise an ``ExportError`` listing every reason ``model`` cannot be exported (nothing: it can)."""
    problems = export_problems(model, info, dict(fixed))
    if uncertainty and not isinstance(model, Committee):
        problems.append(
            "uncertainty needs a committee (Architecture.committee >= 2): a single model has no spread to serve"
        )
    if problems:
        raise ExportError("cannot export this model:\n  - " + "\n  - ".join(problems))


def _traced(
    model: HydraModel, info: ModelInfo, fixed: Mapping[str, float], fmt: str, device: str, uncertainty: bool
) -> tuple[torch.fx.GraphModule, tuple[torch.Tensor, ...]]:
    """The traced function of format ``fmt`` (:func:`.graph.potential_function`) and its example inputs."""
    gradients = FORMATS[fmt]["gradients"]
    example = example_inputs(info, model.geometry_dtype, torch.device(device))
    if not gradients:
        # the engine differentiates the energy: trace the path a gradient flows through (without a
        # gradient, geometry takes shortcuts that are not differentiable at zero length: safe_norm)
        example[0].requires_grad_(True)
    graph_attr = _graph_attr(info, fixed, model)
    fn = potential_function(model, info, graph_attr, gradients=gradients, uncertainty=uncertainty)
    return trace(fn, example), example


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

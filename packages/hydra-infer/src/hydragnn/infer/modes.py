"""Mode selection: CUDA-graph and inference-kernel eligibility, fallbacks, one-time warnings.

The runners (:mod:`.runners`) ask :func:`graph_reasons` / :func:`kernel_reasons` on every call
why their fast path would not apply; each reason is warned about once per calculator
(:class:`FallbackWarnings`) and the regular runner answers. :func:`make_graph_engine` builds the
CUDA-graph runner's engine (for a CUDA device, or on the backend a caller passes in).
"""

from __future__ import annotations

import os
import re
import warnings
from collections.abc import Sequence
from typing import Any

import torch

from .errors import HydraInferWarning, InferenceError

ENV_CUDA_GRAPH = "HYDRAGNN_CUDA_GRAPH"
_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"", "0", "false", "no", "off"})

GRAPH_REASONS: dict[str, str] = {
    "device": "CUDA-graph replay needs a CUDA device; the calculator runs on {device}",
    "cell": "a cell with non-periodic directions was given: CUDA-graph replay covers non-periodic structures and "
    "fully periodic cells",
    "requires_grad": "the inputs (coordinates, cell, charge or spin) require grad: CUDA-graph replay returns "
    "detached results only",
    "trainable": "the model has parameters that require grad: CUDA-graph replay serves frozen models only "
    "(model.requires_grad_(False); a calculator built from an artifact path freezes its own copy)",
    "hooks": "the model has forward hooks: a replayed graph would not call them",
    "deterministic": "torch.use_deterministic_algorithms(True) is on: CUDA-graph replay is not run in "
    "deterministic mode",
    "stress": "stress was requested: CUDA-graph replay computes energy and forces only",
    "model": "the model is not supported by CUDA-graph replay ({detail})",
    "dependency": "the CUDA-graph engine is not available ({detail})",
}
"""CUDA-graph ineligibility reasons (code -> message template)."""

KERNEL_REASONS: dict[str, str] = {
    "device": "the Triton inference kernels need CUDA, or TRITON_INTERPRET=1 on CPU (slow, for tests); "
    "the calculator runs on {device}",
    "dependency": "the inference kernels are not available ({detail})",
}
"""Inference-kernel ineligibility reasons."""

COMPILE_WITH_GRAPH = (
    "compile_model=True with cuda_graph=True: replayed CUDA graphs are captured from the eager model, "
    "so eligible calls run the eager model (calls that fall back use the compiled one)"
)
COMPILE_WITH_KERNELS = (
    "compile_model=True with inference_kernels=True: the compiled forward runs the stock primitives; "
    "the kernels run only inside CUDA-graph replays{where}"
)

MIN_VERSIONS: dict[str, tuple[int, ...]] = {"torch": (2, 13), "warp-lang": (1, 19), "nvalchemi-toolkit-ops": (0, 5)}
"""Oldest runtime versions the CUDA-graph engine was validated with (checked at construction)."""


def resolve_cuda_graph(cuda_graph: bool | None) -> tuple[bool, str | None]:
    """``(enabled, note)``: an explicit ``True`` / ``False`` wins; ``None`` reads :data:`ENV_CUDA_GRAPH`.

    The variable is case-insensitive and whitespace is ignored: ``1, true, yes, on`` enable;
    unset, empty, ``0, false, no, off`` disable, and so does any other value, with a ``note``
    the calculator warns about once (a deployment typo never fails the service).

    Raises:
        InferenceError: ``cuda_graph`` is not a bool or ``None``.
    """
    if cuda_graph is not None:
        if not isinstance(cuda_graph, bool):
            raise InferenceError(f"cuda_graph: expected True, False or None, found {cuda_graph!r}")
        return cuda_graph, None
    raw = os.environ.get(ENV_CUDA_GRAPH, "")
    value = raw.strip().lower()
    if value in _TRUE:
        return True, None
    if value in _FALSE:
        return False, None
    return False, (
        f"{ENV_CUDA_GRAPH}={raw!r} is not one of {sorted(_TRUE | (_FALSE - {''}))} (case-insensitive): "
        "CUDA-graph replay stays off"
    )


class FallbackWarnings:
    """Issues each ``(path, reason)`` warning at most once (per calculator)."""

    def __init__(self) -> None:
        self.issued: set[tuple[str, str]] = set()

    def warn(self, path: str, reason: str, message: str, category: type[Warning] = HydraInferWarning) -> None:
        key = (path, reason)
        if key in self.issued:
            return
        self.issued.add(key)
        warnings.warn(f"hydra-infer: {message}", category, stacklevel=4)


def graph_reasons(
    *,
    device: torch.device,
    engine: Any,
    replay_backend: bool,
    model: Any,
    model_problem: str | None,
    dependency_problem: str | None,
    partly_periodic: bool,
    requires_grad: bool,
    stress: bool,
) -> list[tuple[str, str]]:
    """Every reason a call cannot replay a CUDA graph: ``[(code, message)]`` (empty: eligible).

    A calculator off CUDA gets the ``device`` reason alone (not also a missing engine), unless the
    testing-only replay backend was requested (``replay_backend``).
    """
    if device.type != "cuda" and not replay_backend:
        return [("device", GRAPH_REASONS["device"].format(device=device))]
    reasons = []
    if partly_periodic:
        reasons.append(("cell", GRAPH_REASONS["cell"]))
    if requires_grad:
        reasons.append(("requires_grad", GRAPH_REASONS["requires_grad"]))
    if stress:
        reasons.append(("stress", GRAPH_REASONS["stress"]))
    if torch.are_deterministic_algorithms_enabled():
        reasons.append(("deterministic", GRAPH_REASONS["deterministic"]))
    if model_problem is not None:
        reasons.append(("model", GRAPH_REASONS["model"].format(detail=model_problem)))
    elif model is not None:
        if any(p.requires_grad for p in model.parameters()):
            reasons.append(("trainable", GRAPH_REASONS["trainable"]))
        if has_hooks(model):
            reasons.append(("hooks", GRAPH_REASONS["hooks"]))
    if engine is None and model_problem is None:
        reasons.append(("dependency", GRAPH_REASONS["dependency"].format(detail=dependency_problem or "no engine")))
    return reasons


def has_hooks(model: torch.nn.Module) -> bool:
    """Whether any forward (pre-)hook is registered on ``model``, its submodules, or globally."""
    from torch.nn.modules import module as nn_module

    if nn_module._global_forward_hooks or nn_module._global_forward_pre_hooks:
        return True
    return any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())


def _installed_version(dist: str) -> str | None:
    from importlib import metadata

    if dist == "torch":
        return torch.__version__
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _version_tuple(text: str) -> tuple[int, ...]:
    """``"2.13.0+cpu"`` -> ``(2, 13, 0)``: the leading dotted release numbers."""
    match = re.match(r"\d+(?:\.\d+)*", text)
    return tuple(int(x) for x in match.group(0).split(".")) if match else ()


def graph_dependency_problem(device: torch.device) -> str | None:
    """Why the CUDA-graph engine cannot run on ``device`` (``None``: it can).

    Checks, in order: a ROCm build (refused: the Warp / nvalchemi kernels are CUDA-only), torch's
    ``CUDAGraph`` and a visible CUDA device, and the runtime versions of torch, warp-lang and
    nvalchemi-toolkit-ops against :data:`MIN_VERSIONS` (the message names the installed versions
    and the upgrade command).
    """
    hip = getattr(torch.version, "hip", None)
    if hip:
        return f"a ROCm build of torch ({torch.__version__}, HIP {hip}): the engine's Warp / nvalchemi kernels are CUDA-only"
    if not hasattr(torch.cuda, "CUDAGraph"):
        return f"torch {torch.__version__} has no torch.cuda.CUDAGraph"
    if device.type != "cuda" or not torch.cuda.is_available():
        return "CUDA is not available; the engine is built for CUDA devices only"
    old = []
    for dist, minimum in MIN_VERSIONS.items():
        found = _installed_version(dist)
        if found is None or _version_tuple(found) < minimum:
            old.append((dist, found, minimum))
    if old:
        found_text = ", ".join(f"{d} {v or 'not installed'} (needs >= {'.'.join(map(str, m))})" for d, v, m in old)
        upgrade = " ".join(f"'{d}>={'.'.join(map(str, m))}'" for d, _, m in old)
        return f"{found_text}; upgrade with: pip install -U {upgrade}"
    return None


def make_graph_engine(device: torch.device, backend: Any) -> tuple[Any, str | None]:
    """The CUDA-graph runner's engine cache and the dependency problem that prevents one.

    The engine is ``None`` where no backend applies (the reasons then say why). :mod:`.graphs`
    is imported only here: for a CUDA device that passes the dependency gate, or for a
    ``backend`` passed in (``"replay"`` or a backend object: tests and tools).

    Raises:
        InferenceError: an unknown ``backend``.
    """
    if backend is None:
        if device.type != "cuda":
            return None, None
        problem = graph_dependency_problem(device)
        if problem is not None:
            return None, problem
    from .graphs import CudaGraphBackend, GraphEngineCache, make_backend

    if backend is None:
        return GraphEngineCache(CudaGraphBackend()), None
    try:
        return GraphEngineCache(make_backend(backend)), None
    except ValueError as exc:
        raise InferenceError(f"graph_backend: {exc}") from exc


def graph_model_problem(model: Any) -> str | None:
    """``None`` when the model fits CUDA-graph capture, else why not."""
    if not getattr(model, "mlip", False):
        return "not an interatomic potential"
    if model.config.mlip.dynamic_graph:
        return "dynamic_graph=True builds edges inside forward (data-dependent shapes)"
    if getattr(model.config, "max_neighbours", None) is not None:
        return "max_neighbours caps the neighbour list; the static edge buffers keep every pair within the cutoff"
    if model.config.attention.pe_dim:
        return "positional encodings (pe_dim > 0) need a per-structure eigendecomposition of the graph Laplacian"
    members = getattr(model, "members", None) or [model]  # a committee: every member's parts
    parts = [getattr(m, name, None) for m in members for name in ("encoder", "global_stage")]
    for part in parts:
        if part is not None and not getattr(part, "capture_safe", True):
            return (
                f"{type(part).__name__}'s forward is not capture-safe (host synchronisation or data-dependent shapes)"
            )
    return None


def kernel_reasons(*, kernels: Any, problems: Sequence[tuple[str, str]] = ()) -> list[tuple[str, str]]:
    """Every reason the inference kernels cannot run: ``[(code, message)]``.

    ``problems`` come from :func:`hydragnn.infer.kernels.prepare` (device, dependency or model).
    """
    if kernels is not None:
        return []
    return list(problems) or [
        ("dependency", KERNEL_REASONS["dependency"].format(detail="the kernels were not installed"))
    ]

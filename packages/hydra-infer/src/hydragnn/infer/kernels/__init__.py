"""Triton inference kernels for the hottest primitives (``inference_kernels=True``).

The kernels are implementations of hydra-models primitives (:mod:`.primitives`, backend
``"triton"``), never of encoders; :func:`install` switches a frozen copy of the model to them
with :func:`hydragnn.models.nn.use_backend`. Fused (see :mod:`.ops`; forward and first-order
backward, both in Triton):

* :class:`~hydragnn.models.nn.RadialFilter` on a Gaussian basis: basis + first linear layer +
  shifted softplus (:func:`.ops.schnet_filter`).
* :class:`~hydragnn.models.nn.ContinuousFilterConv` with a cosine envelope: envelope + gather +
  filter product + scatter-add (:func:`.ops.cfconv`).
* :class:`~hydragnn.models.nn.EquivariantMessage` on a Bessel basis: basis + filter layer +
  cosine cutoff + gating + vector message + both scatter-adds (:func:`.ops.painn_message`).

Everything else (embeddings, dense layers, GPS mixers, update blocks, heads, forces by
``autograd.grad``) is the stock PyTorch code, so eager calls and CUDA-graph replay use the
same patched model. Triton is an optional dependency (``hydra-infer[kernels]``) and is imported
only by :func:`available` and the first kernel launch.

Usage::

    ok, why = available(device)
    if ok:
        model, why = install(model)   # a patched copy, or the model unchanged and a reason
"""

from __future__ import annotations

import copy
import os
from typing import Any, cast

import torch

__all__ = ["available", "install", "interpreter_requested", "prepare"]

INTERPRET_ENV = "TRITON_INTERPRET"


def interpreter_requested() -> bool:
    """Whether ``TRITON_INTERPRET`` asks for Triton's interpreter (read like triton's knobs: 1/true/yes/on)."""
    return os.environ.get(INTERPRET_ENV, "").strip().lower() in {"1", "true", "yes", "on"}


def available(device: str | torch.device) -> tuple[bool, str | None]:
    """Whether the kernels can run on ``device``: ``(True, None)`` or ``(False, reason)``.

    CUDA needs triton and a CUDA device of compute capability 8.0 or more. CPU needs triton's interpreter, which triton reads when
    our kernels are decorated (the first import of :mod:`._triton`): ``TRITON_INTERPRET=1`` must
    be set before that (the interpreter is slow: for correctness tests only). Other devices are
    not supported. On CUDA with the interpreter active, the kernels run interpreted on host
    copies (correct, slow).
    """
    device = torch.device(device)
    if device.type not in ("cuda", "cpu"):
        return False, f"the Triton inference kernels run on CUDA (or on CPU under TRITON_INTERPRET=1), not on {device}"
    if device.type == "cuda" and torch.cuda.is_available():
        major, minor = torch.cuda.get_device_capability(device)
        if (major, minor) < (8, 0):
            return False, (
                f"the GPU has compute capability {major}.{minor}, below the 8.0 the Triton kernels need; "
                "the stock torch primitives run instead"
            )
    try:
        import triton  # noqa: F401
    except ImportError as exc:
        return False, f"triton is not installed (pip install 'hydra-infer[kernels]'): {exc}"
    if device.type == "cpu" and not interpreter_requested():
        return False, (
            "the Triton inference kernels need CUDA, or TRITON_INTERPRET=1 on CPU (slow, for tests); "
            f"the calculator runs on {device}"
        )
    try:
        from . import _triton
    except Exception as exc:  # a broken triton install: report it, never crash the calculator
        return False, f"the Triton kernels failed to load: {type(exc).__name__}: {exc}"
    if device.type == "cpu" and not _triton.INTERPRETED:
        return False, (
            "TRITON_INTERPRET=1 was set after the kernels were loaded (triton reads it once, when the "
            "kernels are decorated): set it before importing hydragnn.infer.kernels"
        )
    if device.type == "cuda" and not _triton.INTERPRETED and not torch.cuda.is_available():
        return False, "CUDA is not available to torch"
    return True, None


def install(model: Any) -> tuple[Any, str | None]:
    """Switch the primitives of a frozen copy of ``model`` to the Triton kernels.

    Args:
        model: a :class:`~hydragnn.models.HydraModel`.

    Returns:
        ``(patched, None)``: a deep copy of ``model`` (identical parameters and state-dict keys)
        whose primitives with a Triton implementation run it; the copy's parameters are frozen
        (``requires_grad=False``: inference only, so backward passes compute no weight gradients)
        and it is in eval mode. ``model`` itself is not modified. Or ``(model, reason)`` when no
        primitive of the model has kernels, or the model is in a 16-bit dtype.
    """
    from hydragnn.models.nn import implementations, use_backend

    from .primitives import BACKEND, DTYPES

    encoder = getattr(model, "encoder", None)
    name = type(encoder).__name__ if encoder is not None else type(model).__name__
    dtypes = {p.dtype for p in model.parameters() if p.is_floating_point()}
    if not dtypes <= DTYPES:
        found = ", ".join(sorted(str(d).removeprefix("torch.") for d in dtypes))
        return model, f"encoder {name} in {found}: the inference kernels support float32 and float64"
    impls = implementations(BACKEND)
    usable = [m for m in model.modules() if type(m) in impls and impls[type(m)].accepts(m) is None]
    if not usable:
        known = ", ".join(sorted(cls.__name__ for cls in impls))
        return model, f"encoder {name} has no inference kernels (they implement the primitives {known})"
    patched = copy.deepcopy(model)
    use_backend(patched, BACKEND)
    patched.requires_grad_(False)
    return patched.eval(), None


def prepare(model: Any, device: str | torch.device) -> tuple[Any, list[tuple[str, str]]]:
    """:func:`available` then :func:`install`, for the calculator: ``(patched, [])`` or ``(None, reasons)``.

    Reasons are ``(code, message)`` pairs for one-time fallback warnings: ``device`` (CPU without
    the interpreter, or another device type), ``dependency`` (triton missing or broken) or
    ``model`` (an encoder without kernels, a 16-bit dtype, ...).
    """
    ok, why = available(device)
    if not ok:
        reason = cast(str, why)  # available() gives a reason whenever it says no
        code = "dependency" if reason.startswith(("triton is not installed", "the Triton kernels failed")) else "device"
        return None, [(code, reason)]
    patched, why = install(model)
    if why is not None:
        return None, [("model", f"the model has no inference kernels: {why}")]
    return patched, []

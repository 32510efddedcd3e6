"""Triton inference kernels for the hottest primitives of SchNet and PAINN (``inference_kernels=True``).

What is fused (see :mod:`.ops`; forward and first-order backward, both in Triton):

* SchNet, per interaction: Gaussian radial basis + the filter network's first linear layer +
  shifted softplus (:func:`.ops.schnet_filter`); cosine envelope + gather ``lin1(h)[src]`` +
  filter product + scatter-add into ``dst`` (:func:`.ops.cfconv`).
* PAINN, per layer: Bessel radial basis + filter linear layer + cosine cutoff + gating of
  ``phi(s)[src]`` + vector message + both scatter-adds (:func:`.ops.painn_message`).

Everything else (embeddings, dense linear layers, PaiNN's update block, heads, forces by
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
from typing import Any

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
    """Swap the encoder of a copy of ``model`` for its kernel-backed subclass.

    Args:
        model: a :class:`~hydragnn.models.HydraModel`.

    Returns:
        ``(patched, None)``: a deep copy of ``model`` whose encoder is a
        :class:`.modules.KernelSchNet` / :class:`.modules.KernelPAINN` with identical parameters;
        the copy's parameters are frozen (``requires_grad=False``: inference only, so backward
        passes compute no weight gradients) and it is in eval mode. ``model`` itself is not
        modified. Or ``(model, reason)`` when the model is not eligible (another encoder, a
        16-bit dtype, PAINN with edge inputs, no encoder).
    """
    from .modules import encoder_problem, patch_encoder

    encoder = getattr(model, "encoder", None)
    if encoder is None:
        return model, f"{type(model).__name__} has no encoder"
    problem = encoder_problem(encoder)
    if problem is not None:
        return model, problem
    patched_encoder = patch_encoder(encoder)
    memo = {id(encoder): patched_encoder}  # deepcopy the rest, reuse the new encoder
    patched = copy.deepcopy(model, memo)
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
        code = "dependency" if why.startswith(("triton is not installed", "the Triton kernels failed")) else "device"
        return None, [(code, why)]
    patched, why = install(model)
    if why is not None:
        return None, [("model", f"the model has no inference kernels: {why}")]
    return patched, []

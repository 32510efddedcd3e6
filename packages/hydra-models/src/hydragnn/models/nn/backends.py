"""Primitives whose execution can be swapped: the equations once, the implementation selectable.

A :class:`Primitive` is an ``nn.Module`` whose stock ``forward`` is plain PyTorch and is the
reference of the computation. A *backend* (e.g. hydra-infer's Triton kernels) registers an
:class:`Implementation` for a primitive class with :func:`register_implementation`, never for
an encoder; :func:`use_backend` then switches every primitive of a model that the backend
implements and accepts, and every encoder built from those primitives runs the backend
without knowing it. Parameters, buffers and state-dict keys never change.

Where no backend is switched in, the stock forward runs: nothing is switched in by default.
Which backends a run uses is an execution profile's choice (:mod:`hydragnn.models.execution`):
on CPU, evaluating a function of the edge lengths once per distinct length (``"distinct"``,
:mod:`.distinct`) and running a channel-wise e3nn product as a few dense matrix products
(``"dense"``, :mod:`.channel_tp`); in hydra-infer, Triton kernels. :func:`execution_choices`
lists every registered implementation: the one place to read how a primitive can run.

Invariants: an implementation computes what ``forward`` computes (tested against it) and may
decline a call it cannot serve (dtype, device, gradients, an unsupported companion module) by
returning the primitive's own ``forward``. Hooks registered on a primitive are bypassed while an
implementation runs it; the backend switch is meant for inference copies (hydra-infer installs it
on a frozen copy of the model).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import nn

ALL_FLOAT_DTYPES: frozenset[torch.dtype] = frozenset({torch.float16, torch.bfloat16, torch.float32, torch.float64})


class Primitive(nn.Module):
    """A building block with a swappable implementation (see the module docstring).

    Class attributes a subclass sets:
        capture_safe: the stock forward has no host synchronisation and no data-dependent
            shape, so it may run inside a CUDA-graph capture.
        dtypes: the float dtypes the stock forward supports.
    """

    capture_safe: ClassVar[bool] = True
    dtypes: ClassVar[frozenset[torch.dtype]] = ALL_FLOAT_DTYPES

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        impl = self.__dict__.get("_implementation")
        if impl is None:
            return super().__call__(*args, **kwargs)
        return impl.run(self, *args, **kwargs)

    @property
    def backend(self) -> str:
        """The name of the backend switched in, ``"torch"`` for none (the stock forward)."""
        impl = self.__dict__.get("_implementation")
        return "torch" if impl is None else impl.backend


@dataclass(frozen=True)
class Implementation:
    """One backend's implementation of one primitive class.

    Attributes:
        primitive: the :class:`Primitive` subclass implemented (exact class: a subclass may
            compute something else).
        backend: the backend's name (``"triton"``).
        run: ``run(module, *args)``, the same signature and result as ``module.forward``.
        accepts: ``accepts(module) -> None`` when the implementation can serve this instance
            (its configuration, companion modules, parameter dtype), else the reason why not.
        dtypes: float dtypes the implementation supports.
        capture_safe: whether ``run`` may run inside a CUDA-graph capture.
    """

    primitive: type[Primitive]
    backend: str
    run: Callable[..., Any]
    accepts: Callable[[Primitive], str | None]
    dtypes: frozenset[torch.dtype]
    capture_safe: bool = True


_REGISTRY: dict[tuple[type[Primitive], str], Implementation] = {}


def register_implementation(impl: Implementation) -> Implementation:
    """Register ``impl`` (replacing an earlier one for the same primitive and backend); it runs
    only where :func:`use_backend` switches its backend in."""
    if not (isinstance(impl.primitive, type) and issubclass(impl.primitive, Primitive)):
        raise TypeError(f"Implementation.primitive must be a Primitive subclass, found {impl.primitive!r}")
    _REGISTRY[(impl.primitive, impl.backend)] = impl
    return impl


def execution_choices() -> list[tuple[str, str]]:
    """Every registered implementation: ``(primitive class, backend)``, sorted."""
    return sorted((cls.__name__, name) for cls, name in _REGISTRY)


def implementations(backend: str) -> dict[type[Primitive], Implementation]:
    """The primitives ``backend`` implements, with their implementations."""
    return {cls: impl for (cls, name), impl in _REGISTRY.items() if name == backend}


@dataclass(frozen=True)
class BackendReport:
    """What :func:`use_backend` did: module paths switched, and those declined with the reason."""

    backend: str
    switched: tuple[str, ...]
    declined: tuple[tuple[str, str], ...]


def use_backend(model: nn.Module, backend: str | None) -> BackendReport:
    """Switch every primitive of ``model`` that ``backend`` implements and accepts (in place).

    ``backend=None`` (or ``"torch"``) removes every switched backend (stock forwards run again).
    Primitives the backend does not implement keep their current implementation untouched.
    """
    switched: list[str] = []
    declined: list[tuple[str, str]] = []
    for path, module in model.named_modules():
        if not isinstance(module, Primitive):
            continue
        if backend in (None, "torch"):
            module.__dict__.pop("_implementation", None)
            continue
        impl = _REGISTRY.get((type(module), backend))
        if impl is None:
            continue
        why = impl.accepts(module)
        if why is None:
            module.__dict__["_implementation"] = impl
            switched.append(path)
        else:
            declined.append((path, why))
    return BackendReport(backend or "torch", tuple(switched), tuple(declined))

"""Execution profiles: how a run computes, chosen by name, never what it computes.

The equations live once (encoders, heads, the derivatives of a potential). Every speed device is
one field of an :class:`Execution`, and nothing else in HydraGNN switches one on: primitive
``backends`` (``"distinct"``, MACE's ``"dense"``, switched in with
:func:`~hydragnn.models.nn.use_backend`), the ``optimizer_step`` (``"torch"``, ``"fused"``,
``"flat"``), the intra-op ``threads`` policy (``"keep"`` or timed ``"auto"``), ``process`` tuning
(:func:`~.process.configure_threads`), ``compile_threads`` and the ``derivatives`` engine
(``"autograd"`` / ``"func"``). docs/execution.md explains each field and gives the measurements.

``"reference"`` is stock PyTorch; ``"cpu"`` (:data:`DEFAULT_PROFILE`, chosen by measurement) turns
every device on; each declines per call what it cannot serve exactly, and on a GPU they decline
or cost nothing. Invariant, checked by :func:`hydragnn.models.testing.check_execution_profile` for
every profile and encoder: a profile changes speed, never an answer beyond rounding. This module
imports no torch: a config names a profile and is checked before torch loads.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch import nn

    from hydragnn.models.nn.backends import BackendReport

__all__ = [
    "DEFAULT_PROFILE",
    "OPTIMIZER_STEPS",
    "PROFILES",
    "Execution",
    "ExecutionError",
    "get_profile",
    "register_profile",
]

OPTIMIZER_STEPS = ("torch", "fused", "flat")
THREAD_POLICIES = ("keep", "auto")
DERIVATIVE_ENGINES = ("autograd", "func")


class ExecutionError(ValueError):
    """An unknown profile, or a profile field out of its choices (the message names both)."""


def _choice(name: str, value: Any, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ExecutionError(f"Execution.{name}: expected one of {list(choices)}, found {value!r}")


@dataclass(frozen=True)
class Execution:
    """One execution profile (see the module docstring for each field). Frozen: a profile is a
    value, recorded by name and fields in the run log, ``config.json`` and the artifact."""

    name: str
    backends: tuple[str, ...] = ()
    optimizer_step: str = "torch"
    threads: str = "keep"
    process: bool = False
    compile_threads: bool = False
    derivatives: str = "autograd"
    description: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ExecutionError(f"Execution.name: a non-empty string, found {self.name!r}")
        if isinstance(self.backends, str) or not all(isinstance(b, str) and b for b in self.backends):
            raise ExecutionError(f"Execution.backends: a tuple of backend names, found {self.backends!r}")
        object.__setattr__(self, "backends", tuple(self.backends))
        _choice("optimizer_step", self.optimizer_step, OPTIMIZER_STEPS)
        _choice("threads", self.threads, THREAD_POLICIES)
        _choice("derivatives", self.derivatives, DERIVATIVE_ENGINES)

    @classmethod
    def reference(cls) -> Execution:
        """Stock PyTorch: the primitives' own forwards, the optimizer as built, the process untouched."""
        return PROFILES["reference"]

    @classmethod
    def cpu(cls) -> Execution:
        """The measured profile for small graphs on shared CPUs (the default)."""
        return PROFILES["cpu"]

    @property
    def tunes_threads(self) -> bool:
        """Whether a training run measures its intra-op thread count (``threads == "auto"``)."""
        return self.threads == "auto"

    def as_dict(self) -> dict[str, Any]:
        """The profile as JSON (``backends`` a list), as recorded in ``config.json`` and artifacts."""
        out = asdict(self)
        out["backends"] = list(self.backends)
        out.pop("description")
        return out

    def describe(self) -> str:
        """One line for a run log: the name and every device it switches on (or "stock PyTorch")."""
        parts = []
        if self.backends:
            parts.append("primitives " + "+".join(self.backends))
        if self.optimizer_step != "torch":
            parts.append(f"optimizer step {self.optimizer_step}")
        if self.threads != "keep":
            parts.append(f"threads {self.threads}")
        if self.process:
            parts.append("process tuning")
        if self.compile_threads:
            parts.append("compiled kernels on one thread")
        if self.derivatives != "autograd":
            parts.append(f"derivatives by {self.derivatives}")
        return f"execution {self.name!r}: " + (", ".join(parts) if parts else "stock PyTorch")

    # applying it -------------------------------------------------------------------------------
    def switch_in(self, model: nn.Module) -> list[BackendReport]:
        """Switch this profile's primitive backends and derivative engine into ``model`` (in place;
        parameters and state-dict keys unchanged). Returns one report per backend."""
        from hydragnn.models.derivatives import set_derivatives
        from hydragnn.models.nn.backends import use_backend

        use_backend(model, None)
        reports = [use_backend(model, backend) for backend in self.backends]
        set_derivatives(model, self.derivatives)
        return reports

    @staticmethod
    def switch_out(model: nn.Module) -> None:
        """Give every primitive of ``model`` its stock forward back and take derivatives by autograd."""
        from hydragnn.models.derivatives import set_derivatives
        from hydragnn.models.nn.backends import use_backend

        use_backend(model, None)
        set_derivatives(model, "autograd")

    def prefer_passive_waiting(self) -> bool:
        """A command line's first step, before anything loads torch: where :attr:`process` is set,
        :func:`~.process.prefer_passive_waiting` (OpenMP reads its wait policy once, when torch
        loads it). Returns whether it set the policy."""
        if not self.process:
            return False
        from .process import prefer_passive_waiting

        return prefer_passive_waiting()

    def configure_process(self) -> str | None:
        """:func:`~.process.configure_threads` when :attr:`process` is set (its one-line notice),
        else None: the process is left as it is."""
        if not self.process:
            return None
        from .process import configure_threads

        return configure_threads()

    def compile_kwargs(self, device_type: str, given: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """``torch.compile`` keyword arguments: ``given``, with :func:`~.process.compile_kwargs`'s
        thread option where :attr:`compile_threads` is set."""
        if not self.compile_threads:
            return dict(given or {})
        from .process import compile_kwargs

        return compile_kwargs(device_type, given)

    def report(self, model: nn.Module | None = None) -> dict[str, Any]:
        """What a run computes with: :meth:`as_dict`, and for ``model`` the implementation running
        each primitive class (``{"RadialFilter": {"distinct": 3}, ...}``; ``"torch"`` is the
        stock forward)."""
        out = self.as_dict()
        if model is not None:
            from hydragnn.models.nn.backends import Primitive

            running: dict[str, dict[str, int]] = {}
            for module in model.modules():
                if isinstance(module, Primitive):
                    counts = running.setdefault(type(module).__name__, {})
                    counts[module.backend] = counts.get(module.backend, 0) + 1
            out["primitives"] = running
        return out


PROFILES: dict[str, Execution] = {}
"""Registered profiles by name (:func:`register_profile`)."""


def register_profile(execution: Execution) -> Execution:
    """Register ``execution`` under its name (replacing one of the same name, except the shipped two)."""
    if execution.name in ("reference", "cpu") and execution.name in PROFILES and PROFILES[execution.name] != execution:
        raise ExecutionError(f"the {execution.name!r} profile ships with HydraGNN; register yours under another name")
    PROFILES[execution.name] = execution
    return execution


register_profile(Execution("reference", description="stock PyTorch: nothing switched in, the process untouched"))
register_profile(
    Execution(
        "cpu",
        backends=("distinct", "dense"),
        optimizer_step="flat",
        threads="auto",
        process=True,
        compile_threads=True,
        description="measured for small graphs on shared CPUs (docs/execution.md)",
    )
)

DEFAULT_PROFILE = "cpu"
"""The profile used where none is named (chosen by measurement: docs/execution.md)."""


def get_profile(choice: str | Execution | None = None) -> Execution:
    """The profile ``choice`` names (an :class:`Execution` is returned as it is; ``None``:
    :data:`DEFAULT_PROFILE`).

    Raises:
        ExecutionError: an unknown name (the message lists the registered ones).
    """
    if isinstance(choice, Execution):
        return choice
    name = DEFAULT_PROFILE if choice is None else choice
    if not isinstance(name, str) or name not in PROFILES:
        raise ExecutionError(f"unknown execution profile {name!r}; registered: {sorted(PROFILES)}")
    return PROFILES[name]

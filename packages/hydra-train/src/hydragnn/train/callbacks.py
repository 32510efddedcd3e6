"""Callbacks: the training loop's extension points.

:func:`~hydragnn.train.seed_api.train_validate_test` runs forward, loss, backward, step, validation,
best-model tracking and checkpoints; everything else that acts during a run is a
:class:`Callback`: learning-rate warmup, performer redraws, the weight average (EMA), the second
stage, the time budget, intra-op thread tuning, early stopping, TensorBoard scalars, and the
user's own. The loop calls each hook on every callback in order (the built-in ones first, then
the user's), on every rank:

==================  ==========================================================================
``on_fit_start``    once, after a resume has restored the callbacks' states, before any epoch
``on_epoch_start``  before an epoch's first batch (after ``set_epoch`` is due)
``before_forward``  before the forward of each training batch
``before_step``     after the backward, right before the optimizer step
``after_step``      right after the optimizer step (not for a skipped batch)
``evaluating``      a context manager around validation (the EMA swaps in averaged weights)
``on_epoch_end``    after validation, with the epoch's record (add keys, request a stop)
``on_fit_end``      once, when training ends, also on failure (give resources back)
``summary``         keys added to the dict ``train_validate_test`` returns
==================  ==========================================================================

A callback with state returns it from :meth:`Callback.state_dict` (tensors and plain
containers only: checkpoints load with ``weights_only=True``); the checkpoint keeps
``{"callbacks": {callback.key: state}}`` and a resumed run gives each callback its own state back
before ``on_fit_start``. Keys are unique in a run.

Callbacks from the config: ``Training.callbacks: [{"name": "<registered name>", ...keyword
arguments}]`` builds callbacks registered with :func:`register_callback` or installed under the
entry-point group ``hydragnn.train.callbacks``; a config never imports a module by path, so a
config file can only choose among code that is installed.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable, Iterator, Mapping, Sequence
from importlib import metadata
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, TypeVar

from .errors import ConfigError

if TYPE_CHECKING:
    import torch

    from .strategies.base import Strategy, TrainableModel

__all__ = [
    "ENTRY_POINT_GROUP",
    "Callback",
    "EarlyStopping",
    "LoopView",
    "TensorBoardScalars",
    "build_callbacks",
    "check_callback_specs",
    "register_callback",
    "registered_callbacks",
]

ENTRY_POINT_GROUP = "hydragnn.train.callbacks"


class LoopView(Protocol):
    """What a callback sees of the running training loop (:class:`~hydragnn.train.loop.TrainingLoop`
    is one): read-only facts of the run, the two flags a callback may set, and the requests it may
    make. Nothing else of the loop is a callback's business."""

    @property
    def strategy(self) -> Strategy:
        """The distributed strategy (``is_main``, ``device``, ...)."""
        ...

    @property
    def module(self) -> TrainableModel:
        """The plain model (not a DDP / compiled wrapper)."""
        ...

    @property
    def optimizer(self) -> torch.optim.Optimizer: ...

    @property
    def callbacks(self) -> Sequence[Callback]:
        """Every callback of the run, in the order the hooks run."""
        ...

    @property
    def epoch(self) -> int: ...

    @property
    def start_epoch(self) -> int:
        """The first epoch of this segment (after a resume: the one after the checkpoint's)."""
        ...

    @property
    def resumed(self) -> bool: ...

    @property
    def history(self) -> list[dict[str, Any]]:
        """Per-epoch records so far."""
        ...

    @property
    def best_epoch(self) -> int: ...

    @property
    def best_state(self) -> dict[str, torch.Tensor] | None:
        """The best weights so far (None before the first validated epoch)."""
        ...

    @property
    def stop_reason(self) -> str | None: ...

    step_scheduler: bool
    """Whether the loop steps the LR scheduler after each epoch (the second stage turns it off)."""
    best_loss: float
    """The best validation loss so far (the second stage restarts the choice: ``inf``)."""
    since_best: int
    """Epochs since the validation loss last improved."""
    best_kind: str
    """What the best state is, in the run's words (``"weights"``; the EMA keeps ``"EMA weights"``)."""
    train_batches: int
    """Training batches of the whole run (resumed segments included); the epoch counts them."""

    def log(self, line: str) -> None:
        """A line for the run log (rank 0, at the run's verbosity)."""
        ...

    def train_time_s(self) -> float:
        """Seconds of training loop over the whole run."""
        ...

    def request_stop(self, reason: str, message: str) -> None:
        """End training after this epoch (the first request names the reason)."""
        ...

    def validation_loss(self) -> float | None:
        """The validation loss of the live weights (for :meth:`Callback.on_training_end`)."""
        ...

    def live_state(self) -> dict[str, torch.Tensor]:
        """A copy of the live weights."""
        ...

    def keep_state(self, state: dict[str, torch.Tensor], loss: float, epoch: int, kind: str) -> None:
        """Offer ``state`` as the best model (kept when ``loss`` beats the best)."""
        ...


class Callback:
    """Base of every callback: each hook does nothing until a subclass overrides it.

    ``loop`` is a :class:`LoopView` of the running loop: ``strategy``, ``module`` (the plain
    model), ``optimizer``, ``epoch``, ``history``, ``best_loss`` / ``best_epoch`` / ``since_best``,
    ``log(line)``, ``train_time_s()``, ``request_stop(reason, message)``, and for
    :meth:`on_training_end` ``validation_loss()``, ``live_state()`` and
    ``keep_state(state, loss, epoch, kind)``.
    """

    key: ClassVar[str] = ""
    """The callback's name in the checkpoint and in messages ("" : the class name)."""

    @property
    def name(self) -> str:
        return self.key or type(self).__name__

    def on_fit_start(self, loop: LoopView) -> None:
        """Once, before the first epoch (states restored from a checkpoint already)."""

    def on_epoch_start(self, loop: LoopView, epoch: int) -> None:
        """Before the first batch of ``epoch``."""

    def before_forward(self, loop: LoopView, batch_index: int) -> None:
        """Before the forward of training batch ``batch_index`` of the epoch."""

    def before_step(self, loop: LoopView) -> None:
        """After the backward, right before the optimizer step."""

    def after_step(self, loop: LoopView, graphs: int, loss: float) -> None:
        """Right after an optimizer step on ``graphs`` graphs whose batch loss was ``loss``."""

    def evaluating(self, loop: LoopView) -> contextlib.AbstractContextManager[None]:
        """The context validation runs in (and the best model's state is copied in)."""
        return contextlib.nullcontext()

    def on_epoch_end(self, loop: LoopView, record: dict[str, Any]) -> None:
        """After validation. ``record`` (epoch, losses, errors, lr, seconds...) goes to the history
        after every callback has seen it; ``loop.request_stop`` ends training after this epoch."""

    def on_training_end(self, loop: LoopView) -> None:
        """After the last epoch, before the best state is restored and tested: a callback may
        offer another state with ``loop.keep_state`` (validated by ``loop.validation_loss()``)."""

    def on_fit_end(self, loop: LoopView) -> None:
        """When training ends, normally or by an exception."""

    def summary(self) -> Mapping[str, Any]:
        """Entries for the dict that ``train_validate_test`` returns."""
        return {}

    def state_dict(self) -> Mapping[str, Any] | None:
        """What a checkpoint keeps of this callback (``None``: nothing)."""
        return None

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict` (called before ``on_fit_start`` of a resumed run)."""


class EarlyStopping(Callback):
    """Stop once the validation loss has not improved for ``patience`` epochs
    (``Training.EarlyStopping``; the loop counts ``since_best``, which the checkpoint keeps)."""

    key = "early_stopping"

    def __init__(self, patience: int) -> None:
        self.patience = patience

    def on_epoch_end(self, loop: LoopView, record: dict[str, Any]) -> None:
        if loop.since_best >= self.patience:
            loop.request_stop(
                "early_stopping",
                f"early stopping after epoch {record['epoch']}: no better validation loss for {loop.since_best} epochs",
            )


class TensorBoardScalars(Callback):
    """Losses, learning rate and validation errors per epoch to a TensorBoard ``SummaryWriter``
    (rank 0 only; the writer is flushed every epoch and closed by its owner)."""

    key = "tensorboard"

    def __init__(self, writer: Any) -> None:
        self.writer = writer

    def on_epoch_end(self, loop: LoopView, record: dict[str, Any]) -> None:
        if not loop.strategy.is_main:
            return
        w, epoch = self.writer, record["epoch"]
        w.add_scalar("loss/train", record["train_loss"], epoch)
        w.add_scalar("loss/val", record["val_loss"], epoch)
        w.add_scalar("lr", record["lr"], epoch)
        for name, value in record["train_heads"].items():
            w.add_scalar(f"train/{name}", value, epoch)
            w.add_scalar(f"val/{name}", record["val_heads"][name], epoch)
        for name, err in (record["val_errors"] or {}).items():
            w.add_scalar(f"val_mae/{name}", err["mae"], epoch)
            w.add_scalar(f"val_rmse/{name}", err["rmse"], epoch)
        w.flush()


# ----------------------------------------------------------------------------- callbacks by name
_REGISTRY: dict[str, Callable[..., Callback]] = {}
C = TypeVar("C", bound=Callable[..., Callback])


def register_callback(name: str) -> Callable[[C], C]:
    """Decorator: make a callback class (or factory) buildable from the config by ``name``.

    Raises:
        ValueError: ``name`` is taken by another callback.
    """

    def decorate(factory: C) -> C:
        held = _REGISTRY.get(name)
        if held is not None and held is not factory:
            raise ValueError(f"callback name {name!r} is already registered for {held!r}")
        _REGISTRY[name] = factory
        return factory

    return decorate


def registered_callbacks() -> dict[str, str]:
    """``{name: where it comes from}`` of every callback the config can name."""
    names = {name: f"{f.__module__}.{f.__qualname__}" for name, f in _REGISTRY.items()}
    for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
        names.setdefault(ep.name, ep.value)
    return dict(sorted(names.items()))


def _factory(name: str, where: str) -> Callable[..., Callback]:
    if name in _REGISTRY:
        return _REGISTRY[name]
    for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
        if ep.name == name:
            try:
                return ep.load()
            except Exception as exc:  # an installed plugin that fails to import
                raise ConfigError(f"{where}: callback {name!r} ({ep.value}) cannot be loaded: {exc}") from exc
    known = ", ".join(registered_callbacks()) or "none registered"
    raise ConfigError(
        f"{where}: unknown callback {name!r} (known: {known}); register one with "
        f"hydragnn.train.callbacks.register_callback or the entry-point group {ENTRY_POINT_GROUP!r}"
    )


def check_callback_specs(values: Any, where: str) -> tuple[dict[str, Any], ...]:
    """Validate ``Training.callbacks``: a list of ``{"name": str, ...keyword arguments}``
    (shape only; names are resolved when training starts, where plugins are importable)."""
    if values is None:
        return ()
    if not isinstance(values, list):
        raise ConfigError(f"{where}: a list of {{'name': ..., options...}} objects, got {type(values).__name__}")
    specs = []
    for i, spec in enumerate(values):
        if not isinstance(spec, dict) or not isinstance(spec.get("name"), str) or not spec["name"]:
            raise ConfigError(f"{where}[{i}]: an object with a non-empty string 'name', got {spec!r:.200}")
        specs.append(dict(spec))
    return tuple(specs)


def build_callbacks(specs: Sequence[Mapping[str, Any]], where: str) -> list[Callback]:
    """The callbacks of ``Training.callbacks`` (see :func:`check_callback_specs`).

    Raises:
        ConfigError: an unknown name, options its factory does not take, or a factory that
            raised (naming ``where[i]``).
    """
    out = []
    for i, spec in enumerate(specs):
        at = f"{where}[{i}]"
        options = {k: v for k, v in spec.items() if k != "name"}
        factory = _factory(spec["name"], at)
        try:
            inspect.signature(factory).bind(**options)
        except TypeError as exc:
            raise ConfigError(f"{at}: options {sorted(options)} do not fit callback {spec['name']!r}: {exc}") from exc
        try:
            callback = factory(**options)
        except Exception as exc:  # a plugin's own constructor: its error, named where the config asks for it
            raise ConfigError(
                f"{at}: callback {spec['name']!r} failed to build with options {options}: {type(exc).__name__}: {exc}"
            ) from exc
        if not isinstance(callback, Callback):
            raise ConfigError(f"{at}: {spec['name']!r} built a {type(callback).__name__}, not a Callback")
        out.append(callback)
    return out


def check_unique(callbacks: Sequence[Callback]) -> None:
    """Raises TypeError for an object that is not a :class:`Callback`, ValueError when two
    callbacks share a checkpoint key."""
    seen: dict[str, Callback] = {}
    for cb in callbacks:
        if not isinstance(cb, Callback):
            raise TypeError(f"callbacks: {cb!r:.200} is not a hydragnn.train.callbacks.Callback")
        if cb.name in seen:
            raise ValueError(
                f"two callbacks are named {cb.name!r} ({seen[cb.name]!r} and {cb!r}): give one a distinct `key`"
            )
        seen[cb.name] = cb


@contextlib.contextmanager
def nested(managers: Sequence[contextlib.AbstractContextManager[None]]) -> Iterator[None]:
    """Enter ``managers`` in order, leave them in reverse."""
    with contextlib.ExitStack() as stack:
        for manager in managers:
            stack.enter_context(manager)
        yield

"""The strategy contract: how the training loop talks to a (possibly distributed) engine.

The loop never branches on the strategy's type. It calls, in this order::

    strategy = make_strategy(training_config)        # reads the process group / env
    strategy.setup(model, optimizer_factory)         # wraps the model, builds the optimizer
    strategy.begin_training()                        # (resumed state loaded first)
    for batch in loader:
        batch = strategy.to_device(batch)
        out = strategy.forward(batch)                # the wrapped model
        loss, per_head = strategy.unwrap().loss(out, batch)
        strategy.backward(loss)
        strategy.step()                              # optimizer step (+ sync for LocalSGD), zero grads
    mean = strategy.all_reduce_mean(tensor)          # metrics across ranks
    state = strategy.model_state_dict()              # FULL state on every rank (collective)
    strategy.end_training()                          # also when training fails
    strategy.teardown()

Every strategy's ``model_state_dict()`` is loadable into a plain single-process
:class:`hydragnn.models.HydraModel` (checkpoints written under any strategy reload anywhere).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, ClassVar, TypeAlias, TypeVar, cast

import torch
import torch.distributed as dist
from torch import nn

from hydragnn.models.execution import Execution

from ..config_sections import STRATEGY_SPECS, StrategySpec, declare_strategy
from ..errors import ConfigError
from .flat import FlatStep

if TYPE_CHECKING:
    from hydragnn.models.committee import Committee
    from hydragnn.models.model import HydraModel

OptimizerFactory = Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer]

TrainableModel: TypeAlias = "HydraModel | Committee"
"""The plain model a strategy trains: a :class:`~hydragnn.models.HydraModel` or a
:class:`~hydragnn.models.Committee` (an ``nn.Module`` with ``loss``, ``config`` and ``schema``)."""


DEVICE_WHERE = "NeuralNetwork.Training.device"


def resolve_device(request: str) -> torch.device:
    """The device of a one-process run for ``Training.device``.

    ``"auto"``: torch's current CUDA device when one is visible, else the CPU; ``"cpu"``;
    ``"cuda"`` / ``"cuda:N"``: that GPU, a :class:`ConfigError` naming the key when torch sees
    none or fewer.
    """
    if request == "cpu":
        return torch.device("cpu")
    available = torch.cuda.is_available()
    if request == "auto":
        return torch.device("cuda", torch.cuda.current_device()) if available else torch.device("cpu")
    if not available:
        raise ConfigError(
            f"{DEVICE_WHERE}: {request!r}, but torch {torch.__version__} sees no CUDA device (use 'auto' or 'cpu')"
        )
    index = torch.device(request).index
    index = torch.cuda.current_device() if index is None else index
    if index >= torch.cuda.device_count():
        raise ConfigError(f"{DEVICE_WHERE}: {request!r}, but torch sees {torch.cuda.device_count()} CUDA device(s)")
    return torch.device("cuda", index)


class Strategy:
    """Single-process training; the base of every distributed strategy.

    Subclasses override :meth:`setup` (wrapping), and where needed :meth:`backward`,
    :meth:`step`, :meth:`model_state_dict`, :meth:`optimizer_state_dict`,
    :meth:`load_optimizer_state_dict`.
    """

    name: ClassVar[str] = "none"
    compiles: ClassVar[bool] = True
    """Whether :meth:`compile` may wrap this strategy's forward (``Training.compile``)."""
    flat_step: ClassVar[bool] = True
    """Whether :meth:`begin_training` may lay an Adam / AdamW optimizer out flat (:class:`~.flat.FlatStep`)
    when the execution profile asks for it."""

    def __init__(self, options: dict[str, Any] | None = None) -> None:
        self.options = dict(options or {})
        self.model: nn.Module | None = None  # what forward calls (possibly wrapped)
        self._module: nn.Module | None = None  # the plain model
        self.optimizer: torch.optim.Optimizer | None = None
        self.device = torch.device("cpu")
        self.max_grad_norm: float | None = None  # Training.clip_grad_norm; set before setup()
        self.execution: Execution = Execution.reference()  # the run's profile (train_validate_test sets it)
        self._flat: FlatStep | None = None

    # process information ---------------------------------------------------------------
    @property
    def distributed(self) -> bool:
        return dist.is_available() and dist.is_initialized()

    @property
    def rank(self) -> int:
        return dist.get_rank() if self.distributed else 0

    @property
    def world_size(self) -> int:
        return dist.get_world_size() if self.distributed else 1

    @property
    def local_rank(self) -> int:
        return int(os.environ.get("LOCAL_RANK", "0"))

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    # life cycle ------------------------------------------------------------------------
    def place(self, request: str) -> None:
        """Set :attr:`device` from ``Training.device`` (before :meth:`setup`; see :func:`resolve_device`)."""
        self.device = resolve_device(request)

    def setup(self, model: nn.Module, optimizer_factory: OptimizerFactory) -> None:
        """Move/wrap ``model`` and build its optimizer with ``optimizer_factory(params)``."""
        self._module = model.to(self.device)
        self.model = self._module
        self.optimizer = optimizer_factory(self._module.parameters())

    def begin_training(self) -> None:
        """Called by the loop before its first step: under a profile whose ``optimizer_step`` is
        ``"flat"``, one fused kernel per parameter group for a qualifying Adam / AdamW in a single
        process (:class:`~.flat.FlatStep`)."""
        flat = self.flat_step and self.execution.optimizer_step == "flat"
        if flat and self._flat is None and self.optimizer is not None and not self.distributed:
            self._flat = FlatStep.attach(self.optimizer)

    def end_training(self) -> None:
        """Called by the loop when it returns or fails: parameters and optimizer state get their
        own storage back (the same values)."""
        if self._flat is not None:
            self._flat.release()
            self._flat = None

    def unwrap(self) -> TrainableModel:
        """The plain model (for loss, evaluation and artifacts)."""
        assert self._module is not None, "setup() first"
        return cast("TrainableModel", self._module)  # set up with a HydraModel or a Committee

    def to_device(self, batch: Any) -> Any:
        """``batch`` on :attr:`device`; a PyG batch whose tensors all live there already (a CPU
        batch in CPU training) is returned as it is (``Batch.to`` walks every attribute: 60 us)."""
        store = getattr(batch, "_store", None)
        if store is not None and all(
            not isinstance(v, torch.Tensor) or v.device == self.device for v in store.values()
        ):
            return batch
        return batch.to(self.device)

    def forward(self, batch: Any, **kwargs: Any) -> Any:
        assert self.model is not None, "setup() first"
        return self.model(batch, **kwargs)

    def compile(self) -> None:
        """``Training.compile``: run :meth:`forward` through ``torch.compile(dynamic=True)``, so
        that batches of other node and edge counts reuse one compiled graph (one more for
        evaluation under ``no_grad``). The plain model (:meth:`unwrap`) is unchanged: losses,
        checkpoints and artifacts see it. Strategies whose :attr:`compiles` is false refuse (the
        distributed ones: not tested compiled yet). An interatomic potential with forces takes
        them by ``torch.func.grad`` (:func:`hydragnn.models.derivatives.set_derivatives`): the
        derivative is then part of the compiled forward and the loss's backward is an ordinary
        one, where the default ``autograd.grad(create_graph=True)`` would need a compiled backward
        differentiated again, which torch does not support. The compile options are the execution
        profile's (:meth:`~hydragnn.models.execution.Execution.compile_kwargs`).

        Raises:
            ConfigError: under such a strategy.
        """
        where = "NeuralNetwork.Training.compile"
        if not self.compiles:
            raise ConfigError(f"{where}: single-process training only (strategy {self.name!r}); set it to false")
        from hydragnn.models.derivatives import set_derivatives

        set_derivatives(self.unwrap(), "func")
        model = self.model
        assert model is not None, "setup() first"
        compiled = torch.compile(model, dynamic=True, **self.execution.compile_kwargs(self.device.type))
        self.model = cast(nn.Module, compiled)  # a module compiles to a module

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    def step(self) -> None:
        """One optimizer step (gradients clipped first when ``max_grad_norm`` is set), then zero the gradients."""
        assert self.optimizer is not None, "setup() first"
        self.clip_gradients()
        if self._flat is not None and self._flat.step():
            self._flat.zero_grad()
            return
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    def clip_gradients(self) -> torch.Tensor | None:
        """Scale the gradients so their global 2-norm is at most ``max_grad_norm`` (no-op when unset).

        Returns:
            The norm before clipping (a tensor: no host synchronisation), or ``None``.
        """
        if self.max_grad_norm is None:
            return None
        return torch.nn.utils.clip_grad_norm_(self.unwrap().parameters(), self.max_grad_norm)

    def zero_grad(self) -> None:
        assert self.optimizer is not None, "setup() first"
        self.optimizer.zero_grad(set_to_none=True)

    # state -----------------------------------------------------------------------------
    def consolidate(self) -> None:
        """Make the model replicas agree before an evaluation or a checkpoint.

        Called on every rank at the same point (it may be a collective). A no-op for strategies
        whose replicas never diverge; local SGD averages the parameters of ranks that stepped
        on their own since the last synchronisation.
        """

    def model_state_dict(self) -> dict[str, torch.Tensor]:
        """Full, unsharded state dict of the plain model (a collective under sharding)."""
        return {k: v.detach().clone() for k, v in self.unwrap().state_dict().items()}

    def load_model_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        self.unwrap().load_state_dict(state)

    def optimizer_state_dict(self) -> dict[str, Any] | None:
        """Optimizer state to checkpoint (full; a collective under sharding), or None."""
        assert self.optimizer is not None, "setup() first"
        return self.optimizer.state_dict()

    def load_optimizer_state_dict(self, state: dict[str, Any]) -> None:
        assert self.optimizer is not None, "setup() first"
        self.optimizer.load_state_dict(state)

    # collectives -----------------------------------------------------------------------
    def all_reduce_mean(self, tensor: torch.Tensor) -> torch.Tensor:
        """Mean of ``tensor`` over ranks (a copy; the input is unchanged)."""
        out = tensor.detach().clone()
        if self.distributed:
            dist.all_reduce(out)
            out /= self.world_size
        return out

    def all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        out = tensor.detach().clone()
        if self.distributed:
            dist.all_reduce(out)
        return out

    def barrier(self) -> None:
        if self.distributed:
            dist.barrier()

    def teardown(self) -> None:
        """Release engine resources. Does not destroy a process group it did not create."""


STRATEGIES: dict[str, type[Strategy]] = {"none": Strategy}
"""Registry: ``Training.Parallelism.strategy`` name -> class."""


_S = TypeVar("_S", bound=Strategy)


def register_strategy(cls: type[_S] | None = None, *, spec: StrategySpec | None = None) -> Any:
    """Class decorator: add a :class:`Strategy` subclass to :data:`STRATEGIES` under ``cls.name``.

    ``@register_strategy`` for a strategy whose spec :data:`~hydragnn.train.config_sections.STRATEGY_SPECS`
    already declares (the built-in ones, declared torch-free so that configs validate without
    torch); ``@register_strategy(spec=StrategySpec(name, ...))`` declares a new one, which
    ``Parallelism.strategy`` then accepts. Either way the class's ``name`` must be the spec's.
    """

    def register(klass: type[_S]) -> type[_S]:
        if spec is not None:
            if spec.name != klass.name:
                raise ValueError(f"{klass.__name__}.name is {klass.name!r}, its spec's name {spec.name!r}")
            declare_strategy(spec)
        if klass.name not in STRATEGY_SPECS:
            raise ValueError(
                f"strategy {klass.name!r} has no spec: register it with @register_strategy(spec=StrategySpec(...))"
            )
        if klass.name in STRATEGIES:
            raise ValueError(f"strategy {klass.name!r} registered twice")
        STRATEGIES[klass.name] = klass
        return klass

    return register if cls is None else register(cls)

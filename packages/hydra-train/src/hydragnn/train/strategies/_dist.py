"""Process-group helpers shared by the distributed strategies (no strategy classes here)."""

from __future__ import annotations

import contextlib
import datetime
import os
import sys
import threading
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist

from ..errors import ConfigError, TrainingAborted
from .base import DEVICE_WHERE, Strategy
from .launch import detect_launch, export_torch_env

DEFAULT_TIMEOUT_S = 300.0
_PEER_FAILURE_MARKERS = (
    "Connection closed by peer",
    "Connection reset",
    "Broken pipe",
    "Timed out",
    "timed out",
    "[gloo",
    "gloo/",
    "NCCL",
)


def init_distributed(timeout_s: float = DEFAULT_TIMEOUT_S, backend: str | None = None) -> bool:
    """Initialise the default process group from the launcher's environment, if none exists.

    Reads ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` and ``MASTER_PORT`` (set by ``torchrun``),
    first writing them from the variables of ``srun``, ``mpirun``, ``jsrun`` or a PMI launcher
    when one of those started the process (:mod:`.launch`). Without any launcher (a plain
    ``python`` run) a one-process group on an in-memory store is created, so a distributed
    strategy also runs, trivially, in one process.

    Args:
        timeout_s: timeout of the process group: a collective waiting longer than this on a
            peer raises instead of hanging (gloo honours it for every collective).
        backend: ``"gloo"``, ``"nccl"`` or ``"xccl"``; default ``HYDRAGNN_BACKEND`` when set, else
            ``nccl`` when CUDA (or ROCm) is available, ``xccl`` on Intel XPUs, else ``gloo``.

    Returns:
        ``True`` when this call created the process group (the caller then owns it and
        destroys it at teardown), ``False`` when one already existed.

    Raises:
        ConfigError: ``timeout_s`` is not a positive number.
    """
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or timeout_s <= 0:
        raise ConfigError(f"Training.Parallelism.timeout_s: expected a number > 0, found {timeout_s!r}")
    if not dist.is_available():
        raise ConfigError("Training.Parallelism: torch.distributed is not available in this torch build")
    if dist.is_initialized():
        return False
    launch = detect_launch()
    if launch is not None and launch.launcher != "torchrun":
        export_torch_env(launch)
    if backend is None:
        backend = os.environ.get("HYDRAGNN_BACKEND") or _default_backend()
    timeout = datetime.timedelta(seconds=float(timeout_s))
    if "WORLD_SIZE" in os.environ and "MASTER_ADDR" in os.environ:
        if backend == "nccl":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group(backend=backend, timeout=timeout)
    else:
        store = dist.HashStore()  # pyright: ignore[reportPrivateImportUsage]  # public, but outside torch.distributed.__all__
        dist.init_process_group(backend=backend, store=store, rank=0, world_size=1, timeout=timeout)
    return True


def _default_backend() -> str:
    if torch.cuda.is_available():
        return "nccl"
    xpu = getattr(torch, "xpu", None)
    if xpu is not None and xpu.is_available():
        return "xccl"
    return "gloo"


def destroy_distributed() -> None:
    """Barrier-free destruction of the default process group (no-op when none exists)."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


WATCHDOG_EXIT_CODE = 75
"""Exit status of a rank stopped by the watchdog of :func:`collective`."""


def _watchdog_abort(rank: int, world: int, name: str, what: str, timeout_s: float) -> None:
    sys.stderr.write(
        f"hydragnn.train: TrainingAborted: rank {rank}/{world}: {what} did not finish within "
        f"timeout_s={timeout_s:g} s under strategy {name!r} -- a peer rank is hung or dead; "
        f"aborting this rank (exit {WATCHDOG_EXIT_CODE})\n"
    )
    sys.stderr.flush()
    os._exit(WATCHDOG_EXIT_CODE)


@contextlib.contextmanager
def collective(strategy: Strategy, what: str) -> Iterator[None]:
    """Bound a collective operation in time and name its failures.

    * A failed collective (gloo: "Connection closed by peer", a timeout) becomes
      :class:`TrainingAborted` naming this rank, the operation and ``timeout_s``.
    * A watchdog thread ends the process (a message on stderr, exit status
      :data:`WATCHDOG_EXIT_CODE`) when the operation has not returned after ``timeout_s``:
      gloo does not apply the process-group timeout to every collective (DDP's buffer
      broadcast in the forward waits for a hung peer forever), so without it a rank whose peer
      hangs would hang too. The operation includes its computation: ``timeout_s`` must exceed
      the longest forward / backward / step.
    """
    timeout_s = float(getattr(strategy, "timeout_s", DEFAULT_TIMEOUT_S))
    watchdog = None
    if strategy.world_size > 1:
        args = (strategy.rank, strategy.world_size, strategy.name, what, timeout_s)
        watchdog = threading.Timer(timeout_s, _watchdog_abort, args=args)
        watchdog.daemon = True
        watchdog.start()
    try:
        yield
    except TrainingAborted:
        raise
    except RuntimeError as exc:  # gloo: "Connection closed by peer", "Timed out waiting ..."
        text = str(exc)
        if isinstance(exc, dist.DistError) or any(m in text for m in _PEER_FAILURE_MARKERS):
            raise TrainingAborted(
                f"rank {strategy.rank}/{strategy.world_size}: {what} failed under strategy "
                f"{strategy.name!r} -- a peer rank died or did not answer within "
                f"timeout_s={timeout_s:g} s ({type(exc).__name__}: {text.splitlines()[0] if text else ''})"
            ) from exc
        raise
    finally:
        if watchdog is not None:
            watchdog.cancel()


@torch.no_grad()
def broadcast_module(module: torch.nn.Module, src: int = 0) -> None:
    """Copy rank ``src``'s parameters and buffers to every rank (same start everywhere)."""
    if dist.is_initialized() and dist.get_world_size() > 1:
        for tensor in list(module.parameters()) + list(module.buffers()):
            dist.broadcast(tensor.data, src=src)


class DistributedStrategy(Strategy):
    """Common base of the process-group strategies: owns the group when it created it.

    Options (``Training.Parallelism``): ``timeout_s`` (default 300).
    """

    name = "_distributed"
    compiles = False  # Training.compile under a process group: not tested yet
    flat_step = False  # DDP's gradient buckets and sharded engines keep their own layout

    def __init__(self, options: dict[str, Any] | None = None) -> None:
        super().__init__(options)
        self.timeout_s = float(self.options.get("timeout_s", DEFAULT_TIMEOUT_S))
        self._owns_group = init_distributed(self.timeout_s)
        if torch.cuda.is_available():
            self.device = torch.device("cuda", self.local_rank)

    def place(self, request: str) -> None:
        """``Training.device`` for a rank: "auto" / "cuda" keep its ``LOCAL_RANK``'s GPU (the CPU
        where torch sees none: "cuda" is then refused); "cpu" needs a CPU backend (gloo)."""
        where = DEVICE_WHERE
        if request.startswith("cuda:"):
            raise ConfigError(f"{where}: {request!r}; each rank trains on its LOCAL_RANK's GPU: use 'cuda' or 'auto'")
        if request == "cuda" and self.device.type != "cuda":
            raise ConfigError(f"{where}: 'cuda', but torch {torch.__version__} sees no CUDA device on rank {self.rank}")
        if request == "cpu":
            if dist.get_backend() == "nccl":
                raise ConfigError(f"{where}: 'cpu' under the nccl backend; set HYDRAGNN_BACKEND=gloo for CPU ranks")
            self.device = torch.device("cpu")

    def forward(self, batch: Any, **kwargs: Any) -> Any:
        with collective(self, "forward"):
            return super().forward(batch, **kwargs)

    def backward(self, loss: torch.Tensor) -> None:
        with collective(self, "backward (gradient all-reduce)"):
            super().backward(loss)

    def step(self) -> None:
        with collective(self, "optimizer step"):
            super().step()

    def all_reduce_mean(self, tensor: torch.Tensor) -> torch.Tensor:
        with collective(self, "all_reduce_mean"):
            return super().all_reduce_mean(tensor)

    def all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        with collective(self, "all_reduce_sum"):
            return super().all_reduce_sum(tensor)

    def barrier(self) -> None:
        with collective(self, "barrier"):
            super().barrier()

    def teardown(self) -> None:
        """Drop the engine; destroy the process group only if this strategy created it."""
        self.model = None
        self.optimizer = None
        if self._owns_group:
            destroy_distributed()
            self._owns_group = False

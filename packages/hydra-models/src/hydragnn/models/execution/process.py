"""Process tuning for processes that share their cores (threads, OpenMP waiting, allocator, compile
options), chosen only where the user has not: the ``process`` part of an execution profile.

Nothing here runs on import: importing a HydraGNN layer changes neither the environment nor the
allocator. A program opts in by calling :func:`configure_threads` first; a profile whose
``process`` is true does it for a training run and for the first ``HydraCalculator`` of a process
(:mod:`hydragnn.models.execution.profiles`), and the command lines call its first step,
:func:`prefer_passive_waiting`, before anything loads torch when the config's profile asks for it. Each setting yields to the user's
own (``OMP_WAIT_POLICY``, ``OMP_NUM_THREADS``, ``MKL_DYNAMIC``, ``MALLOC_*`` / ``GLIBC_TUNABLES``,
a preloaded allocator).

OpenMP's default busy waiting made training 25-30x slower on a 2-core machine with one other
busy process; passive waiting (``OMP_WAIT_POLICY=PASSIVE``) brought it back at the same thread
count. OpenMP reads that variable once, when torch loads it, so :func:`prefer_passive_waiting`
sets it only when it is unset and torch is not loaded yet.

The thread count: ``OMP_NUM_THREADS`` when given (torchrun gives 1 per rank when it is unset),
else the usable cores divided by the ranks on this node (``LOCAL_WORLD_SIZE``), so that the ranks
of a node never ask for more threads than there are cores. The allocator (glibc only, and only
when no ``MALLOC_*`` / ``GLIBC_TUNABLES`` setting or preloaded jemalloc / tcmalloc / mimalloc
says otherwise): freed blocks below :func:`reuse_below` (a 16th of memory, 32 MiB to 1 GiB) are
kept for reuse instead of being returned to the system, and so is up to :func:`keep_at_top` of
free memory at the top of the heap, because every fresh mapping costs a page fault per 4 KiB
touched: like PyTorch's CUDA caching allocator, a process keeps the memory of its peak for reuse.
MKL sizes its threads per call (:func:`set_intra_op_threads`): ``torch.set_num_threads`` would
make every MKL vector-math call use all threads, and waking a passive thread for a few hundred
elements costs more than the work. The measurements behind these choices are in
docs/notes/architecture_details.md. This module imports nothing heavy.
"""

from __future__ import annotations

import ctypes
import functools
import os
import sys
from collections.abc import Mapping, MutableMapping
from typing import Any

__all__ = [
    "choose_threads",
    "compile_kwargs",
    "compiled_kernel_threads",
    "configure_threads",
    "keep_at_top",
    "keep_freed_blocks",
    "mkl_threads_per_call",
    "prefer_passive_waiting",
    "set_intra_op_threads",
    "wait_policy",
]

REUSE_BELOW = 32 << 20
"""Smallest mmap threshold set: blocks below it come from (and go back to) the heap (glibc's own
dynamic threshold stops here)."""
REUSE_BELOW_MAX = 1 << 30
"""Largest mmap threshold set."""
KEEP_AT_TOP_MAX = 1 << 30
"""At most this much free memory stays at the top of the heap (glibc's trim threshold)."""
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters
_MALLOC_ENV = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_", "GLIBC_TUNABLES")
_ALLOCATORS = ("jemalloc", "tcmalloc", "mimalloc")

_PASSIVE_SET_HERE = False


def prefer_passive_waiting(environ: MutableMapping[str, str] = os.environ) -> bool:
    """Set ``OMP_WAIT_POLICY=PASSIVE`` when it is unset and torch (OpenMP) is not loaded yet."""
    global _PASSIVE_SET_HERE
    if "OMP_WAIT_POLICY" in environ or "torch" in sys.modules:
        return False
    environ["OMP_WAIT_POLICY"] = "PASSIVE"
    _PASSIVE_SET_HERE = environ is os.environ
    return True


def _usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def choose_threads(environ: MutableMapping[str, str] = os.environ, cores: int | None = None) -> tuple[int, str]:
    """``(intra-op threads per process, why)``: ``OMP_NUM_THREADS`` when it is a positive
    integer, else ``cores`` (default: the usable cores) over ``LOCAL_WORLD_SIZE`` ranks, at least 1."""
    given = environ.get("OMP_NUM_THREADS", "").strip()
    if given.isdigit() and int(given) > 0:
        return int(given), "OMP_NUM_THREADS"
    cores = _usable_cores() if cores is None else cores
    ranks = environ.get("LOCAL_WORLD_SIZE", "1").strip()
    ranks_n = int(ranks) if ranks.isdigit() and int(ranks) > 0 else 1
    return max(1, cores // ranks_n), f"{cores} cores" + (f"/{ranks_n} ranks" if ranks_n > 1 else "")


def _physical_memory() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0


def reuse_below() -> int:
    """The mmap threshold set: a 16th of physical memory, between :data:`REUSE_BELOW` and
    :data:`REUSE_BELOW_MAX` (blocks below it are kept for reuse when freed)."""
    return min(REUSE_BELOW_MAX, max(REUSE_BELOW, _physical_memory() // 16))


def keep_at_top() -> int:
    """Bytes of free heap top kept (the trim threshold): a 16th of physical memory, between
    ``2 * REUSE_BELOW`` (the most glibc's own dynamic rule reaches) and :data:`KEEP_AT_TOP_MAX`."""
    return min(KEEP_AT_TOP_MAX, max(2 * REUSE_BELOW, _physical_memory() // 16))


def keep_freed_blocks(environ: MutableMapping[str, str] = os.environ) -> str:
    """Have glibc's malloc keep freed blocks below :func:`reuse_below` for reuse (the mmap
    threshold) and up to :func:`keep_at_top` free at the top of the heap (trim threshold), unless
    the environment chose the allocator or its settings. Returns what is in force, in words."""
    if any(key in environ for key in _MALLOC_ENV):
        return "malloc settings from the environment"
    preload = environ.get("LD_PRELOAD", "")
    if any(name in preload for name in _ALLOCATORS):
        return "preloaded allocator"
    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version  # noqa: B018 - glibc only
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return "system allocator"
    top, below = keep_at_top(), reuse_below()
    if mallopt(_M_MMAP_THRESHOLD, below) != 1 or mallopt(_M_TRIM_THRESHOLD, top) != 1:
        return "glibc malloc defaults"
    return f"malloc reuses freed blocks below {below >> 20} MiB, keeps {top >> 20} MiB free (set by hydragnn)"


def mkl_threads_per_call(environ: Mapping[str, str] = os.environ) -> bool:
    """Let MKL use fewer threads than torch's count on small calls (MKL's dynamic mode; large
    calls keep every thread), unless ``MKL_DYNAMIC`` is set. ``torch.set_num_threads`` turns the
    mode off, so call this after it (:func:`set_intra_op_threads` does). Returns whether it is on;
    false where torch has no MKL (its exported ``MKL_Set_Dynamic(int)`` is the switch)."""
    if "MKL_DYNAMIC" in environ:
        return False
    import torch

    if not torch.backends.mkl.is_available():
        return False
    switch = _mkl_set_dynamic(os.path.dirname(torch.__file__))
    if switch is None:
        return False
    switch(1)
    return True


@functools.cache
def _mkl_set_dynamic(torch_dir: str):
    """``MKL_Set_Dynamic(int)`` as exported by ``libtorch_cpu``, or None (looked up once)."""
    try:
        switch = ctypes.CDLL(os.path.join(torch_dir, "lib", "libtorch_cpu.so")).MKL_Set_Dynamic
    except (OSError, AttributeError):
        return None
    switch.argtypes, switch.restype = [ctypes.c_int], None
    return switch


def set_intra_op_threads(threads: int) -> None:
    """``torch.set_num_threads(threads)``, then :func:`mkl_threads_per_call`."""
    import torch

    torch.set_num_threads(threads)
    mkl_threads_per_call()


def configure_threads(environ: MutableMapping[str, str] = os.environ) -> str:
    """The process-wide defaults of this module, applied on request (never on import).

    :func:`prefer_passive_waiting` (effective only before torch loads: call this first in a
    program to get it), then, importing torch, :func:`choose_threads` applied to torch (lowering
    its count only, never raising it), :func:`mkl_threads_per_call` and :func:`keep_freed_blocks`.
    Calling it again changes nothing more. Returns a short line of the intra-op threads and the
    OpenMP wait policy in force, each with where it came from, e.g.
    ``threads: 2 intra-op (2 cores), OpenMP passive (set by hydragnn)``."""
    prefer_passive_waiting(environ)
    threads, why = choose_threads(environ)
    import torch

    if why != "OMP_NUM_THREADS" and torch.get_num_threads() > threads:
        torch.set_num_threads(threads)
    if torch.get_num_threads() != threads:
        threads, why = torch.get_num_threads(), "set in torch"
    mkl_threads_per_call(environ)
    keep_freed_blocks(environ)
    return f"threads: {threads} intra-op ({why}), {wait_policy(environ)}"


def compiled_kernel_threads(environ: Mapping[str, str] = os.environ) -> int | None:
    """Threads for the CPU kernels ``torch.compile`` generates (Inductor's ``cpp.threads``): 1 when
    OpenMP waits passively and torch runs more than one intra-op thread, else ``None`` (Inductor's
    default, the intra-op count).

    Each generated kernel is an OpenMP parallel region and a compiled step runs hundreds of them;
    under passive waiting every one puts its threads to sleep and wakes them again: MACE's compiled
    training step on two threads took 6.4 s, 0.18 s with the generated kernels on one thread (the
    ATen kernels a compiled graph calls, matrix products, keep the intra-op threads)."""
    torch = sys.modules.get("torch")
    if torch is None or environ.get("OMP_WAIT_POLICY", "").upper() != "PASSIVE":
        return None
    return 1 if torch.get_num_threads() > 1 else None


def compile_kwargs(device_type: str, given: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """``torch.compile`` keyword arguments: ``given``, with Inductor's ``cpp.threads`` from
    :func:`compiled_kernel_threads` on CPU unless ``given`` names ``mode`` (torch takes a mode or
    options, not both) or its own ``options["cpp.threads"]``."""
    kwargs = dict(given or {})
    threads = compiled_kernel_threads() if device_type == "cpu" else None
    if threads is not None and "mode" not in kwargs:
        kwargs["options"] = {"cpp.threads": threads, **(kwargs.get("options") or {})}
    return kwargs


def wait_policy(environ: Mapping[str, str] = os.environ) -> str:
    """OpenMP's wait policy in force and its origin, in words. Unset means torch loaded before
    :func:`prefer_passive_waiting` ran: OpenMP then spins a while before sleeping (its default)."""
    policy = environ.get("OMP_WAIT_POLICY")
    if policy is None:
        return "OpenMP spins (set OMP_WAIT_POLICY=PASSIVE before torch)"
    here = _PASSIVE_SET_HERE and environ is os.environ and policy == "PASSIVE"
    return f"OpenMP {policy.lower()} ({'set by hydragnn' if here else 'from environment'})"

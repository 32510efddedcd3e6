"""Process tuning of the execution layer: passive OpenMP waiting, threads per torchrun rank and malloc block
reuse, only where unset, and only on an explicit call."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest

from hydragnn.models.execution.process import (
    choose_threads,
    configure_threads,
    keep_at_top,
    prefer_passive_waiting,
    reuse_below,
)


@pytest.mark.parametrize(
    ("environ", "cores", "expected"),
    [
        ({"OMP_NUM_THREADS": "3", "LOCAL_WORLD_SIZE": "2"}, 16, (3, "OMP_NUM_THREADS")),
        ({"LOCAL_WORLD_SIZE": "2"}, 16, (8, "16 cores/2 ranks")),
        ({"LOCAL_WORLD_SIZE": "4"}, 2, (1, "2 cores/4 ranks")),
        ({}, 6, (6, "6 cores")),
        ({"OMP_NUM_THREADS": "0", "LOCAL_WORLD_SIZE": "two"}, 4, (4, "4 cores")),
    ],
)
def test_thread_count_fits_the_ranks_of_a_node(environ, cores, expected):
    assert choose_threads(environ, cores=cores) == expected


def test_wait_policy_is_never_set_once_torch_is_loaded_or_over_the_users():
    import torch  # noqa: F401  (loaded: OpenMP has read its environment already)

    environ: dict[str, str] = {}
    assert prefer_passive_waiting(environ) is False and environ == {}
    environ = {"OMP_WAIT_POLICY": "ACTIVE"}
    assert prefer_passive_waiting(environ) is False and environ == {"OMP_WAIT_POLICY": "ACTIVE"}


_PROBE = """
import json, os, sys
first = sys.argv[1]
if first == "torch":
    import torch
elif first == "hydragnn":
    import hydragnn.data, hydragnn.models.execution
from hydragnn.models.execution import configure_threads
notice = configure_threads()
import torch
print(json.dumps({"policy": os.environ.get("OMP_WAIT_POLICY"), "threads": torch.get_num_threads(), "notice": notice,
                  "mkl": torch.backends.mkl.is_available()}))
"""


def _probe(first: str, **env: str) -> dict:
    environ = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "OMP_NUM_THREADS")}
    environ.update(env)
    out = subprocess.run(
        [sys.executable, "-c", _PROBE, first], env=environ, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_fresh_process_waits_passively_with_threads_per_rank():
    cores = len(os.sched_getaffinity(0))
    got = _probe("hydragnn", LOCAL_WORLD_SIZE=str(cores))
    assert got["policy"] == "PASSIVE"
    assert got["threads"] == 1
    ranks = f"/{cores} ranks" if cores > 1 else ""
    assert got["notice"] == f"threads: 1 intra-op ({cores} cores{ranks}), OpenMP passive (set by hydragnn)"


def test_the_notice_names_a_wait_policy_from_the_environment():
    got = _probe("hydragnn", OMP_WAIT_POLICY="ACTIVE", OMP_NUM_THREADS="1")
    assert got["policy"] == "ACTIVE"
    assert got["notice"] == "threads: 1 intra-op (OMP_NUM_THREADS), OpenMP active (from environment)"


def test_a_process_that_loaded_torch_first_is_told_how_to_wait_passively():
    got = _probe("torch")
    assert got["policy"] is None
    assert "OpenMP spins (set OMP_WAIT_POLICY=PASSIVE before torch)" in got["notice"]
    assert len(got["notice"]) < 100 and "\n" not in got["notice"]


_FAULTS = """
import json, resource, sys
import torch
from hydragnn.models.execution.process import keep_freed_blocks
a, b = torch.rand(1 << 20), torch.rand(1 << 20)  # 4 MiB each: above glibc's initial mmap threshold

def faults():
    start = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(50):
        c = a * b
        d = c + a
        del c, d
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - start

def peak_faults():  # 48 blocks of 4 MiB (192 MiB) freed together: glibc's 64 MiB trim threshold returns them
    start = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(10):
        blocks = [a * b for _ in range(48)]
        del blocks
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - start

before, peak_before = faults(), peak_faults()
said = keep_freed_blocks()
faults(), peak_faults()  # the heap grows once
print(json.dumps({"before": before, "after": faults(), "peak_before": peak_before, "peak_after": peak_faults(), "said": said}))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_freed_blocks_are_reused_unless_the_environment_chose():
    """Kept blocks: 50 rounds of 4 MiB element-wise products fault (almost) no fresh pages in, nor
    do 10 rounds of a 192 MiB working set freed at once (kept at the heap top, not trimmed)."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "GLIBC_TUNABLES"}
    run = subprocess.run([sys.executable, "-c", _FAULTS], env=environ, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    got = json.loads(run.stdout.strip().splitlines()[-1])
    assert got["said"].startswith(f"malloc reuses freed blocks below {reuse_below() >> 20} MiB")
    assert got["after"] * 10 < got["before"], got
    if keep_at_top() > 256 << 20:  # a machine with more than 4 GiB
        assert got["peak_after"] * 10 < got["peak_before"], got
    run = subprocess.run([sys.executable, "-c", _FAULTS], env={**environ, "MALLOC_TRIM_THRESHOLD_": "0"},
                         capture_output=True, text=True, timeout=300)  # fmt: skip
    assert json.loads(run.stdout.strip().splitlines()[-1])["said"] == "malloc settings from the environment"


_WAKES = """
import json, resource
import torch
from hydragnn.models.execution.process import set_intra_op_threads
x = torch.rand(300) + 0.5

def wakes():  # voluntary context switches of every thread: a passive OpenMP thread sleeps after each wake
    start = resource.getrusage(resource.RUSAGE_SELF).ru_nvcsw
    for _ in range(200):
        torch.exp(x)
        torch.sqrt(x)
    return resource.getrusage(resource.RUSAGE_SELF).ru_nvcsw - start

torch.set_num_threads(2)
before = wakes()
set_intra_op_threads(2)
print(json.dumps({"before": before, "after": wakes(), "threads": torch.get_num_threads()}))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="getrusage context switches")
def test_small_mkl_calls_wake_no_second_thread():
    """MKL's vector math on 300 elements: after ``torch.set_num_threads(2)`` each call wakes the
    other (passive) thread; after :func:`set_intra_op_threads` MKL keeps small calls on one."""
    import torch

    if not torch.backends.mkl.is_available():
        pytest.skip("torch without MKL")
    environ = {k: v for k, v in os.environ.items() if k not in ("MKL_DYNAMIC", "OMP_NUM_THREADS")}
    environ["OMP_WAIT_POLICY"] = "PASSIVE"
    run = subprocess.run([sys.executable, "-c", _WAKES], env=environ, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    got = json.loads(run.stdout.strip().splitlines()[-1])
    assert got["threads"] == 2
    assert got["before"] >= 200 and got["after"] * 10 < got["before"], got


_IMPORT_ONLY = """
import ctypes, json, os, sys
for name in os.environ.get("BASELINE", "").split():  # dependencies' own import-time settings
    __import__(name)
before = dict(os.environ)
for name in sys.argv[1:]:
    __import__(name)


class MallInfo2(ctypes.Structure):
    _fields_ = [(f, ctypes.c_size_t) for f in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
                                               "uordblks", "fordblks", "keepcost")]


libc = ctypes.CDLL(None)
libc.mallinfo2.restype, libc.malloc.restype, libc.malloc.argtypes = MallInfo2, ctypes.c_void_p, [ctypes.c_size_t]
if os.environ.get("CONTROL"):
    from hydragnn.models.execution.process import keep_freed_blocks
    keep_freed_blocks()
maps = libc.mallinfo2().hblks
libc.malloc(24 << 20)  # glibc maps it on its own unless the mmap threshold was raised (by keep_freed_blocks)
changed = {k: (before.get(k), os.environ.get(k)) for k in before.keys() | os.environ.keys() if before.get(k) != os.environ.get(k)}
print(json.dumps({"changed": changed, "mapped": libc.mallinfo2().hblks - maps == 1, "torch": "torch" in sys.modules}))
"""


def import_only(*modules: str, **env: str) -> dict:
    """Import ``modules`` in a fresh process without OpenMP / malloc settings in its environment:
    ``{"changed": {name: [before, after]}, "mapped": bool, "torch": bool}``, where ``mapped``
    says a 24 MiB malloc got its own mapping (glibc's mmap threshold untouched)."""
    environ = {k: v for k, v in os.environ.items()
               if not k.startswith(("OMP_", "MALLOC_", "MKL_")) and k not in ("GLIBC_TUNABLES", "LD_PRELOAD")}  # fmt: skip
    run = subprocess.run([sys.executable, "-c", _IMPORT_ONLY, *modules], env={**environ, **env}, capture_output=True,
                         text=True, timeout=300)  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallinfo2")
def test_importing_the_execution_layer_changes_nothing_process_wide():
    """No environment variable set (OMP_WAIT_POLICY unset stays unset) and glibc's mmap threshold
    untouched; the control shows the probe sees :func:`keep_freed_blocks`' threshold."""
    got = import_only("hydragnn.data", "hydragnn.data.threads", "hydragnn.models.execution")
    assert got == {"changed": {}, "mapped": True, "torch": False}
    assert import_only("hydragnn.data", CONTROL="1")["mapped"] is False


LAYER_MODULES = (
    "hydragnn.data.neighbors.search",
    "hydragnn.data.io.conversion",
    "hydragnn.models.model",
    "hydragnn.models.encoders.mace",
    "hydragnn.train.pipeline",
    "hydragnn.train.strategies",
    "hydragnn.infer.calculator",
    "hydragnn.infer.ase",
)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallinfo2")
@pytest.mark.skipif(
    any(importlib.util.find_spec(f"hydragnn.{layer}") is None for layer in ("models", "train", "infer")),
    reason="the other layers are not installed (hydra-data alone)",
)
def test_importing_every_layer_changes_nothing_process_wide():
    """The heavy modules of all four layers (torch, PyG, e3nn loaded): no environment variable set,
    glibc's mmap threshold untouched. Thread and allocator settings are configure_threads()'s.
    PyG itself sets TORCHINDUCTOR_CACHE_DIR when imported: it is imported first, as the baseline."""
    got = import_only(*LAYER_MODULES, BASELINE="torch_geometric")
    assert got["changed"] == {} and got["mapped"] is True and got["torch"] is True


def test_configure_threads_is_the_explicit_call_and_it_sets_the_wait_policy_first():
    from hydragnn import data, models

    assert models.execution.configure_threads is configure_threads
    with pytest.raises(AttributeError, match="configure_threads moved: import it from hydragnn.models.execution"):
        data.configure_threads  # noqa: B018  (the data layer no longer tunes the process)
    got = _probe("none")
    assert got["policy"] == "PASSIVE" and "OpenMP passive (set by hydragnn)" in got["notice"]


def test_compiled_kernels_run_on_one_thread_only_under_passive_waiting_with_threads(monkeypatch):
    import torch

    from hydragnn.models.execution.process import compiled_kernel_threads

    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    assert compiled_kernel_threads({"OMP_WAIT_POLICY": "PASSIVE"}) == 1
    assert compiled_kernel_threads({"OMP_WAIT_POLICY": "passive"}) == 1
    assert compiled_kernel_threads({"OMP_WAIT_POLICY": "ACTIVE"}) is None
    assert compiled_kernel_threads({}) is None  # OpenMP spins a while: Inductor's own default
    monkeypatch.setattr(torch, "get_num_threads", lambda: 1)
    assert compiled_kernel_threads({"OMP_WAIT_POLICY": "PASSIVE"}) is None


def test_compile_kwargs_add_one_kernel_thread_on_cpu_unless_given(monkeypatch):
    import torch

    from hydragnn.models.execution.process import compile_kwargs

    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    assert compile_kwargs("cpu") == {"options": {"cpp.threads": 1}}
    assert compile_kwargs("cuda") == {}
    assert compile_kwargs("cpu", {"options": {"cpp.threads": 2}}) == {"options": {"cpp.threads": 2}}
    assert compile_kwargs("cpu", {"mode": "max-autotune"}) == {"mode": "max-autotune"}
    assert compile_kwargs("cpu", {"backend": "eager"}) == {"backend": "eager", "options": {"cpp.threads": 1}}

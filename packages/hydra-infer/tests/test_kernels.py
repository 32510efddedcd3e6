"""Triton inference kernels (issue #5).

Kernel correctness runs in a subprocess with ``TRITON_INTERPRET=1`` set before triton is
imported (triton reads the flag when kernels are decorated; the rest of the suite runs
without the interpreter): each Triton primitive vs the primitive's stock forward (values and
gradients, float32 / float64), then patched vs stock tiny SchNet / PAINN MLIPs (energies,
forces, a sink-padded batch, GPS, checkpointing). Skipped when triton is not installed (``hydra-infer[kernels]``).
Eligibility, ``install`` and the ``available`` reasons are tested in-process.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from infer_helpers import tiny_model

from hydragnn.infer.kernels import available, install
from hydragnn.models.nn import Primitive

SCRIPTS = Path(__file__).parent / "kernel_scripts"
HAS_TRITON = importlib.util.find_spec("triton") is not None
needs_triton = pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed (hydra-infer[kernels])")


def _run_interpreted(script: str) -> dict:
    env = dict(os.environ, TRITON_INTERPRET="1", OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, str(SCRIPTS / script)], env=env, capture_output=True, text=True, timeout=600)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    assert lines, f"{script} printed no report (rc {proc.returncode}):\n{proc.stdout}\n{proc.stderr[-4000:]}"
    report = json.loads(lines[-1])
    assert proc.returncode == 0 and report["ok"], json.dumps(report, indent=1) + "\n" + proc.stderr[-4000:]
    return report


@needs_triton
def test_fused_ops_match_torch_reference_under_interpreter():
    report = _run_interpreted("check_ops.py")
    assert {"float32", "float64"} <= set(report["max_rel_err"])


@needs_triton
def test_patched_models_match_stock_under_interpreter():
    report = _run_interpreted("check_models.py")
    assert report["available"] == [True, None]
    keys = ("SchNet/fp32", "SchNet/fp64", "PAINN/fp32", "PAINN/fp64", "SchNet+GPS/fp64", "PAINN+checkpointing/fp64")
    for key in keys:
        assert report[key]["forces"] <= (1e-5 if key.endswith("fp32") else 1e-10)


# --------------------------------------------------------------------------- in-process
KERNEL_PRIMITIVES = {"SchNet": {"RadialFilter", "ContinuousFilterConv"}, "PAINN": {"EquivariantMessage"}}


@pytest.mark.parametrize("encoder", ["SchNet", "PAINN"])
def test_install_returns_patched_copy_with_identical_state(encoder):
    model = tiny_model(mpnn_type=encoder).requires_grad_(True)
    patched, why = install(model)
    assert why is None
    assert patched is not model and patched.encoder is not model.encoder
    assert type(patched.encoder) is type(model.encoder)  # the encoder is not replaced: its primitives are
    on_triton = {type(m).__name__ for m in patched.modules() if isinstance(m, Primitive) and m.backend == "triton"}
    assert on_triton == KERNEL_PRIMITIVES[encoder]
    assert all(
        m.backend == "torch" for m in model.modules() if isinstance(m, Primitive)
    )  # the stock model is untouched
    ref, got = model.state_dict(), patched.state_dict()
    assert ref.keys() == got.keys()
    assert all(torch.equal(ref[k], got[k]) and ref[k].dtype == got[k].dtype for k in ref)
    assert not any(p.requires_grad for p in patched.parameters())
    assert all(p.requires_grad for p in model.parameters())
    assert not patched.training


def test_install_refuses_models_without_kernel_primitives_and_16_bit_dtypes():
    egnn = tiny_model(mpnn_type="EGNN")
    same, why = install(egnn)
    assert same is egnn and why.startswith("encoder EGNN has no inference kernels")
    assert "RadialFilter" in why  # names what the kernels implement
    bf16 = tiny_model(precision="bf16")
    same, why = install(bf16)
    assert same is bf16 and "bfloat16" in why and "float32 and float64" in why


def test_backend_switch_is_per_primitive_and_reversible():
    """use_backend switches only the primitives a backend implements; None restores the stock forward."""
    from hydragnn.models.nn import use_backend

    model = tiny_model(global_attn_engine="GPS")  # GPS mixers around SchNet convolutions
    patched, why = install(model)
    assert why is None
    assert patched.encoder.mixers is not None  # GPS is no longer a reason to refuse the kernels
    on_triton = {type(m).__name__ for m in patched.modules() if isinstance(m, Primitive) and m.backend == "triton"}
    assert on_triton == KERNEL_PRIMITIVES["SchNet"]
    report = use_backend(patched, None)
    assert report.switched == () and all(m.backend == "torch" for m in patched.modules() if isinstance(m, Primitive))


def test_available_cpu_without_interpreter(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    ok, why = available("cpu")
    assert not ok and "TRITON_INTERPRET=1" in why


def test_available_without_triton(monkeypatch):
    monkeypatch.setitem(sys.modules, "triton", None)  # import triton -> ImportError
    for device in ("cpu", "cuda"):
        ok, why = available(device)
        assert not ok and why.startswith("triton is not installed")


def test_available_other_device():
    ok, why = available("meta")
    assert not ok and "not on meta" in why


def test_prepare_reasons(monkeypatch):
    from hydragnn.infer.kernels import prepare

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    patched, reasons = prepare(tiny_model(), "cpu")
    assert patched is None and [code for code, _ in reasons] == ["device"]
    monkeypatch.setitem(sys.modules, "triton", None)
    patched, reasons = prepare(tiny_model(), "cpu")
    assert patched is None and reasons[0][0] == "dependency" and "triton is not installed" in reasons[0][1]

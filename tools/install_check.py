#!/usr/bin/env python3
"""Run the README's install lines in a fresh virtual environment, as a user would.

    python tools/install_check.py --dist dist [--venv DIR] [--keep]

Reads the ``pip install`` lines between ``<!-- install-lines:begin -->`` and
``<!-- install-lines:end -->`` in README.md (the ones a user copies), then, in one new venv
holding only torch (the CPU build this machine has, as the README tells CPU users to install
first):

1. ``hydra-data`` alone, then ``hydra-models`` on top: each imports, its version is its
   metadata's, and nothing of the layers above it (nor an optional extra) came along;
2. each README line in order (inference only, then, after uninstalling ``hydra-infer`` so
   that the environment is hydra-models' closure again, training, then everything), each
   followed by the checks for what that line promises (imports, the command-line tools on the
   venv's PATH: ``hydragnn-evaluate`` and ``hydragnn-export`` for the inference line, ``hydragnn-train`` and
   ``hydragnn-predict`` for the training line; a calculator answering on a real model artifact
   for the inference line; for the ``hydragnn`` line, the top-level package: ``import hydragnn``
   loads no torch, reaches the four layers as attributes from wheels in one site-packages, and
   gives the seed's ``hydragnn.preprocess`` and ``hydragnn.utils.model``).

``dist`` replaces the README's ``dist`` (where ``nox -s wheels`` writes). The layering proof
(docs/ARCHITECTURE.md: an arrow is the only allowed import direction) is part of it: a line that
brought a forbidden distribution fails. Incremental installs
in one venv give the same environment as a fresh one per line (each line's closure contains the
previous one's), at the cost of one torch install instead of five.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import re
import shlex
import subprocess
import sys
import tempfile
import textwrap

ROOT = pathlib.Path(__file__).resolve().parent.parent
BEGIN, END = "<!-- install-lines:begin -->", "<!-- install-lines:end -->"

# public names that need an optional extra (importing them without it is a clear ImportError)
OPTIONAL = {"hydra-infer": ("HydraTorchSimModel",)}

# what an environment holding this distribution (and what it needs) must NOT hold
FORBIDDEN = {
    "hydra-data": ("hydra-models", "hydra-train", "hydra-infer", "hydragnn", "adios2", "deepspeed"),
    "hydra-models": ("hydra-train", "hydra-infer", "hydragnn", "adios2", "deepspeed"),
    "hydra-infer": ("hydra-train", "hydragnn", "deepspeed", "adios2", "tensorboard"),
    "hydra-train": ("hydra-infer", "hydragnn", "deepspeed", "adios2"),
    "hydragnn": ("deepspeed", "adios2"),
}

CHECK_LAYER = """
import importlib, importlib.metadata as md
dist, forbidden = {dist!r}, {forbidden!r}
m = importlib.import_module("hydragnn." + dist.removeprefix("hydra-"))
assert m.__version__ == md.version(dist), (m.__version__, md.version(dist))
for name in m.__all__:  # every public name, so that every submodule behind it imports
    try:
        getattr(m, name)
    except ImportError as exc:  # a name of an optional extra: the error must say how to install it
        assert name in {optional!r} and "pip install" in str(exc), (name, exc)
import hydragnn
assert getattr(hydragnn, "__file__", None) is None, "without the hydragnn distribution, hydragnn is a namespace"
def installed(name):
    try:
        md.distribution(name)
        return True
    except md.PackageNotFoundError:
        return False
present = [d for d in forbidden if installed(d)]
assert not present, f"installing {{dist}} brought {{present}}"
print(dist, m.__version__, "imports; absent:", ", ".join(forbidden))
"""

# the inference line's promise: a trained artifact answers through the calculator, ASE included
CHECK_SERVE = """
import tempfile, pathlib, torch
from ase.build import bulk
from hydragnn.data import Schema
from hydragnn.data.emt import CUAU_VARIABLES
from hydragnn.models import build_model, save_artifact
from hydragnn.infer import HydraASECalculator
arch = {"mpnn_type": "SchNet", "hidden_dim": 8, "num_conv_layers": 1, "radius": 3.0, "num_radial": 8,
        "enable_interatomic_potential": True, "output_heads": {"node": {"num_headlayers": 1}}}
torch.manual_seed(0)
path = pathlib.Path(tempfile.mkdtemp()) / "model.hydra"
save_artifact(build_model(arch, Schema.from_dict(CUAU_VARIABLES)), path)
atoms = bulk("Cu", cubic=True).repeat(2)
atoms.calc = HydraASECalculator(str(path))
e, f = atoms.get_potential_energy(), atoms.get_forces()
assert f.shape == (len(atoms), 3) and abs(float(e)) < 1e6, (e, f.shape)
print(f"served a SchNet artifact: {len(atoms)} Cu atoms, energy {float(e):.4f} eV")
"""


# the hydragnn line's promise: the top-level package over the layers' wheels, the seed's names
CHECK_TOP = """
import importlib.metadata as md, subprocess, sys
code = (
    "import sys, hydragnn; assert 'torch' not in sys.modules, 'import hydragnn loaded torch'; "
    "t = hydragnn.train; assert 'torch' not in sys.modules and 'test' in dir(t); print(hydragnn.__version__)"
)
out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout.strip()
assert out == md.version("hydragnn"), (out, md.version("hydragnn"))
import hydragnn
from pathlib import Path
for layer in ("data", "models", "train", "infer"):
    module = getattr(hydragnn, layer)
    assert module.__version__ == md.version("hydra-" + layer), layer
    assert str(Path(module.__file__).parent.parent) in hydragnn.__path__, (layer, hydragnn.__path__)
from hydragnn.utils.model import load_existing_model, load_model, save_model
assert load_model is load_existing_model is hydragnn.train.load_existing_model
assert hydragnn.preprocess.create_dataloaders is hydragnn.data.create_dataloaders
def installed(name):
    try:
        md.distribution(name)
        return True
    except md.PackageNotFoundError:
        return False
present = [d for d in {forbidden!r} if installed(d)]
assert not present, f"pip install hydragnn brought {{present}}"
print("hydragnn", out, "loads no torch on import; layers:", ", ".join(md.version("hydra-" + x) for x in ("data", "models", "train", "infer")))
"""


class InstallCheckError(Exception):
    """A README line failed, or an environment held what it must not."""


def readme_lines(readme: pathlib.Path) -> list[str]:
    """The ``pip install`` lines of the README's install block, in order (comments stripped)."""
    text = readme.read_text()
    match = re.search(re.escape(BEGIN) + r"(.*?)" + re.escape(END), text, re.S)
    if not match:
        raise InstallCheckError(f"{readme}: no {BEGIN} ... {END} block")
    lines = []
    for raw in match.group(1).splitlines():
        line = raw.split(" #", 1)[0].strip()
        if line.startswith("pip install"):
            lines.append(line)
    if not lines:
        raise InstallCheckError(f"{readme}: the install block has no 'pip install' line")
    return lines


def requirements_of(line: str) -> list[str]:
    """Distribution names a ``pip install`` line asks for, without extras or versions."""
    words = shlex.split(line)[2:]
    out, skip = [], False
    for w in words:
        if skip:
            skip = False
            continue
        if w in ("--find-links", "-f", "-c", "--constraint", "--index-url", "-i"):
            skip = True
            continue
        if w.startswith("-"):
            continue
        out.append(re.split(r"[\[<>=~! ]", w, maxsplit=1)[0])
    return out


class Venv:
    """A fresh virtual environment; every command's output goes to our stdout."""

    def __init__(self, path: pathlib.Path) -> None:
        self.path = path
        subprocess.run([sys.executable, "-m", "venv", str(path)], check=True)
        self.python = str(path / "bin" / "python")

    def run(self, *args: str, env: dict[str, str] | None = None) -> None:
        print("+", " ".join(shlex.quote(a) for a in args), flush=True)
        full_env = {**os.environ, "PATH": f"{self.path / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}", **(env or {})}
        full_env.pop("PYTHONPATH", None)
        subprocess.run(list(args), check=True, env=full_env, cwd=tempfile.gettempdir())

    def pip(self, *args: str) -> None:
        self.run(self.python, "-m", "pip", "install", "-q", "--disable-pip-version-check", *args)

    def python_code(self, code: str) -> None:
        self.run(self.python, "-c", textwrap.dedent(code), env={"OMP_NUM_THREADS": "1"})


def check_layer(venv: Venv, dist: str) -> None:
    venv.python_code(CHECK_LAYER.format(dist=dist, forbidden=FORBIDDEN[dist], optional=OPTIONAL.get(dist, ())))


def user_line(venv: Venv, line: str, dist_dir: pathlib.Path, constraints: list[str]) -> None:
    """One README line in the venv: its words, with ``dist`` pointing at ``dist_dir``."""
    words = shlex.split(line)[2:]
    words = [str(dist_dir) if w == "dist" else w for w in words]
    venv.pip(*constraints, *words)


CPU_INDEX = "https://download.pytorch.org/whl/cpu"
"""The index of torch's CPU builds, which the install block's first line must name."""


def cpu_torch_line(lines: list[str], readme: pathlib.Path) -> list[str]:
    """The block's lines after its first, which must install torch's CPU build (without it a
    CPU machine gets the CUDA build, 6.2 GB, through the layers' ``torch`` requirement)."""
    first = shlex.split(lines[0])
    if requirements_of(lines[0]) != ["torch"] or CPU_INDEX not in first:
        raise InstallCheckError(
            f"{readme}: the install block must start with the CPU torch line (pip install torch --index-url "
            f"{CPU_INDEX}); found {lines[0]!r}"
        )
    return lines[1:]


def run(dist_dir: pathlib.Path, venv_dir: pathlib.Path, readme: pathlib.Path, constraints: list[str]) -> None:
    lines = cpu_torch_line(readme_lines(readme), readme)
    firsts = [requirements_of(line)[0] for line in lines]
    if firsts[:2] != ["hydra-infer", "hydra-train"]:
        raise InstallCheckError(f"{readme}: expected the inference line, then the training line; found {firsts}")
    venv = Venv(venv_dir)
    # the block's CPU torch line; its index is not reachable from CI, whose constraints pin the CPU
    # wheel on disk: the same build
    venv.pip(*constraints, "torch")
    find = ["--find-links", str(dist_dir)]
    for dist in ("hydra-data", "hydra-models"):
        venv.pip(*constraints, *find, dist)
        check_layer(venv, dist)
    print(f"README: {lines[0]}", flush=True)
    user_line(venv, lines[0], dist_dir, constraints)
    check_layer(venv, "hydra-infer")
    venv.python_code(CHECK_SERVE)
    for tool in ("hydragnn-evaluate", "hydragnn-export"):
        venv.run(tool, "--version")
    venv.run(venv.python, "-m", "pip", "uninstall", "-y", "-q", "hydra-infer")
    print(f"README: {lines[1]}", flush=True)
    user_line(venv, lines[1], dist_dir, constraints)
    check_layer(venv, "hydra-train")
    for tool in ("hydragnn-train", "hydragnn-predict"):
        venv.run(tool, "--version")
    for line in lines[2:]:
        print(f"README: {line}", flush=True)
        user_line(venv, line, dist_dir, constraints)
        if requirements_of(line) == ["hydragnn"]:  # the plain line: nothing optional may come along
            venv.python_code(CHECK_TOP.format(forbidden=FORBIDDEN["hydragnn"]))
        venv.python_code(
            "import importlib.metadata as md\n"
            f"for d in {requirements_of(line)!r}:\n"
            "    print(d, md.version(d))\n"
            "import hydragnn.data, hydragnn.models, hydragnn.train, hydragnn.infer\n"
        )
    print(f"every install line of {readme.name} works in a fresh venv", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dist", type=pathlib.Path, default=ROOT / "dist", help="the wheels (nox -s wheels)")
    parser.add_argument("--venv", type=pathlib.Path, default=None, help="where to make the venv (default: a temp dir)")
    parser.add_argument("--readme", type=pathlib.Path, default=ROOT / "README.md")
    parser.add_argument(
        "--constraints",
        type=pathlib.Path,
        default=ROOT / "constraints" / "dev.txt",
        help="pip constraints for every install (the development torch pin)",
    )
    args = parser.parse_args(argv)
    dist_dir = args.dist.resolve()
    if not any(dist_dir.glob("*.whl")):
        print(f"install_check: no wheels in {dist_dir}; run nox -s wheels first", file=sys.stderr)
        return 2
    constraints = ["-c", str(args.constraints.resolve())] if args.constraints else []
    try:
        if args.venv is not None:
            run(dist_dir, args.venv.resolve(), args.readme, constraints)
        else:
            with tempfile.TemporaryDirectory(prefix="hydragnn-install-") as tmp:
                run(dist_dir, pathlib.Path(tmp) / "venv", args.readme, constraints)
    except (InstallCheckError, subprocess.CalledProcessError) as exc:
        print(f"install_check: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

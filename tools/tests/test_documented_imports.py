"""Every ``from hydragnn... import ...`` line of the READMEs, the docs and the examples, as a user's
first line: it runs in a fresh interpreter, the names exist, and the import prints no FutureWarning
(torch >= 2.14 deprecates the TorchScript that PyG's import uses; ``nox -s tests-torch-newest``
runs this on the newest torch the packages admit).

PyG must load through :mod:`hydragnn.data.pyg_import` from every module of the source tree, or a
user whose first import is that module sees the warning and loses TorchScript's builtins (metatomic
imported afterwards fails): :func:`test_every_module_imports_pyg_through_pyg_import` checks the
source, the subprocesses check the behaviour.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCUMENTS = [
    ROOT / "README.md",
    *ROOT.glob("packages/*/README.md"),
    *ROOT.glob("docs/*.md"),
    *ROOT.glob("examples/**/*.py"),
]
LINE = re.compile(r"^\s*from (hydragnn[\w.]*) import ([\w ,]+?)\s*(#.*)?$", re.MULTILINE)


def documented_imports() -> dict[str, list[str]]:
    """module -> the names the documents import from it (one-line ``from ... import`` statements)."""
    names: dict[str, set[str]] = defaultdict(set)
    for path in DOCUMENTS:
        for module, imported, _ in LINE.findall(path.read_text(encoding="utf-8")):
            names[module].update(n.strip() for n in imported.split(",") if n.strip())
    return {module: sorted(found) for module, found in sorted(names.items())}


IMPORTS = documented_imports()


def test_the_documents_have_import_lines():
    assert {"hydragnn.data", "hydragnn.infer", "hydragnn.data.emt"} <= set(IMPORTS), sorted(IMPORTS)


@pytest.mark.parametrize("module", sorted(IMPORTS))
def test_a_documented_import_runs_first_and_quietly(module):
    statement = f"from {module} import {', '.join(IMPORTS[module])}"
    out = subprocess.run(
        [sys.executable, "-W", "error::FutureWarning", "-c", statement],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert out.returncode == 0, f"{statement}:\n{out.stderr[-3000:]}"


def _imports(node: ast.AST) -> list[str]:
    """The modules imported directly in ``node``'s own scope (not in nested functions or ``if TYPE_CHECKING``)."""
    found = []
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.Import):
            found += [alias.name for alias in child.names]
        elif isinstance(child, ast.ImportFrom) and child.module and not child.level:
            found.append(child.module)
        elif isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
            continue
        elif not isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            found += _imports(child)
    return found


def test_every_module_imports_pyg_through_pyg_import():
    wrong = []
    for path in sorted(ROOT.glob("packages/*/src/hydragnn/**/*.py")):
        if path.name == "pyg_import.py":  # the module itself
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        scopes = [tree, *(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef))]
        for scope in scopes:
            modules = _imports(scope)
            first_pyg = next((i for i, m in enumerate(modules) if m.split(".")[0] == "torch_geometric"), None)
            if first_pyg is not None and "hydragnn.data.pyg_import" not in modules[:first_pyg]:
                where = "module" if scope is tree else f"{scope.name}()"  # type: ignore[union-attr]
                wrong.append(f"{path.relative_to(ROOT)} ({where})")
    assert not wrong, "import hydragnn.data.pyg_import before torch_geometric in: " + ", ".join(wrong)

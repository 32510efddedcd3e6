"""MkDocs hooks of the documentation site (``mkdocs.yml``: ``hooks: [tools/docs/hooks.py]``).

Three jobs, none importing any ``hydragnn`` module (so no torch, fairchem, triton,
DeepSpeed or nvalchemi is needed to build the docs):

1. ``build/docs-api/hydragnn/``: the five distributions' ``src/hydragnn`` folders laid out as one
   package, as the wheels install them into one site-packages (symbolic links to the sources).
   griffe (mkdocstrings' reader) reads it statically; it cannot merge the editable trees itself,
   since ``packages/hydragnn`` ships a regular ``hydragnn/__init__.py`` that hides the layers'
   namespace portions from it.
2. ``api/<layer>.md``: one API page per distribution, generated from the public names its
   ``__init__.py`` declares (``__all__``, with the PEP 562 ``_LAZY`` table saying which module
   defines each), and from those of the public subpackages in ``SUBPACKAGES``. Each package's
   docstring is rendered, then every defining module with the public names it contributes; a
   name defined in another layer (or already shown) is a link to where it is documented.
3. ``index.md``: README.md, its links made relative to ``docs/``; ``layers/<dist>.md``: each
   layer's README (hydra-train's holds the reference of every config key).
"""

from __future__ import annotations

import ast
import os
import pathlib
import re
import shutil
from dataclasses import dataclass, field

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.plugins import event_priority
from mkdocs.structure.files import File, Files

ROOT = pathlib.Path(__file__).resolve().parents[2]
STAGING = ROOT / "build" / "docs-api"

# page (api/<page>.md) -> (distribution, package)
PAGES: dict[str, tuple[str, str]] = {
    "hydragnn": ("hydragnn", "hydragnn"),
    "data": ("hydra-data", "hydragnn.data"),
    "models": ("hydra-models", "hydragnn.models"),
    "train": ("hydra-train", "hydragnn.train"),
    "infer": ("hydra-infer", "hydragnn.infer"),
}
# public modules below a layer's package, each documented with its own __all__ on the layer's page
SUBPACKAGES: dict[str, tuple[str, ...]] = {
    "hydragnn": ("hydragnn.preprocess", "hydragnn.utils.model"),
    "models": ("hydragnn.models.nn", "hydragnn.models.testing"),
    "train": ("hydragnn.train.strategies",),
    "infer": ("hydragnn.infer.evaluate", "hydragnn.infer.export", "hydragnn.infer.lammps"),
}


# ----------------------------------------------------------------------------- staging tree
def stage_sources(root: pathlib.Path = ROOT, staging: pathlib.Path = STAGING) -> pathlib.Path:
    """Link every ``packages/*/src/hydragnn/*`` entry into ``staging/hydragnn`` (rebuilt each time).

    Raises:
        RuntimeError: two distributions ship the same entry (the wheels would overwrite each other).
    """
    target = staging / "hydragnn"
    shutil.rmtree(staging, ignore_errors=True)
    target.mkdir(parents=True)
    owner: dict[str, pathlib.Path] = {}
    for src in sorted(root.glob("packages/*/src/hydragnn")):
        for entry in sorted(src.iterdir()):
            if entry.name == "__pycache__" or entry.name.startswith("."):
                continue
            if entry.name in owner:
                raise RuntimeError(f"hydragnn/{entry.name} is shipped by both {owner[entry.name]} and {src}")
            owner[entry.name] = src
            (target / entry.name).symlink_to(os.path.relpath(entry, target))
    return staging


# ----------------------------------------------------------------------------- public names
@dataclass
class PublicNames:
    """What a package's ``__init__.py`` declares, read from its source without importing it."""

    package: str
    names: list[str]
    # public name -> dotted path of the object it is (``hydragnn.data.schema.Schema``)
    origin: dict[str, str] = field(default_factory=dict)


def _package_file(package: str, staging: pathlib.Path = STAGING) -> pathlib.Path:
    path = staging.joinpath(*package.split("."))
    return path / "__init__.py" if path.is_dir() else path.with_suffix(".py")


def _literal(node: ast.expr, tables: dict[str, ast.expr], where: str) -> list[str]:
    """Evaluate the forms ``__all__`` takes here: a list of strings and ``*name`` / ``*sorted(name)``
    of a dict or list literal bound at module level, or ``sorted(...)`` of those."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "sorted":
        return sorted(_literal(node.args[0], tables, where))
    if isinstance(node, ast.Name) and node.id in tables:
        return _literal(tables[node.id], tables, where)
    if isinstance(node, ast.Dict):
        return [ast.literal_eval(k) for k in node.keys if k is not None]
    if isinstance(node, ast.List | ast.Tuple):
        out: list[str] = []
        for elt in node.elts:
            if isinstance(elt, ast.Starred):
                out += _literal(elt.value, tables, where)
            else:
                out.append(ast.literal_eval(elt))
        return out
    raise ValueError(f"{where}: cannot read __all__ statically ({ast.unparse(node)})")


def _resolve(module: str, package: str) -> str:
    """``lazy_names``' rule: relative (``.x``), absolute (``hydragnn.x``) or a submodule name."""
    if module.startswith("."):
        return package + module
    if module == "hydragnn" or module.startswith("hydragnn."):
        return module
    return f"{package}.{module}"


def public_names(package: str, staging: pathlib.Path = STAGING) -> PublicNames:
    """The names of ``package.__all__`` and the object each one is (from ``_LAZY``, an import, a
    definition or an assignment ``alias = name`` in the module).

    A name re-exported from another package with a lazy table is followed to its defining module.
    """
    path = _package_file(package, staging)
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    base = package if path.name == "__init__.py" else package.rpartition(".")[0]
    tables: dict[str, ast.expr] = {}
    origin: dict[str, str] = {}
    names: list[str] | None = None
    for stmt in tree.body:
        if isinstance(stmt, ast.Assign | ast.AnnAssign):
            targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
            for target in targets:
                if not isinstance(target, ast.Name) or stmt.value is None:
                    continue
                tables[target.id] = stmt.value
                if target.id == "__all__":
                    names = _literal(stmt.value, tables, str(path))
                elif isinstance(stmt.value, ast.Name) and stmt.value.id in origin:
                    origin[target.id] = origin[stmt.value.id]  # load_model = load_existing_model
                else:
                    origin[target.id] = f"{package}.{target.id}"
        elif isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            origin[stmt.name] = f"{package}.{stmt.name}"
        elif isinstance(stmt, ast.ImportFrom):
            module = stmt.module or ""
            if stmt.level:  # from ..x import y: up level - 1 packages from this one
                parent = base.rsplit(".", stmt.level - 1)[0] if stmt.level > 1 else base
                module = f"{parent}.{module}" if module else parent
            for alias in stmt.names:
                origin[alias.asname or alias.name] = f"{module}.{alias.name}"
    if names is None:
        raise ValueError(f"{path}: no __all__")
    lazy = tables.get("_LAZY")
    if isinstance(lazy, ast.Dict):
        for key, value in zip(lazy.keys, lazy.values, strict=True):
            name = ast.literal_eval(key)
            origin[name] = f"{_resolve(ast.literal_eval(value), package)}.{name}"
    for name, obj in list(origin.items()):
        # follow a re-export from a package that is itself lazy (hydragnn.data's create_dataloaders)
        module, _, attr = obj.rpartition(".")
        if module != package and module.startswith("hydragnn") and _package_file(module, staging).exists():
            if _package_file(module, staging).name == "__init__.py":
                inner = public_names(module, staging)
                if attr in inner.origin:
                    origin[name] = inner.origin[attr]
    return PublicNames(package, [n for n in names if n != "__version__"], origin)


# ----------------------------------------------------------------------------- pages
def _directive(identifier: str, members: list[str] | bool, heading_level: int, root_heading: bool) -> str:
    lines = [f"::: {identifier}", "    options:", f"      heading_level: {heading_level}"]
    lines.append(f"      show_root_heading: {'true' if root_heading else 'false'}")
    if members is False:
        lines.append("      members: false")
    else:
        lines.append("      members:")
        lines += [f"        - {m}" for m in members]
    return "\n".join(lines) + "\n"


def _layer_of(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in PAGES else None


def _package_section(package: str, page: str, level: int, seen: set[str], staging: pathlib.Path) -> list[str]:
    """``package``'s docstring, then each module defining its public names with those names.

    A name whose object is defined in another layer, renamed, or already rendered on this page
    (in ``seen``) is a link instead. The package's own heading is shown from ``level`` 2 on
    (the page's title names the layer), the defining modules one level below it.
    """
    pub = public_names(package, staging)
    by_module: dict[str, list[str]] = {}
    links: list[str] = []
    for name in pub.names:
        obj = pub.origin.get(name)
        if obj is None:
            raise ValueError(f"{package}.{name}: in __all__, but not defined, imported or in _LAZY")
        module, _, attr = obj.rpartition(".")
        layer = _layer_of(module) or page
        if layer != page or attr != name or obj in seen:
            where = "" if layer == page else f" ([{PAGES[layer][1]}]({layer}.md))"
            links.append(f"- [`{name}`][{obj}]: `{obj}`{where}")
        else:
            by_module.setdefault(module, []).append(name)
            seen.add(obj)
    root = package != PAGES[page][1]
    out = [_directive(package, sorted(by_module.pop(package, [])) or False, level, root)]
    if links:
        out += ["Also here, documented where they are defined:", "", *links, ""]
    for module in sorted(by_module):
        out.append(_directive(module, sorted(by_module[module]), level + 1 if root else level, True))
    return out


def render_page(page: str, staging: pathlib.Path = STAGING) -> str:
    """The Markdown of ``api/<page>.md``: the layer's package, then its public subpackages."""
    dist, package = PAGES[page]
    out = [
        f"# `{package}` ({dist})",
        "",
        "<!-- generated by tools/docs/hooks.py from the packages' __all__; edit the docstrings -->",
        "",
    ]
    seen: set[str] = set()
    if page == "hydragnn":
        out += [_directive(package, False, 2, False)]
        out += ["The layers: " + ", ".join(f"[`{p}`]({k}.md)" for k, (_, p) in PAGES.items() if k != page), ""]
    else:
        out += _package_section(package, page, 2, seen, staging)
    for sub in SUBPACKAGES.get(page, ()):
        out += _package_section(sub, page, 2, seen, staging)
    return "\n".join(out)


# ----------------------------------------------------------------------------- mkdocs events
@event_priority(100)  # before mkdocstrings reads its handler paths
def on_config(config: MkDocsConfig) -> MkDocsConfig:
    stage_sources()
    return config


def home_page(root: pathlib.Path = ROOT) -> str:
    """README.md as the home page; its links are relative to the repository root, so
    ``](docs/x.md)`` becomes ``](x.md)`` (another relative link fails the strict build)."""
    readme = (root / "README.md").read_text(encoding="utf-8")
    return re.sub(r"\]\(docs/", "](", readme)


LAYER_READMES = ("hydra-data", "hydra-models", "hydra-train", "hydra-infer")
"""Distributions whose README is a page of the site (``layers/<dist>.md``): hydra-train's is the
reference of every config key."""


def layer_page(dist: str, root: pathlib.Path = ROOT) -> str:
    """``packages/<dist>/README.md`` as ``layers/<dist>.md``: its links to ``../../docs/x.md``
    become ``../x.md`` (the page sits one folder below ``docs/``)."""
    text = (root / "packages" / dist / "README.md").read_text(encoding="utf-8")
    return re.sub(r"\]\(\.\./\.\./docs/", "](../", text)


def on_files(files: Files, config: MkDocsConfig) -> Files:
    files.append(File.generated(config, "index.md", content=home_page()))
    for dist in LAYER_READMES:
        files.append(File.generated(config, f"layers/{dist}.md", content=layer_page(dist)))
    for page in PAGES:
        files.append(File.generated(config, f"api/{page}.md", content=render_page(page)))
    return files

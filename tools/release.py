#!/usr/bin/env python3
"""Release one distribution of the monorepo with its own version.

    python tools/release.py hydra-data 0.1.1 [--update-siblings] [--dry-run]

Steps: validate the version (PEP 440, greater than the current one); check that every sibling
that depends on this distribution still admits the new version through its declared range
(with ``--update-siblings`` rewrite those ranges to the compatible ``>=X.Y,<X.(Y+1)`` instead of
failing); set ``src/hydragnn/<pkg>/__about__.py`` (``src/hydragnn/__about__.py`` for the
``hydragnn`` distribution, which depends on all four layers: release it last); move the
CHANGELOG's ``## Unreleased`` section under ``## <version> (<date>)``, leaving a fresh empty
``Unreleased``; print the tag ``<dist>-v<version>``. Nothing is written when a check fails.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import pathlib
import re
import sys
import tomllib

from packaging.requirements import Requirement
from packaging.version import InvalidVersion, Version

ROOT = pathlib.Path(__file__).resolve().parent.parent


class ReleaseError(Exception):
    """A release check failed; nothing was written."""


def _about_path(root: pathlib.Path, dist: str) -> pathlib.Path:
    """``src/hydragnn/<pkg>/__about__.py`` of a layer; ``src/hydragnn/__about__.py`` of ``hydragnn``."""
    package = root / "packages" / dist / "src" / "hydragnn"
    return package / "__about__.py" if dist == "hydragnn" else package / dist.removeprefix("hydra-") / "__about__.py"


def current_version(root: pathlib.Path, dist: str) -> Version:
    text = _about_path(root, dist).read_text()
    match = re.search(r'^__version__\s*=\s*"([^"]+)"', text, re.M)
    if not match:
        raise ReleaseError(f'{_about_path(root, dist)}: no __version__ = "..." line')
    return Version(match.group(1))


def distributions(root: pathlib.Path) -> list[str]:
    return sorted(p.name for p in (root / "packages").iterdir() if (p / "pyproject.toml").is_file())


def dependents(root: pathlib.Path, dist: str) -> list[tuple[str, Requirement, str]]:
    """Siblings that depend on ``dist``: (sibling, requirement, the raw requirement string)."""
    out = []
    for sib in distributions(root):
        meta = tomllib.loads((root / "packages" / sib / "pyproject.toml").read_text())["project"]
        reqs = list(meta.get("dependencies", []))
        for extra in meta.get("optional-dependencies", {}).values():
            reqs += extra
        for raw in reqs:
            req = Requirement(raw)
            if req.name == dist:
                out.append((sib, req, raw))
    return out


def compatible_range(dist: str, version: Version) -> str:
    major, minor = version.major, version.minor
    upper = f"{major + 1}.0" if major >= 1 else f"0.{minor + 1}"
    lower = f"{major}.{minor}"
    return f"{dist}>={lower},<{upper}"


def _changelog_moved(text: str, version: Version, date: str, path: pathlib.Path) -> str:
    match = re.search(r"^## Unreleased[ \t]*\n", text, re.M)
    if not match:
        raise ReleaseError(f"{path}: no '## Unreleased' section to release")
    start = match.end()
    nxt = re.search(r"^## ", text[start:], re.M)
    body = text[start : start + nxt.start()] if nxt else text[start:]
    if not body.strip():
        raise ReleaseError(f"{path}: the Unreleased section is empty: say what changed before releasing")
    if re.search(rf"^## {re.escape(str(version))}\b", text, re.M):
        raise ReleaseError(f"{path}: version {version} already has a section")
    released = f"## Unreleased\n\n## {version} ({date})\n{body.rstrip()}\n\n"
    rest = text[start + len(body) :]
    return text[: match.start()] + released + rest.lstrip("\n")


def release(
    root: pathlib.Path,
    dist: str,
    new: str,
    *,
    update_siblings: bool = False,
    dry_run: bool = False,
    date: str | None = None,
) -> str:
    """Run every check, then write. Returns the tag."""
    if dist not in distributions(root):
        raise ReleaseError(f"unknown distribution {dist!r}; known: {distributions(root)}")
    try:
        version = Version(new)
    except InvalidVersion:
        raise ReleaseError(f"{new!r} is not a PEP 440 version") from None
    old = current_version(root, dist)
    if version <= old:
        raise ReleaseError(f"{dist}: new version {version} must be greater than the current {old}")

    writes: dict[pathlib.Path, str] = {}
    broken = []
    for sib, req, raw in dependents(root, dist):
        if req.specifier.contains(version, prereleases=True):
            continue
        if not update_siblings:
            broken.append(f"{sib} requires {raw!r}")
            continue
        path = root / "packages" / sib / "pyproject.toml"
        text = writes.get(path, path.read_text())
        writes[path] = text.replace(f'"{raw}"', f'"{compatible_range(dist, version)}"')
    if broken:
        raise ReleaseError(
            f"{dist} {version} is outside the range its siblings declare: "
            + "; ".join(broken)
            + ". Rerun with --update-siblings to move them to the compatible range, and release them too."
        )

    about = _about_path(root, dist)
    writes[about] = re.sub(r'^__version__\s*=\s*"[^"]+"', f'__version__ = "{version}"', about.read_text(), flags=re.M)
    changelog = root / "packages" / dist / "CHANGELOG.md"
    writes[changelog] = _changelog_moved(
        changelog.read_text(), version, date or _dt.date.today().isoformat(), changelog
    )

    if not dry_run:
        for path, text in writes.items():
            tmp = path.with_suffix(path.suffix + ".tmp")
            tmp.write_text(text)
            tmp.replace(path)
    return f"{dist}-v{version}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dist", help="distribution name, e.g. hydra-data")
    parser.add_argument("version", help="the new version, e.g. 0.1.1")
    parser.add_argument(
        "--update-siblings", action="store_true", help="rewrite siblings' ranges that exclude the new version"
    )
    parser.add_argument("--dry-run", action="store_true", help="run every check, write nothing")
    parser.add_argument("--root", type=pathlib.Path, default=ROOT, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    try:
        tag = release(args.root, args.dist, args.version, update_siblings=args.update_siblings, dry_run=args.dry_run)
    except ReleaseError as exc:
        print(f"release: {exc}", file=sys.stderr)
        return 1
    print(tag)
    return 0


if __name__ == "__main__":
    sys.exit(main())

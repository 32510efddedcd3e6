"""tools/release.py on a copy of the repository's packages/ tree."""

from __future__ import annotations

import importlib.util
import pathlib
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("release", ROOT / "tools" / "release.py")
release_mod = importlib.util.module_from_spec(spec)
spec.loader.exec_module(release_mod)


UNRELEASED_NOTES = "## Unreleased\n\n### Added\n- Something a user can now do.\n"


@pytest.fixture
def repo(tmp_path):
    for dist in release_mod.distributions(ROOT):
        src = ROOT / "packages" / dist
        dst = tmp_path / "packages" / dist
        dst.mkdir(parents=True)
        shutil.copy(src / "pyproject.toml", dst / "pyproject.toml")
        # the repository's Unreleased section may be empty right after a release: give the copy notes
        text = (src / "CHANGELOG.md").read_text()
        assert "## Unreleased\n" in text, f"{dist}: its CHANGELOG lost its Unreleased section"
        (dst / "CHANGELOG.md").write_text(text.replace("## Unreleased\n", UNRELEASED_NOTES, 1))
        about = release_mod._about_path(ROOT, dist)
        target = release_mod._about_path(tmp_path, dist)
        target.parent.mkdir(parents=True)
        shutil.copy(about, target)
    return tmp_path


def test_patch_release_bumps_version_and_changelog(repo):
    old = release_mod.current_version(repo, "hydra-data")
    new = f"{old.major}.{old.minor}.{old.micro + 1}"
    tag = release_mod.release(repo, "hydra-data", new, date="2026-11-29")
    assert tag == f"hydra-data-v{new}"
    assert str(release_mod.current_version(repo, "hydra-data")) == new
    text = (repo / "packages/hydra-data/CHANGELOG.md").read_text()
    unreleased = text.index("## Unreleased")
    versioned = text.index(f"## {new} (2026-11-29)")
    assert unreleased < versioned
    assert text[unreleased:versioned].strip() == "## Unreleased"  # fresh, empty
    assert "### Added" in text[versioned:]
    # other distributions untouched
    assert release_mod.current_version(repo, "hydra-models") == release_mod.current_version(ROOT, "hydra-models")


def test_minor_release_outside_sibling_ranges_is_refused_without_writing(repo):
    old = release_mod.current_version(repo, "hydra-data")
    new = f"{old.major}.{old.minor + 1}.0"
    before = {p: p.read_text() for p in repo.rglob("*") if p.is_file()}
    with pytest.raises(release_mod.ReleaseError, match="hydra-models requires 'hydra-data>="):
        release_mod.release(repo, "hydra-data", new)
    assert before == {p: p.read_text() for p in repo.rglob("*") if p.is_file()}


def test_update_siblings_moves_ranges_to_the_compatible_one(repo):
    old = release_mod.current_version(repo, "hydra-data")
    new = f"{old.major}.{old.minor + 1}.0"
    release_mod.release(repo, "hydra-data", new, update_siblings=True)
    for sib, req, _ in release_mod.dependents(repo, "hydra-data"):
        assert req.specifier.contains(new), (sib, str(req))
        assert str(req.specifier) == f"<{old.major}.{old.minor + 2},>={old.major}.{old.minor + 1}", str(req)


def test_the_hydragnn_distribution_releases_like_a_layer(repo):
    # its version lives in src/hydragnn/__about__.py (no layer subpackage), and it depends on all four
    assert release_mod._about_path(repo, "hydragnn") == repo / "packages/hydragnn/src/hydragnn/__about__.py"
    assert sorted({sib for sib, _, _ in release_mod.dependents(repo, "hydra-train")}) == ["hydragnn"]
    old = release_mod.current_version(repo, "hydragnn")
    new = f"{old.major}.{old.minor}.{old.micro + 1}"
    assert release_mod.release(repo, "hydragnn", new, date="2026-11-29") == f"hydragnn-v{new}"
    assert str(release_mod.current_version(repo, "hydragnn")) == new
    assert f"## {new} (2026-11-29)" in (repo / "packages/hydragnn/CHANGELOG.md").read_text()


@pytest.mark.parametrize("bad, pattern", [("nonsense", "not a PEP 440"), ("0.0.1", "must be greater")])
def test_bad_versions_refused(repo, bad, pattern):
    with pytest.raises(release_mod.ReleaseError, match=pattern):
        release_mod.release(repo, "hydra-infer", bad)


def test_empty_unreleased_section_refused(repo):
    old = release_mod.current_version(repo, "hydra-train")
    release_mod.release(repo, "hydra-train", f"{old.major}.{old.minor}.{old.micro + 1}")
    with pytest.raises(release_mod.ReleaseError, match="Unreleased section is empty"):
        release_mod.release(repo, "hydra-train", f"{old.major}.{old.minor}.{old.micro + 2}")


def test_cli_prints_the_tag_and_fails_with_a_message(repo):
    old = release_mod.current_version(repo, "hydra-infer")
    new = f"{old.major}.{old.minor}.{old.micro + 1}"
    script = str(ROOT / "tools" / "release.py")
    ok = subprocess.run(
        [sys.executable, script, "hydra-infer", new, "--dry-run", "--root", str(repo)], capture_output=True, text=True
    )
    assert ok.returncode == 0 and ok.stdout.strip() == f"hydra-infer-v{new}"
    assert release_mod.current_version(repo, "hydra-infer") == old  # dry run wrote nothing
    bad = subprocess.run([sys.executable, script, "hydra-nope", "1.0"], capture_output=True, text=True)
    assert bad.returncode == 1 and "unknown distribution 'hydra-nope'" in bad.stderr

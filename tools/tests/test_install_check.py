"""tools/install_check.py reads the README's install lines (``nox -s build`` runs them in a fresh venv)."""

from __future__ import annotations

import importlib.util
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("install_check", ROOT / "tools" / "install_check.py")
install_check = importlib.util.module_from_spec(spec)
spec.loader.exec_module(install_check)


def test_readme_lines_are_the_users_pip_lines():
    lines = install_check.cpu_torch_line(install_check.readme_lines(ROOT / "README.md"), ROOT / "README.md")
    firsts = [install_check.requirements_of(line)[0] for line in lines]
    assert firsts[:2] == ["hydra-infer", "hydra-train"]
    assert all("--find-links dist" in line for line in lines)
    everything = install_check.requirements_of(lines[-1])
    assert {"hydragnn", "hydra-train", "hydra-infer", "hydra-data"} <= set(everything)
    # the one-line install of all four layers and the top-level package, checked before any extra comes in
    requirements = [install_check.requirements_of(line) for line in lines]
    assert ["hydragnn"] in requirements[2:-1]


def test_requirements_of_skips_options_and_extras():
    line = 'pip install --find-links dist -c constraints.txt "hydra-train[deepspeed]>=0.2" hydra-infer'
    assert install_check.requirements_of(line) == ["hydra-train", "hydra-infer"]


def test_the_block_starts_with_the_cpu_torch_line(tmp_path):
    """A CPU machine copying the block gets torch's CPU build before any layer asks for torch."""
    first = install_check.readme_lines(ROOT / "README.md")[0]
    assert install_check.requirements_of(first) == ["torch"] and install_check.CPU_INDEX in first
    readme = tmp_path / "README.md"
    readme.write_text(
        f"{install_check.BEGIN}\n```bash\npip install --find-links dist hydra-infer\n```\n{install_check.END}\n"
    )
    with pytest.raises(install_check.InstallCheckError, match="CPU torch line"):
        install_check.cpu_torch_line(install_check.readme_lines(readme), readme)


def test_missing_block_is_an_error(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text("# no install block\n")
    with pytest.raises(install_check.InstallCheckError, match="install-lines:begin"):
        install_check.readme_lines(readme)


def test_every_distribution_has_a_forbidden_list():
    dists = sorted(p.name for p in (ROOT / "packages").iterdir() if (p / "pyproject.toml").is_file())
    assert sorted(install_check.FORBIDDEN) == dists
    for dist, forbidden in install_check.FORBIDDEN.items():
        assert dist not in forbidden

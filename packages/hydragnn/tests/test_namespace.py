"""The top-level ``hydragnn`` package: lazy layers, no torch on import, the layers' folders on its path."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

LAYERS = ("data", "models", "train", "infer")


def _run(code: str) -> str:
    """``code`` in a fresh interpreter (this one has torch loaded already); its stdout."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("PYTHONPATH", None)
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=env, cwd=Path.home()
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_import_hydragnn_loads_no_torch_and_gives_the_layers_as_attributes():
    out = _run(
        """
        import sys
        import hydragnn
        assert "torch" not in sys.modules, "import hydragnn loaded torch"
        assert not any(m in sys.modules for m in ("hydragnn.train", "hydragnn.data")), "a layer was imported eagerly"
        train = hydragnn.train  # the seed's hydragnn.train.test(...), after a bare import hydragnn
        assert train is sys.modules["hydragnn.train"] and "test" in dir(train)
        assert "torch" not in sys.modules, "reaching hydragnn.train loaded torch"
        assert callable(train.test) and hydragnn.preprocess.create_dataloaders is hydragnn.data.create_dataloaders
        print(sorted(n for n in ("data", "models", "train", "infer", "preprocess", "utils") if n in dir(hydragnn)))
        print(hydragnn.__version__)
        """
    )
    names, version = out.split("\n")[:2]
    assert names == "['data', 'infer', 'models', 'preprocess', 'train', 'utils']"
    from importlib.metadata import version as dist_version

    assert version == dist_version("hydragnn")


def test_every_layer_is_reached_through_the_path_of_hydragnn():
    # editable installs put each layer in its own src/hydragnn, wheels share one folder: either
    # way, __path__ (pkgutil.extend_path) must hold the folder every layer was imported from
    import importlib

    import hydragnn

    assert hydragnn.__file__ is not None  # a regular package once this distribution is installed
    for layer in LAYERS:
        module = importlib.import_module(f"hydragnn.{layer}")
        assert str(Path(module.__file__).parent.parent) in hydragnn.__path__, layer
        assert getattr(hydragnn, layer) is module


def test_unknown_attribute_and_a_missing_layer_say_what_is_wrong(monkeypatch):
    import hydragnn

    with pytest.raises(AttributeError, match=r"no attribute 'preprocessing'; its subpackages: \['data'"):
        hydragnn.preprocessing  # noqa: B018
    # a layer that is not installed: the message names the distribution to install
    monkeypatch.delattr(hydragnn, "infer", raising=False)
    monkeypatch.setitem(sys.modules, "hydragnn.infer", None)  # what the import system reports for a missing module
    with pytest.raises(AttributeError, match=r"hydragnn.infer is not installed: pip install hydra-infer"):
        hydragnn.infer  # noqa: B018

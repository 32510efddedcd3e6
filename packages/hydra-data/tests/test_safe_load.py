"""torch.load of untrusted bytes: tensors only, and the error says why (not "retry unsafely")."""

from __future__ import annotations

import io
import os

import pytest
import torch

from hydragnn.data.io.safe_load import load_tensors


class _Evil:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.mkdir, (self.marker,))


def _bytes(obj) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def test_tensors_and_plain_containers_load():
    obj = {"a": torch.arange(3), "b": [1.5, "x", {"c": None}]}
    got = load_tensors(_bytes(obj))
    assert torch.equal(got["a"], obj["a"]) and got["b"] == obj["b"]


def test_pickled_code_is_refused_naming_the_global(tmp_path):
    marker = str(tmp_path / "pwned")
    with pytest.raises(ValueError) as err:
        load_tensors(_bytes({"x": _Evil(marker)}))
    message = str(err.value)
    assert "it holds a Python object" in message and "mkdir" in message
    assert "weights_only" not in message and "\n" not in message  # never the advice to load unsafely
    assert not os.path.exists(marker)


@pytest.mark.parametrize("cut", [0, 10, 200, -30])
def test_truncated_bytes_name_the_reader_error(cut):
    data = _bytes({"a": torch.ones(100)})
    with pytest.raises(ValueError) as err:
        load_tensors(data[:cut] if cut >= 0 else data[:cut])
    assert "\n" not in str(err.value) and str(err.value)

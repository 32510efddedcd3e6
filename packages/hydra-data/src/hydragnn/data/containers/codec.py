"""Encoding of sample attributes into plain, container-neutral values.

Every container stores a sample as an ordered mapping ``key -> field`` where a field is either

* a tensor: dtype name (from :data:`DTYPES`), shape and the raw little-endian bytes, or
* a JSON value: a plain Python scalar, string, ``None``, or a list / str-keyed dict of those.

Nothing else is accepted, so a container never needs to import or construct arbitrary
classes when it loads a sample.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, cast

import hydragnn.data.pyg_import  # noqa: F401 (PyG as HydraGNN needs it)

import torch
from torch_geometric.data import Data

from ..errors import ContainerError
from ..pyg_data import new_data

if sys.byteorder != "little":  # pragma: no cover - every supported platform is little-endian
    raise ImportError("hydragnn.data.containers requires a little-endian platform")

DTYPES: dict[str, torch.dtype] = {
    name: getattr(torch, name)
    for name in (
        "bool",
        "uint8",
        "int8",
        "int16",
        "int32",
        "int64",
        "uint16",
        "uint32",
        "uint64",
        "float16",
        "bfloat16",
        "float32",
        "float64",
        "complex64",
        "complex128",
    )
}
"""The tensor dtypes a container stores, by name: the only ones accepted on load."""

JSON_KIND = "json"
"""Pseudo dtype name of a JSON-encoded (non-tensor) attribute."""


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.float32 -> "float32"``."""
    return str(dtype).removeprefix("torch.")


def lookup_dtype(name: Any, where: str) -> torch.dtype:
    """The torch dtype named ``name``; ContainerError naming ``where`` when unknown."""
    dtype = DTYPES.get(name) if isinstance(name, str) else None
    if dtype is None:
        raise ContainerError(f"{where}: unknown tensor dtype {name!r}; expected one of {sorted(DTYPES)}")
    return dtype


def compact(t: torch.Tensor, key: str, where: str) -> torch.Tensor:
    """A detached, contiguous CPU tensor owning exactly its own storage.

    Args:
        t: any dense tensor; autograd history is dropped.
        key: attribute name, for error messages.
        where: location (path and sample index), for error messages.
    """
    if t.layout != torch.strided:
        raise ContainerError(
            f"{where}: attribute {key!r} is a {t.layout} tensor; only dense (strided) tensors can be stored"
        )
    if dtype_name(t.dtype) not in DTYPES:
        raise ContainerError(f"{where}: attribute {key!r} has dtype {t.dtype}; storable dtypes are {sorted(DTYPES)}")
    t = t.detach().cpu().contiguous()
    if t.storage_offset() != 0 or t.untyped_storage().nbytes() != t.numel() * t.element_size():
        t = t.clone()
    return t


def tensor_bytes(t: torch.Tensor) -> bytearray:
    """The raw bytes of a compact tensor (see :func:`compact`)."""
    if t.numel() == 0:
        return bytearray()
    return bytearray(t.reshape(-1).view(torch.uint8).numpy())


def tensor_from_bytes(dtype: torch.dtype, shape: tuple[int, ...], buf: bytes | bytearray, where: str) -> torch.Tensor:
    """Rebuild a tensor from :func:`tensor_bytes`; checks the byte count against ``shape``."""
    numel = math.prod(shape)
    itemsize = dtype.itemsize
    if len(buf) != numel * itemsize:
        raise ContainerError(
            f"{where}: tensor of shape {shape} {dtype_name(dtype)} needs {numel * itemsize} bytes, found {len(buf)}"
        )
    if numel == 0:
        return torch.empty(shape, dtype=dtype)
    if not isinstance(buf, bytearray):
        buf = bytearray(buf)
    return torch.frombuffer(buf, dtype=torch.uint8).view(dtype).reshape(shape)


def check_json(value: Any, key: str, where: str) -> Any:
    """``value`` with tuples turned into lists, if it is a storable JSON value.

    Raises:
        ContainerError: for anything but ``None``, bool, int, float, str and lists / str-keyed
            dicts of those (numpy scalars and arrays included: convert them to tensors).
    """
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [check_json(v, key, where) for v in value]
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        return {k: check_json(v, key, where) for k, v in value.items()}
    raise ContainerError(
        f"{where}: attribute {key!r} is a {type(value).__name__}; a container stores tensors and plain "
        "JSON values (None, bool, int, float, str, lists and str-keyed dicts of those)"
    )


def dumps_json(value: Any) -> str:
    """Compact JSON text (NaN and infinities allowed)."""
    return json.dumps(value, separators=(",", ":"), allow_nan=True)


def sample_fields(sample: Any, where: str) -> Iterator[tuple[str, torch.Tensor | str]]:
    """The attributes of ``sample`` as ``(key, compact tensor | JSON text)`` pairs.

    Args:
        sample: a PyG ``Data`` (or a str-keyed mapping of attributes).
        where: location for error messages (``"<path>: sample 3"``).
    """
    if isinstance(sample, Data):
        items = iter(cast(Iterable[tuple[Any, Any]], sample))  # (key, value) pairs; PyG types __iter__ loosely
    elif isinstance(sample, Mapping):
        items = iter(sample.items())
    else:
        raise ContainerError(f"{where}: expected a torch_geometric Data, found {type(sample).__name__}")
    for key, value in items:
        if not isinstance(key, str):
            raise ContainerError(f"{where}: attribute names must be strings, found {key!r}")
        if isinstance(value, torch.Tensor):
            yield key, compact(value, key, where)
        else:
            yield key, dumps_json(check_json(value, key, where))


def build_data(fields: Mapping[str, Any]) -> Data:
    """A ``Data`` holding exactly ``fields`` (tensors as is, JSON text decoded by the caller)."""
    data = new_data()
    for key, value in fields.items():
        data[key] = value
    return data


def loads_json(text: Any, key: str, where: str) -> Any:
    """Decode a stored JSON attribute; ContainerError on garbage."""
    try:
        return json.loads(text)
    except (TypeError, ValueError, RecursionError) as exc:
        raise ContainerError(f"{where}: attribute {key!r}: stored JSON value is corrupted ({exc})") from None

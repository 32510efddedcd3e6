"""The fields of a ``.pt`` chunk file (:mod:`.pt_directory`): packing samples and reading them back.

A field every sample of the chunk has as a tensor of one dtype and rank is packed as ``{"data":
1-D concatenation, "shapes": int64 [n, rank]}``; any other as ``{"values": [per-sample tensor,
JSON text or None (absent)]}``. Since format 3 integer data is stored in the narrowest integer
dtype that holds it, with ``"dtype"`` naming its own (edge indices of small graphs: one byte
instead of eight), and a field given as :class:`~.packed_chunk.Rows` as ``{"table": [T, w],
"index": [R], "shapes"}`` (a periodic cell's edge offsets: 27 rows per cell and an index per edge
instead of three float64 per edge). A read restores the exact tensors and refuses, as a
``ContainerError``, any field whose parts do not fit together (an index past its table
included). Decoding (widening narrowed integers, expanding a table) may make a chunk at most
:data:`DECODE_FACTOR` times its file's bytes: what a field would decode to is computed from its
declared sizes and refused, by name, before anything is allocated. Format 2 chunks (no narrowing,
no tables) read the same way.
"""

from __future__ import annotations

import itertools
import math
from typing import Any, cast

import torch

from ..errors import ContainerError
from .codec import DTYPES, compact, dtype_name
from .packed_chunk import PackedChunk, Rows

__all__ = ["ChunkField", "narrowed", "pack_chunk", "pack_samples", "unpack_chunk"]

_NARROW = (torch.int8, torch.int16, torch.int32)
DECODE_FACTOR = 64
"""Most bytes a chunk's fields may decode to, per byte of its file (int8 -> int64 is 8, a periodic
cell's offset table about 24 per edge; a crafted table or width asks for hundreds)."""
DECODE_FLOOR = 1 << 20
"""Bytes any chunk may decode to whatever its size."""


class DecodeBudget:
    """What the fields of one chunk may still decode to (bytes); :meth:`take` refuses the rest."""

    def __init__(self, file_bytes: int | None) -> None:
        self.left = None if file_bytes is None else DECODE_FACTOR * file_bytes + DECODE_FLOOR
        self.file_bytes = file_bytes

    def take(self, nbytes: int, key: str, where: str) -> None:
        if self.left is None:
            return
        if nbytes > self.left:
            raise ContainerError(
                f"{where}: field {key!r} would decode to {nbytes} bytes from a chunk file of {self.file_bytes} bytes "
                f"(more than {DECODE_FACTOR} times its size: a crafted size); refused before decoding"
            )
        self.left -= nbytes


def narrowed(data: torch.Tensor) -> dict[str, Any]:
    """A field's 1-D data as stored: integers in the narrowest integer dtype that holds them, with
    ``"dtype"`` naming theirs (edge indices of small graphs take a byte instead of eight)."""
    if data.dtype in (torch.int16, torch.int32, torch.int64) and data.numel():
        low, high = (int(v) for v in torch.aminmax(data))
        for narrow in _NARROW:
            info = torch.iinfo(narrow)
            if narrow.itemsize < data.element_size() and info.min <= low and high <= info.max:
                return {"data": data.to(narrow), "dtype": dtype_name(data.dtype)}
    return {"data": data}


def pack_chunk(chunk: PackedChunk, where: str) -> dict[str, Any]:
    """The chunk file's ``fields`` of a packed chunk (each field's data compact, as a sample's;
    :class:`~.packed_chunk.Rows` as their table and narrowed index)."""
    fields: dict[str, Any] = {}
    for key, (data, shapes) in chunk.fields.items():
        if isinstance(data, Rows):
            index = narrowed(compact(data.index, key, where))["data"]
            fields[key] = {"table": compact(data.table, key, where), "index": index, "shapes": shapes}
        else:
            fields[key] = {**narrowed(compact(data, key, where)), "shapes": shapes}
    return {"fields": fields}


def pack_samples(chunk: list[dict[str, torch.Tensor | str]]) -> dict[str, Any]:
    """``{"fields": packed fields, "orders": per-sample key order}`` of a chunk's samples (see
    the module docstring); ``orders`` only when a sample's attribute order is not the order of
    first appearance, so that a read gives the attributes in the order written."""
    keys = list(dict.fromkeys(k for fields in chunk for k in fields))
    orders = [list(fields) if list(fields) != [k for k in keys if k in fields] else None for fields in chunk]
    out: dict[str, dict[str, Any]] = {}
    for key in keys:
        values = [fields.get(key) for fields in chunk]
        first = values[0]
        if isinstance(first, torch.Tensor) and all(
            isinstance(v, torch.Tensor) and v.dtype == first.dtype and v.dim() == first.dim() for v in values
        ):
            tensors = cast(list[torch.Tensor], values)
            shapes = torch.tensor([list(t.shape) for t in tensors], dtype=torch.int64).reshape(
                len(tensors), first.dim()
            )
            out[key] = {**narrowed(torch.cat([t.reshape(-1) for t in tensors])), "shapes": shapes}
        else:
            out[key] = {"values": values}
    return {"fields": out, **({"orders": orders} if any(o is not None for o in orders) else {})}


class ChunkField:
    """One packed field of a decoded chunk: sample ``j``'s value by :meth:`get` (a fresh tensor,
    JSON text, or ``None`` when the sample has no such field)."""

    def __init__(self, key: str, packed: Any, count: int, where: str, budget: DecodeBudget | None = None) -> None:
        self.key = key
        bad = ContainerError(f"{where}: field {key!r} is not a packed field of {count} samples")
        if not isinstance(packed, dict):
            raise bad
        if "values" in packed:
            values = packed["values"]
            if (
                not isinstance(values, list)
                or len(values) != count
                or not all(v is None or isinstance(v, (torch.Tensor, str)) for v in values)
            ):
                raise bad
            self.values: list[Any] | None = values
            return
        self.values = None
        data, shapes = decoded(packed, bad, budget or DecodeBudget(None), key, where), packed.get("shapes")
        if not (
            isinstance(data, torch.Tensor)
            and data.dim() == 1
            and isinstance(shapes, torch.Tensor)
            and shapes.dtype == torch.int64
            and shapes.dim() == 2
            and shapes.shape[0] == count
            and bool((shapes >= 0).all())
        ):
            raise bad
        self.shapes = [tuple(row) for row in shapes.tolist()]
        ends = list(itertools.accumulate(math.prod(shape) for shape in self.shapes))  # Python ints: no overflow
        if (ends[-1] if ends else 0) != data.numel():
            raise ContainerError(
                f"{where}: field {key!r} holds {data.numel()} values, its shapes {ends[-1] if ends else 0}"
            )
        self.data = data
        self.bounds = list(zip([0, *ends[:-1]], ends))

    def get(self, j: int) -> Any:
        if self.values is not None:
            value = self.values[j]
            return value.clone() if isinstance(value, torch.Tensor) else value
        start, end = self.bounds[j]
        return self.data[start:end].view(self.shapes[j]).clone()


def decoded(packed: dict[Any, Any], bad: ContainerError, budget: DecodeBudget, key: str, where: str) -> Any:
    """A packed field's 1-D data: ``data`` as stored, widened to ``dtype`` when named, or
    ``table[index]`` (version 3); ``bad`` for anything else, out-of-range indices included. What a
    widening or a table would allocate is taken from ``budget`` first."""
    if "table" in packed:
        table, index = packed.get("table"), packed.get("index")
        if not (
            isinstance(table, torch.Tensor)
            and table.dim() == 2
            and isinstance(index, torch.Tensor)
            and index.dim() == 1
            and index.dtype in (torch.int8, torch.int16, torch.int32, torch.int64)
            and (not index.numel() or (int(index.min()) >= 0 and int(index.max()) < table.shape[0]))
        ):
            raise bad
        budget.take(index.numel() * table.shape[1] * table.element_size(), key, where)
        return table.index_select(0, index.long()).reshape(-1)
    data, name = packed.get("data"), packed.get("dtype")
    if name is None:
        return data
    dtype = DTYPES.get(name) if isinstance(name, str) else None
    if (
        dtype is None
        or dtype.is_floating_point
        or dtype.is_complex
        or dtype == torch.bool
        or not isinstance(data, torch.Tensor)
        or data.dtype not in _NARROW
    ):
        raise bad
    budget.take(data.numel() * dtype.itemsize, key, where)
    return data.to(dtype)


def unpack_chunk(
    fields: dict[Any, Any], orders: Any, count: int, where: str, file_bytes: int | None = None
) -> tuple[list[ChunkField], list[Any] | None]:
    """A chunk's packed fields decoded, and its per-sample key orders (checked against them);
    with ``file_bytes`` (the chunk file's size), decoding is bounded by :class:`DecodeBudget`."""
    if not all(isinstance(k, str) for k in fields):
        raise ContainerError(f"{where}: attribute names must be strings")
    budget = DecodeBudget(file_bytes)
    packed = [ChunkField(key, value, count, where, budget) for key, value in fields.items()]
    if orders is not None:
        if not isinstance(orders, list) or len(orders) != count:
            raise ContainerError(f"{where}: 'orders' is not a list of {count} key orders")
        for j, order in enumerate(orders):
            present = {f.key for f in packed if (f.values[j] is not None if f.values is not None else True)}
            if order is not None and (
                not isinstance(order, list) or set(order) != present or len(order) != len(present)
            ):
                raise ContainerError(f"{where}: sample {j}'s key order does not name its attributes")
    return packed, orders

"""Normalization of named tensors: an explicit, invertible step with stored statistics.

``Normalizer.fit`` streams once over a dataset and computes, per named tensor and per column,
a shift and a scale (float64 accumulation):

* ``"standard"``: shift = mean, scale = population standard deviation;
* ``"minmax"``: shift = min, scale = max - min (values map to [0, 1]).

A zero scale (a constant column) is stored as 1, so the column is only shifted.
``apply`` maps ``v -> (v - shift) / scale`` and ``invert`` maps it back. The statistics
serialise with ``to_dict`` (JSON-able; dataset containers store it as ``normalization``) and
load with ``from_dict``.

Columns: a tensor of shape ``(..., C)`` with two or more dimensions has ``C`` columns; a 1-D or
0-D tensor has one column. A graph quantity stored as a 1-D vector ``(dim,)`` must be given a
``schema`` (or stored as ``(1, dim)``) so its entries are treated as columns.

Per-atom option: names listed in ``per_atom`` must be graph quantities (one row per graph); they
are divided by the graph's node count before normalization (statistics are those of the
per-atom value) and multiplied back by ``invert``. Typical for total energies of systems of
different sizes.

Order in a pipeline: normalize *raw* samples, then ``prepare`` (the derived ``y`` /
``*_output`` tensors are built from the normalized sources). ``apply(sample, schema=schema)``
does both; applying to an already prepared sample without a schema is refused, since its
derived tensors would go stale. Note for interatomic potentials: forces are ``-dE/dpos``, so
normalizing forces independently of energy (with a shift) breaks that relation; normalize the
energy only, or not at all.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

import hydragnn.data.pyg_import  # noqa: F401 (PyG as HydraGNN needs it)

import torch
from torch_geometric.data import Data

from .errors import DataError
from .prepare import prepare
from .schema import Schema

METHODS: tuple[str, ...] = ("standard", "minmax")
FORMAT_VERSION = 1
_STAT_KEYS = ("method", "shift", "scale", "per_atom", "count")


@dataclass(frozen=True)
class NormStats:
    """Statistics of one named tensor.

    Attributes:
        method: ``"standard"`` or ``"minmax"``.
        shift: per-column value subtracted (mean or min).
        scale: per-column divisor (std or max - min; 1 where that was 0).
        per_atom: the (graph-level) value is divided by the node count first.
        count: number of rows the statistics were computed over.
    """

    method: str
    shift: tuple[float, ...]
    scale: tuple[float, ...]
    per_atom: bool = False
    count: int = 0

    @property
    def dim(self) -> int:
        return len(self.shift)

    def to_dict(self) -> dict[str, Any]:
        return {
            "method": self.method,
            "shift": list(self.shift),
            "scale": list(self.scale),
            "per_atom": self.per_atom,
            "count": self.count,
        }


def _where(index: int | None) -> str:
    return f"sample {index}" if index is not None else "sample"


def _node_counts(data: Data) -> torch.Tensor:
    """Nodes per graph, ``[B]`` (``B = 1`` for a single ``Data``)."""
    ptr = getattr(data, "ptr", None)
    if isinstance(ptr, torch.Tensor):
        return (ptr[1:] - ptr[:-1]).to(torch.float64)
    num_nodes = data.num_nodes
    if num_nodes is None:
        raise DataError("per-atom normalization needs the node count of each sample (x, pos or num_nodes); none found")
    return torch.tensor([float(num_nodes)], dtype=torch.float64)


class Normalizer:
    """Invertible per-column normalization of named tensors.

    Build with :meth:`fit` or :meth:`from_dict`.

    Args:
        stats: statistics per name.
    """

    def __init__(self, stats: Mapping[str, NormStats]):
        self.stats: dict[str, NormStats] = dict(stats)

    @property
    def names(self) -> tuple[str, ...]:
        """Names of the normalized tensors."""
        return tuple(self.stats)

    def __contains__(self, name: object) -> bool:
        return name in self.stats

    def __repr__(self) -> str:
        return f"Normalizer({', '.join(f'{n}: {s.method}' for n, s in self.stats.items())})"

    # ------------------------------------------------------------------ fit
    @classmethod
    def fit(
        cls,
        dataset: Iterable[Data] | Sequence[Data],
        names: Sequence[str],
        method: str | Mapping[str, str] = "standard",
        *,
        per_atom: Sequence[str] = (),
        schema: Schema | None = None,
    ) -> Normalizer:
        """Compute statistics over every sample of ``dataset`` in one streaming pass.

        Args:
            dataset: map-style or iterable dataset of PyG ``Data`` (raw samples).
            names: attribute names to normalize.
            method: ``"standard"`` or ``"minmax"``, for all names or per name.
            per_atom: names (graph quantities) divided by the node count before normalizing.
            schema: when given, each name's ``dim`` from the schema fixes its column count.

        Raises:
            DataError: for unknown methods, a name missing from a sample (naming the sample
                index), inconsistent column counts, non-finite values or an empty dataset.
        """
        names = list(names)
        if not names or len(set(names)) != len(names):
            raise DataError(f"names: expected a non-empty list of distinct names, found {names!r}")
        methods = {n: method for n in names} if isinstance(method, str) else dict(method)
        for n in names:
            if methods.get(n) not in METHODS:
                raise DataError(f"method of {n!r}: expected one of {list(METHODS)}, found {methods.get(n)!r}")
        extra = sorted(set(per_atom) - set(names))
        if extra:
            raise DataError(f"per_atom: {extra} are not among the names being normalized {names}")
        dims: dict[str, int | None] = {
            n: (schema[n].dim if schema is not None and n in schema else None) for n in names
        }
        acc: dict[str, dict[str, Any]] = {n: {"n": 0} for n in names}

        if hasattr(dataset, "__len__") and hasattr(dataset, "__getitem__"):
            indexed = cast(Sequence[Data], dataset)  # map-style
            samples: Iterable[Data] = (indexed[i] for i in range(len(indexed)))
        else:
            samples = dataset
        for i, data in enumerate(samples):
            for n in names:
                rows = cls._rows(data, n, dims[n], n in per_atom, i)
                dims[n] = rows.shape[1]
                if not bool(torch.isfinite(rows).all()):
                    raise DataError(f"sample {i}: {n!r} holds non-finite values; cannot compute statistics")
                cls._accumulate(acc[n], rows, methods[n])
        stats: dict[str, NormStats] = {}
        for n in names:
            a = acc[n]
            if a["n"] == 0:
                raise DataError(f"{n!r}: no values to compute statistics from (empty dataset?)")
            if methods[n] == "standard":
                shift = a["mean"]
                scale = (a["m2"] / a["n"]).sqrt()
                flat = scale <= 1e-12 * shift.abs()
            else:
                shift = a["min"]
                scale = a["max"] - a["min"]
                flat = scale <= 1e-12 * shift.abs()
            scale = torch.where((scale == 0) | flat, torch.ones_like(scale), scale)
            stats[n] = NormStats(methods[n], tuple(shift.tolist()), tuple(scale.tolist()), n in per_atom, int(a["n"]))
        return cls(stats)

    @staticmethod
    def _rows(data: Any, name: str, dim: int | None, per_atom: bool, index: int | None) -> torch.Tensor:
        """``data[name]`` as float64 ``[rows, dim]`` (divided by node counts when per-atom)."""
        where = _where(index)
        if not isinstance(data, Data):
            raise DataError(f"{where}: expected a torch_geometric Data, found {type(data).__name__}")
        t = getattr(data, name, None)
        if not isinstance(t, torch.Tensor):
            found = "nothing" if t is None else type(t).__name__
            raise DataError(f"{where}: normalized tensor {name!r} is missing (found {found})")
        cols = dim if dim is not None else (t.shape[-1] if t.dim() >= 2 else 1)
        if (t.dim() >= 2 and t.shape[-1] != cols) or (cols and t.numel() % cols):
            raise DataError(f"{where}: {name!r} has shape {tuple(t.shape)}; expected {cols} column(s)")
        rows = t.detach().to(torch.float64).reshape(-1, cols)
        if per_atom:
            counts = _node_counts(data)
            if rows.shape[0] != counts.numel():
                raise DataError(
                    f"{where}: {name!r} is normalized per atom, so it must hold one row per graph "
                    f"({counts.numel()}), found shape {tuple(t.shape)}"
                )
            rows = rows / counts.clamp(min=1).unsqueeze(1)
        return rows

    @staticmethod
    def _accumulate(a: dict[str, Any], rows: torch.Tensor, method: str) -> None:
        nb = rows.shape[0]
        if nb == 0:
            return
        if method == "standard":  # Chan et al. parallel update of mean and M2
            mean_b = rows.mean(0)
            m2_b = ((rows - mean_b) ** 2).sum(0)
            na = a["n"]
            if na == 0:
                a["mean"], a["m2"] = mean_b, m2_b
            else:
                n = na + nb
                delta = mean_b - a["mean"]
                a["mean"] = a["mean"] + delta * (nb / n)
                a["m2"] = a["m2"] + m2_b + delta**2 * (na * nb / n)
        else:
            lo, hi = rows.min(0).values, rows.max(0).values
            a["min"] = lo if a["n"] == 0 else torch.minimum(a["min"], lo)
            a["max"] = hi if a["n"] == 0 else torch.maximum(a["max"], hi)
        a["n"] += nb

    # ------------------------------------------------------------------ apply / invert
    def _transform(
        self,
        data: Data | torch.Tensor,
        name: str,
        index: int | None,
        forward: bool,
        num_nodes: torch.Tensor | None = None,
    ) -> torch.Tensor:
        s = self.stats[name]
        if isinstance(data, Data):
            rows = self._rows(data, name, s.dim, False, index)
            t = cast(torch.Tensor, getattr(data, name))  # _rows checked it is a tensor
            counts = _node_counts(data) if s.per_atom else None
        else:
            rows = self._tensor_rows(data, name, s.dim)
            t = data
            counts = num_nodes
        shift = torch.tensor(s.shift, dtype=torch.float64, device=rows.device)
        scale = torch.tensor(s.scale, dtype=torch.float64, device=rows.device)
        if s.per_atom:
            if counts is None:
                raise DataError(f"{name!r} is normalized per atom: pass num_nodes (nodes per graph) to invert a tensor")
            counts = torch.as_tensor(counts, dtype=torch.float64, device=rows.device).reshape(-1, 1).clamp(min=1)
            strict = isinstance(data, Data)
            if counts.shape[0] != rows.shape[0] and (strict or counts.shape[0] != 1):
                raise DataError(
                    f"{_where(index)}: {name!r} is normalized per atom; expected one row per graph "
                    f"({counts.shape[0]}), found {rows.shape[0]} rows"
                )
        if forward:
            out = ((rows / counts if s.per_atom and counts is not None else rows) - shift) / scale
        else:
            out = rows * scale + shift
            out = out * counts if s.per_atom and counts is not None else out
        dtype = t.dtype if t.is_floating_point() else torch.get_default_dtype()
        return out.to(dtype).reshape(t.shape)

    @staticmethod
    def _tensor_rows(t: Any, name: str, dim: int) -> torch.Tensor:
        if not isinstance(t, torch.Tensor):
            raise DataError(f"{name!r}: expected a tensor or a Data, found {type(t).__name__}")
        if (t.dim() >= 2 and t.shape[-1] != dim) or t.numel() % dim:
            raise DataError(f"{name!r}: shape {tuple(t.shape)} does not have the {dim} column(s) it was fitted with")
        return t.detach().to(torch.float64).reshape(-1, dim)

    def apply(self, data: Data, *, index: int | None = None, schema: Schema | None = None) -> Data:
        """Normalize every fitted name of ``data``.

        Args:
            data: a raw sample (or ``Batch``) carrying every fitted name.
            index: position of the sample, for error messages.
            schema: when given, the result is passed through :func:`hydragnn.data.prepare`, so
                its derived tensors (``y``, ``*_output``) hold the normalized targets.

        Returns:
            A new ``Data``; ``data`` is left untouched.

        Raises:
            DataError: a fitted name is missing or misshaped (naming the sample index and
                name), or ``data`` is already prepared and no ``schema`` was given.
        """
        if not isinstance(data, Data):
            raise DataError(f"{_where(index)}: expected a torch_geometric Data, found {type(data).__name__}")
        if schema is None and "y_loc" in data:
            raise DataError(
                f"{_where(index)}: already prepared (carries y / *_output); normalizing its sources "
                "would leave them stale. Normalize raw samples before prepare(), or pass schema= "
                "to re-prepare"
            )
        out = copy.copy(data)
        for name in self.stats:
            out[name] = self._transform(data, name, index, forward=True)
        return prepare(out, schema, index) if schema is not None else out

    def invert(
        self, data_or_tensor: Data | torch.Tensor, name: str | None = None, *, num_nodes: Any = None
    ) -> Data | torch.Tensor:
        """Undo :meth:`apply`.

        Args:
            data_or_tensor: a normalized ``Data`` / ``Batch`` (returns a new one with the fitted
                names, or only ``name``, restored), or a tensor of values of ``name`` (e.g. a
                model prediction, ``[B, dim]`` or ``[N, dim]``).
            name: which statistics to use; required for a tensor.
            num_nodes: nodes per graph (int or ``[B]``), needed for a per-atom name given as a
                tensor; taken from the ``Data`` / ``Batch`` otherwise.

        Returns:
            The tensor in original units (same shape and floating dtype), or a new ``Data``.

        Raises:
            DataError: unknown name, missing name on the data, wrong column count, or a per-atom
                tensor without ``num_nodes``.
        """
        if name is not None and name not in self.stats:
            raise DataError(f"{name!r}: no normalization statistics; known: {list(self.stats)}")
        if isinstance(data_or_tensor, Data):
            out = copy.copy(data_or_tensor)
            for n in [name] if name is not None else [n for n in self.stats if n in data_or_tensor]:
                out[n] = self._transform(data_or_tensor, n, None, forward=False)
            return out
        if name is None:
            raise DataError("invert: name is required when inverting a tensor")
        return self._transform(data_or_tensor, name, None, forward=False, num_nodes=num_nodes)

    # ------------------------------------------------------------------ serialisation
    def to_dict(self) -> dict[str, Any]:
        """JSON-able form: ``{"format_version": 1, "variables": {name: {method, shift, scale, per_atom, count}}}``."""
        return {"format_version": FORMAT_VERSION, "variables": {n: s.to_dict() for n, s in self.stats.items()}}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Normalizer:
        """Rebuild from :meth:`to_dict` output.

        Raises:
            DataError: a newer ``format_version`` or malformed entries, naming the key path.
        """
        w = "normalization"
        if not isinstance(d, Mapping) or not isinstance(d.get("variables"), Mapping):
            raise DataError(f"{w}: expected {{'format_version': int, 'variables': {{...}}}}, found {d!r:.200}")
        version = d.get("format_version")
        if not isinstance(version, int) or isinstance(version, bool) or not 1 <= version <= FORMAT_VERSION:
            raise DataError(f"{w}.format_version: this reader handles 1..{FORMAT_VERSION}, found {version!r}")
        stats: dict[str, NormStats] = {}
        for n, e in d["variables"].items():
            where = f"{w}.variables.{n}"
            if not isinstance(e, Mapping) or set(e) != set(_STAT_KEYS):
                found = sorted(e) if isinstance(e, Mapping) else type(e).__name__
                raise DataError(f"{where}: expected keys {list(_STAT_KEYS)}, found {found}")
            if e["method"] not in METHODS:
                raise DataError(f"{where}.method: expected one of {list(METHODS)}, found {e['method']!r}")
            for key in ("shift", "scale"):
                v = e[key]
                if (
                    not isinstance(v, list)
                    or not v
                    or len(v) != len(e["shift"])
                    or not all(isinstance(x, (int, float)) and math.isfinite(x) for x in v)
                ):
                    raise DataError(
                        f"{where}.{key}: expected a non-empty list of finite numbers, one per column, found {v!r}"
                    )
            if any(x == 0 for x in e["scale"]):
                raise DataError(f"{where}.scale: zero entries cannot be inverted, found {e['scale']!r}")
            if not isinstance(e["per_atom"], bool) or not isinstance(e["count"], int):
                raise DataError(
                    f"{where}: per_atom must be a bool and count an int, found {e['per_atom']!r}, {e['count']!r}"
                )
            stats[n] = NormStats(
                e["method"],
                tuple(float(x) for x in e["shift"]),
                tuple(float(x) for x in e["scale"]),
                e["per_atom"],
                e["count"],
            )
        return cls(stats)

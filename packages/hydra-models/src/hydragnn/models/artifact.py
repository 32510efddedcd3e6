"""Model artifacts: one file, a JSON manifest plus ``safetensors`` weights. Never unpickled.

Layout (little-endian)::

    b"HYDRAGNN"             8 bytes, magic
    u32 format_version      readable before anything else, so a newer file is refused cleanly
    u64 manifest_length
    manifest                UTF-8 JSON
    weights                 safetensors bytes
    sha256                  32 bytes (format 2): SHA-256 of everything before it

Format 3 adds no field: it marks files whose graph heads standardise their input by default
(``output_heads.graph.input_norm``); older files read with that key set to ``"none"``, as they
were written (:func:`_migrate`). Format 2 covers the header, the manifest and the weights with one checksum, verified before
anything is parsed (one flipped bit of ``radius`` is an error, not a different model); format 1
files (no trailing checksum, the weights alone checked) are still read. Before the model is
built, every size the manifest declares is bounded by the stored weights
(:func:`~hydragnn.models.artifact_bounds.check_declared_sizes`: ``num_radial: 1e9`` or 5000
layers around a few KB is refused in milliseconds), and while it is built no single tensor it
allocates may be much larger than the largest tensor in the file, nor all of them together more
than a bound set by the file's weights (:func:`_allocation_limits`), so a crafted architecture is
refused instead of allocating gigabytes.

The manifest holds ``format``, ``format_version``, ``writer`` (package versions),
``architecture`` (the full ``Architecture`` section), ``schema`` (the ``Variables`` section),
``normalization``, ``species``, ``cutoff``, ``dtype``, ``weights_sha256``, ``weights_bytes``
and ``extra``. A reader accepts every format version up to :data:`FORMAT_VERSION`.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import struct
from collections.abc import Mapping, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save
from torch.utils._python_dispatch import TorchDispatchMode

from hydragnn.data import Schema
from hydragnn.data.io.atomic import atomic_write

from .artifact_bounds import check_declared_sizes
from .build import build_model
from .committee import Committee
from .errors import ArtifactError
from .model import HydraModel

MAGIC = b"HYDRAGNN"
FORMAT_VERSION = 3
"""The newest artifact format this version writes and reads."""
CHECKSUM_BYTES = 32
"""Length of the trailing SHA-256 of format 2."""
FORMAT_NAME = "hydragnn-model"
_HEADER = struct.Struct("<8sIQ")


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:  # pragma: no cover - always installed with hydra-models
        return None


def _jsonable(value: Any, where: str) -> Any:
    """Tensors and numpy values as lists / numbers; anything else must already be JSON."""
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().tolist()
    if hasattr(value, "tolist") and callable(value.tolist):
        return value.tolist()
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v, f"{where}.{k}") for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v, f"{where}[{i}]") for i, v in enumerate(value)]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise ArtifactError(f"save_artifact: {where} holds a {type(value).__name__}, which is not JSON-serialisable")


def save_artifact(
    model: HydraModel | Committee,
    path: str | os.PathLike,
    *,
    normalization: Mapping[str, Any] | None = None,
    species: Sequence[int] | None = None,
    extra: Mapping[str, Any] | None = None,
) -> Path:
    """Write ``model`` as one artifact file (atomically: temporary file + ``os.replace``).

    Args:
        model: a :class:`HydraModel` or :class:`~hydragnn.models.committee.Committee` from
            :func:`build_model`.
        path: destination (``.hydra`` by convention).
        normalization: statistics of the targets / inputs (JSON, tensors allowed).
        species: atomic numbers the model was trained on.
        extra: any other JSON metadata (training config, provenance, ...).

    Returns:
        The path written.

    Raises:
        ArtifactError: when the model is not a ``HydraModel`` or ``Committee`` or metadata is not JSON-serialisable.
    """
    if not isinstance(model, (HydraModel, Committee)):
        raise ArtifactError(f"save_artifact: expected a HydraModel or a Committee, found {type(model).__name__}")
    if not model.config.raw:
        raise ArtifactError(
            "save_artifact: the model's config has no source Architecture section (build it with build_model)"
        )
    state = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    weights = st_save(state)
    manifest = {
        "format": FORMAT_NAME,
        "format_version": FORMAT_VERSION,
        "writer": {name: _version(name) for name in ("hydra-models", "hydra-data", "torch")},
        "architecture": _jsonable(model.config.raw, "architecture"),
        "schema": model.schema.to_dict(),
        "normalization": _jsonable(normalization, "normalization"),
        "species": _jsonable(list(species) if species is not None else None, "species"),
        "cutoff": model.cutoff,
        "dtype": str(model.dtype).removeprefix("torch."),
        "weights_sha256": hashlib.sha256(weights).hexdigest(),
        "weights_bytes": len(weights),
        "extra": _jsonable(extra, "extra"),
    }
    blob = json.dumps(manifest, sort_keys=True).encode("utf-8")
    body = _HEADER.pack(MAGIC, FORMAT_VERSION, len(blob)) + blob + weights
    try:
        return atomic_write(path, body + hashlib.sha256(body).digest())
    except OSError as exc:
        raise ArtifactError(f"{path}: cannot write the model artifact: {exc}") from exc


def _read(path: str | os.PathLike) -> tuple[dict[str, Any], bytes]:
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ArtifactError(f"{path}: cannot read the model artifact: {exc}") from exc
    if len(data) < _HEADER.size or data[:8] != MAGIC:
        raise ArtifactError(
            f"{path}: not a HydraGNN model artifact (expected the magic bytes {MAGIC!r} at the start; "
            "pickled checkpoints are never loaded)"
        )
    _, version, length = _HEADER.unpack_from(data)
    if version > FORMAT_VERSION:
        raise ArtifactError(
            f"{path}: artifact format version {version} is newer than this reader "
            f"(hydra-models {_version('hydra-models')} reads format versions <= {FORMAT_VERSION}); "
            f"install a hydra-models that reads format version {version}"
        )
    if version < 1:
        raise ArtifactError(f"{path}: invalid artifact format version {version}")
    if version >= 2:
        if len(data) < _HEADER.size + CHECKSUM_BYTES:
            raise ArtifactError(f"{path}: truncated artifact: {len(data)} bytes")
        data, digest = data[:-CHECKSUM_BYTES], data[-CHECKSUM_BYTES:]
        if hashlib.sha256(data).digest() != digest:
            raise ArtifactError(
                f"{path}: corrupted or truncated artifact: its header, manifest and weights do not match the "
                "file's SHA-256 checksum"
            )
    end = _HEADER.size + length
    if end > len(data):
        raise ArtifactError(
            f"{path}: truncated artifact: manifest of {length} bytes, file has {len(data) - _HEADER.size}"
        )
    try:
        manifest = json.loads(data[_HEADER.size : end].decode("utf-8"))
    except (ValueError, RecursionError) as exc:  # bad UTF-8 / JSON, an int of > 4300 digits; deep nesting
        raise ArtifactError(f"{path}: corrupted artifact manifest: {str(exc)[:200]}") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT_NAME:
        raise ArtifactError(f"{path}: corrupted artifact manifest (expected format {FORMAT_NAME!r})")
    if manifest.get("format_version") != version:
        raise ArtifactError(
            f"{path}: corrupted artifact: header says format version {version}, manifest says {manifest.get('format_version')!r}"
        )
    weights = data[end:]
    if len(weights) != manifest.get("weights_bytes"):
        raise ArtifactError(
            f"{path}: truncated or corrupted artifact: expected {manifest.get('weights_bytes')} weight bytes, found {len(weights)}"
        )
    if hashlib.sha256(weights).hexdigest() != manifest.get("weights_sha256"):
        raise ArtifactError(f"{path}: corrupted artifact: the weights do not match their SHA-256 checksum")
    return _migrate(manifest, version), weights


def _migrate(manifest: dict[str, Any], version: int) -> dict[str, Any]:
    """The manifest of an older format, with the defaults it was written under made explicit.

    Before format 3, graph heads had no input standardisation: their ``input_norm`` is ``"none"``
    unless the file says otherwise. Anything malformed is left for the model build to refuse.
    """
    arch = manifest.get("architecture")
    if version >= 3 or not isinstance(arch, dict):
        return manifest
    if arch.get("output_heads") is None:
        arch["output_heads"] = {}
    heads = arch["output_heads"]
    graph = heads.setdefault("graph", {}) if isinstance(heads, dict) else None
    if isinstance(graph, dict):
        graph.setdefault("input_norm", "none")
    return manifest


def read_manifest(path: str | os.PathLike) -> dict[str, Any]:
    """The manifest of an artifact (the file is fully checked; no model is built).

    Raises:
        ArtifactError: missing, truncated, corrupted or newer-format file.
    """
    return _read(path)[0]


def load_artifact(path: str | os.PathLike, *, device: str | torch.device = "cpu") -> HydraModel | Committee:
    """Rebuild the model of an artifact, in eval mode, with its weights.

    Args:
        path: the artifact file.
        device: where to put the model.

    Returns:
        A :class:`HydraModel` (a :class:`~hydragnn.models.committee.Committee` for a
        ``committee`` section) with ``model.manifest`` set to the manifest dict (normalization,
        species, writer versions, ...).

    Raises:
        ArtifactError: missing, truncated, corrupted or newer-format file, or weights that do
            not fit the architecture.
    """
    manifest, weights = _read(path)
    try:
        state = st_load(weights)
    except Exception as exc:  # safetensors raises its own error types
        raise ArtifactError(f"{path}: corrupted artifact weights: {exc}") from exc
    check_declared_sizes(manifest, state, path)
    bad = [k for k, t in state.items() if t.is_floating_point() and not bool(torch.isfinite(t).all())]
    if bad:
        raise ArtifactError(
            f"{path}: the weights hold NaN or inf values, in {_first(bad)}: the model would answer NaN "
            "(a training that diverged?); use an earlier checkpoint or artifact"
        )
    try:
        with torch.random.fork_rng(devices=[]), _AllocationGuard(_allocation_limits(state)):  # RNG untouched
            model = build_model(manifest["architecture"], Schema.from_dict(manifest["schema"]))
    except _TooLarge as exc:
        raise ArtifactError(
            f"{path}: the manifest's architecture does not fit its weights: building it would allocate a tensor "
            f"of shape {exc.shape} ({exc.nbytes / 2**20:.1f} MiB), {exc.what}, for "
            f"{sum(t.numel() * t.element_size() for t in state.values()) / 2**20:.3f} MiB of weights"
        ) from None
    except Exception as exc:  # a crafted value may break the build anywhere (overflow, bad shapes, ...)
        raise ArtifactError(
            f"{path}: cannot rebuild the model from the manifest: {type(exc).__name__}: {_clip(str(exc))}"
        ) from exc
    dtype = getattr(torch, str(manifest.get("dtype")), None)
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise ArtifactError(f"{path}: corrupted artifact manifest: unknown dtype {manifest.get('dtype')!r}")
    model.to(dtype)
    missing, unexpected = _key_mismatch(model.state_dict(), state)
    if missing or unexpected:
        raise ArtifactError(
            f"{path}: the weights do not fit the architecture: missing keys {_first(missing)}; "
            f"unexpected keys {_first(unexpected)}"
        )
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as exc:  # shapes; torch lists every mismatching tensor
        raise ArtifactError(f"{path}: the weights do not fit the architecture: {_clip(str(exc))}") from None
    model.manifest = manifest  # pyright: ignore[reportArgumentType]  # nn.Module.__setattr__ is typed Tensor | Module; it stores any value
    return model.to(device).eval()


def _key_mismatch(expected: Mapping[str, Any], found: Mapping[str, Any]) -> tuple[list[str], list[str]]:
    return [k for k in expected if k not in found], [k for k in found if k not in expected]


def _first(keys: Sequence[str], n: int = 10) -> str:
    """At most ``n`` keys, then how many more: a message stays short however many keys differ."""
    shown = ", ".join(repr(k[:200]) for k in keys[:n])
    return f"[{shown}{f', ... and {len(keys) - n} more' if len(keys) > n else ''}]"


def _clip(text: str, limit: int = 2000) -> str:
    return text if len(text) <= limit else f"{text[:limit]} ... ({len(text) - limit} more characters)"


def _largest_bytes(state: Mapping[str, torch.Tensor]) -> int:
    return max((t.numel() * t.element_size() for t in state.values()), default=0)


def _allocation_limits(state: Mapping[str, torch.Tensor]) -> tuple[int, int]:
    """``(per_tensor, total)`` bytes a model of these weights may allocate while it is built.

    Per tensor: 8x the file's largest weight + 96 MiB; in all (every allocation counted, freed or
    not): 4x the file's weights + 1 GiB. The allowances cover float64 builds of float32 files and
    the constants an architecture derives rather than stores: e3nn's normalisation samples 10^6
    points (7.6 MiB), and MACE's symmetric-contraction matrices at mace-torch's own ``max_ell`` 3,
    correlation 3 take 16.5 MiB per tensor and 227 MiB in all at 32 channels, 66 MiB and 910 MiB at
    128 (measured 2026-12-06; the earlier 16 MiB / 64 MiB refused such models after training). A
    crafted architecture (a huge width, thousands of layers) is still refused from the requested
    sizes before it allocates a large tensor or a gigabyte in all.
    """
    total = sum(t.numel() * t.element_size() for t in state.values())
    return 8 * _largest_bytes(state) + 96 * 2**20, 4 * total + 2**30


class _TooLarge(Exception):
    def __init__(self, shape: tuple[int, ...], nbytes: int, what: str) -> None:
        super().__init__(f"{shape}: {nbytes} bytes ({what})")
        self.shape, self.nbytes, self.what = shape, nbytes, what


_FACTORIES = frozenset(
    {
        "empty",
        "empty_strided",
        "zeros",
        "ones",
        "full",
        "rand",
        "randn",
        "randint",
        "new_empty",
        "new_zeros",
        "new_ones",
        "new_full",
    }
)
_RANGES = frozenset({"linspace", "logspace", "arange", "eye", "randperm"})
_INTEGER_RANGES = frozenset({"arange", "randperm"})
"""Ranges whose default dtype may be int64 (counted as 8 bytes per element when no dtype is given)."""


def _factory_size(name: str, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Any:
    """The shape a factory or range op was asked for (``None`` where it is not read from plain numbers)."""
    if name in _FACTORIES:
        return args[1] if name.startswith("new_") and len(args) > 1 else (args[0] if args else kwargs.get("size"))
    if name in ("linspace", "logspace"):
        return [args[2] if len(args) > 2 else kwargs.get("steps")]
    if name == "eye":
        return [args[0], args[1] if len(args) > 1 else args[0]]
    if name == "randperm":
        return [args[0]]
    if name == "arange":
        start, end, step = (0, args[0], 1) if len(args) == 1 else (*args[:2], args[2] if len(args) > 2 else 1)
        if (
            all(isinstance(v, (int, float)) for v in (start, end, step))
            and step
            and math.isfinite((end - start) / step)
        ):
            return [max(0, math.ceil((end - start) / step))]
    return None


class _AllocationGuard(TorchDispatchMode):
    """Refuses a factory allocation (``empty``, ``zeros``, ``randn``, ...) or range
    (``linspace``, ``arange``, ``eye``, ...) above ``per_tensor`` bytes, or one that takes the
    running total above ``total``, from the requested size, before anything is allocated."""

    def __init__(self, limits: tuple[int, int]) -> None:
        super().__init__()
        self.per_tensor, self.total = limits
        self.allocated = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func.overloadpacket.__name__
        size = _factory_size(name, args, kwargs) if name in _FACTORIES or name in _RANGES else None
        if isinstance(size, (list, tuple)) and all(isinstance(n, int) for n in size):
            dtype = kwargs.get("dtype") or (
                args[0].dtype
                if name.startswith("new_")
                else torch.int64
                if name in _INTEGER_RANGES
                else torch.get_default_dtype()
            )
            nbytes = math.prod(size) * dtype.itemsize
            if nbytes > self.per_tensor:
                raise _TooLarge(
                    tuple(size), nbytes, f"more than the {self.per_tensor / 2**20:.1f} MiB allowed per tensor"
                )
            self.allocated += nbytes
            if self.allocated > self.total:
                raise _TooLarge(
                    tuple(size), nbytes, f"taking the build past the {self.total / 2**20:.1f} MiB allowed in all"
                )
        return func(*args, **kwargs)

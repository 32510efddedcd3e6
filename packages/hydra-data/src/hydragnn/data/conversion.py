"""Convert a file ASE reads into a prepared dataset container once, and reuse it while valid.

:func:`convert_source` streams the frames of an :class:`~hydragnn.data.ase_source.AseSource`,
prepares each against the schema (given or inferred), builds its edges at ``cutoff`` and writes
them to a container (``.pt`` directory or ADIOS2) in a cache folder, next to a record of the
*fingerprint* that decided them: the file's size and SHA-256, the frame selection, the label
keys, the schema, the cutoff and the converter version. The next call with the same
fingerprint opens the container and rebuilds nothing; any change builds a new entry and says
what changed. Entries made from an older content of the same file are removed.

Cache layout (default ``<file's folder>/.hydragnn_cache``, else ``converted/`` in the user cache,
``$HYDRAGNN_CACHE`` or ``~/.cache/hydragnn``, when that folder is not writable)::

    <cache>/<file name>.<digest16>/data.pt|data.bp    the prepared samples (with edges)
    <cache>/<file name>.<digest16>/record.json        fingerprint, schema, isolated atoms, counts

Each conversion builds in a hidden folder of its own (``.<file name>.<digest16>.part-*``) and
publishes it with one rename, ``record.json`` written before: two runs converting one file at
once both succeed (the later drops its copy and uses the entry published first), and an entry is
complete or absent. Entries are found by the file's exact name (``train[1].xyz`` and ``a.xyz.old``
are names, not patterns); the removal of entries made from an older content of the file only
touches entries recorded for the same resolved path, so runs whose files share a name and a
``cache_dir`` keep each other's entries. A cache hit needs a readable record and a container
whose stored digest is the entry's; anything else is rebuilt and the log says why. A file below
64 MiB is hashed at every call; a larger one only when its size or modification time differ from
a record, or always with ``verify="hash"``. Converting warns (once per file) about atoms closer
than :data:`COINCIDENT_ANGSTROM`, found on the edges it builds anyway.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch
from torch_geometric.data import Data

from .ase_source import AseSource, Frame, FrameLabels, iter_frames, labelled_sample, resolve_outputs
from .containers import ContainerDataset, open_dataset, write_dataset
from .conversion_cache import RECORD, VERIFY, atomic_json, changes, file_identity, open_entry, publish, records
from .download import default_cache_dir as user_cache_dir
from .errors import CoincidentAtomsWarning, ContainerError, DataError, SchemaError
from .neighbors import add_edges, add_edges_many
from .prepare import prepare
from .schema import Schema

__all__ = ["COINCIDENT_ANGSTROM", "CONVERTER_VERSION", "ConvertedSource", "convert_source", "default_cache_dir"]

CONVERTER_VERSION = 1
"""Bumped whenever the samples a conversion writes change meaning; old entries are rebuilt."""
_SUFFIX = {"pt": "pt", "adios": "bp"}
COINCIDENT_ANGSTROM = 1e-3
"""Atoms closer than this (Å), periodic images included, are reported as coincident."""
EDGE_CHUNK = 256
"""Structures whose neighbour lists one search builds (:func:`~hydragnn.data.neighbors.add_edges_many`):
the per-call overhead of the search dominates small structures."""
_EXAMPLES = 3


@dataclass(frozen=True)
class ConvertedSource:
    """The prepared container of a source.

    Attributes:
        dataset: the opened container (prepared samples with ``edge_index``).
        schema: the schema of the samples (the given one, or the one inferred).
        isolated_atoms: ``(Z, energy)`` of every ``IsolatedAtom`` frame.
        record: the entry's record (fingerprint, counts, skipped config types, timings).
        cached: whether the container was reused.
        seconds: wall time of this call.
        entry: the cache entry folder.
    """

    dataset: ContainerDataset
    schema: Schema
    isolated_atoms: tuple[tuple[int, float], ...]
    record: dict[str, Any]
    cached: bool
    seconds: float
    entry: Path


def _writable(folder: Path) -> bool:
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / f".probe-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
        return True
    except OSError:
        return False


def default_cache_dir(path: Path) -> Path:
    """``<folder of path>/.hydragnn_cache`` when writable, else ``converted/`` in the user cache
    (``$HYDRAGNN_CACHE`` or ``~/.cache/hydragnn``, the download cache's folder)."""
    beside = path.resolve().parent / ".hydragnn_cache"
    if _writable(beside):
        return beside
    return user_cache_dir() / "converted"


class _Progress:
    """Frames converted: a tqdm bar on a terminal, a line every ``every_s`` seconds otherwise."""

    def __init__(self, desc: str, log: Callable[[str], None] | None, every_s: float = 30.0) -> None:
        self.log, self.every_s, self.count = log, every_s, 0
        self.t0 = self.last = time.perf_counter()
        self.bar = None
        if log is not None and sys.stderr.isatty():
            from tqdm import tqdm

            self.bar = tqdm(desc=desc, unit="frame", leave=False, dynamic_ncols=True)
        self.desc = desc

    def step(self) -> None:
        self.count += 1
        if self.bar is not None:
            self.bar.update(1)
        elif self.log is not None and time.perf_counter() - self.last >= self.every_s:
            self.last = time.perf_counter()
            rate = self.count / max(self.last - self.t0, 1e-9)
            self.log(f"{self.desc}: {self.count} frames ({rate:.0f}/s)")

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def convert_source(
    source: AseSource,
    *,
    cutoff: float,
    schema: Schema | None = None,
    cache_dir: str | os.PathLike | None = None,
    container_format: str = "pt",
    verify: str = "auto",
    log: Callable[[str], None] | None = None,
) -> ConvertedSource:
    """The prepared container of ``source`` (built now, or reused from the cache).

    Args:
        source: the file, frame selection and label keys.
        cutoff: radius of the edges built for every sample, Å.
        schema: the schema to prepare against; ``None`` infers it from the first sample frame
            (see :mod:`hydragnn.data.ase_source`).
        cache_dir: the cache folder (default :func:`default_cache_dir`).
        container_format: ``"pt"`` or ``"adios"`` (needs ``hydra-data[adios]``).
        verify: how an unchanged file is recognised: ``"auto"`` hashes files below
            :data:`~hydragnn.data.conversion_cache.HASH_ALWAYS_BELOW` (64 MiB) and trusts the size
            and modification time of larger ones; ``"hash"`` hashes every file.
        log: receives one line per event (cache hit, rebuild and why, conversion summary,
            progress on long conversions); ``None`` is silent.

    Returns:
        A :class:`ConvertedSource`.

    Raises:
        ContainerError: unreadable file or frame, unwritable cache.
        SchemaError: missing or malformed labels (naming the file, the frame and the labels it has).
        DataError: no frame selected, or an unknown ``verify``.

    Warns:
        DuplicateKeyWarning: a key repeated in an extxyz comment line (once per file and key).
        CoincidentAtomsWarning: atoms closer than :data:`COINCIDENT_ANGSTROM` (once per file).
    """
    t0 = time.perf_counter()
    if container_format not in _SUFFIX:
        raise ContainerError(f"container_format: expected one of {sorted(_SUFFIX)}, found {container_format!r}")
    if not (isinstance(cutoff, (int, float)) and cutoff > 0):
        raise DataError(f"cutoff: expected a number > 0, found {cutoff!r}")
    if verify not in VERIFY:
        raise DataError(f"verify: expected one of {list(VERIFY)}, found {verify!r}")
    path = source.path
    if not path.is_file():
        raise ContainerError(f"{path}: no such file")
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir(path)
    known = records(cache, path.name)
    identity = file_identity(path, known, verify)
    fingerprint = {
        "converter": CONVERTER_VERSION,
        "file": {k: identity[k] for k in ("name", "size", "sha256")},
        "source": source.fingerprint(),
        "schema": schema.to_dict() if schema is not None else None,
        "cutoff": float(cutoff),
        "container": container_format,
    }
    digest = hashlib.sha256(json.dumps(fingerprint, sort_keys=True).encode()).hexdigest()
    entry = cache / f"{path.name}.{digest[:16]}"
    data_path = entry / f"data.{_SUFFIX[container_format]}"
    record = next((r for e, r in known if e == entry and r.get("digest") == digest), None)
    hit = _from_cache(path, entry, data_path, digest, record, identity, t0, log) if record is not None else None
    if hit is not None:
        return hit

    if log is not None and record is None and (entry / RECORD).exists():
        log(f"{entry / RECORD}: unreadable or incomplete; rebuilding the entry")
    if log is not None:
        previous = [r for _, r in known if r.get("digest") != digest]
        why = f"rebuilding ({'; '.join(changes(previous[0]['fingerprint'], fingerprint))})" if previous else "converting"
        log(f"{path}: {why} into {entry}")
    if not _writable(cache):
        raise ContainerError(f"{cache}: the cache folder is not writable (set the cache folder to a writable place)")
    final_entry, final_data = entry, data_path
    # built in a folder of this call's own, published by one rename: a conversion running at the
    # same time (another run, another node on a shared file system) never sees a half-written entry
    entry = Path(tempfile.mkdtemp(prefix=f".{path.name}.{digest[:16]}.part-", dir=cache))
    resolved, isolated, counts, skipped = _write_samples(
        source, schema, float(cutoff), container_format, entry / final_data.name, digest, log
    )
    seconds = time.perf_counter() - t0
    record = {
        "digest": digest,
        "fingerprint": fingerprint,
        "mtime_ns": identity["mtime_ns"],
        "created": time.time(),
        "schema": resolved.to_dict(),
        "isolated_atoms": [[z, e] for z, e in isolated],
        "frames": counts["frames"],
        "samples": counts["samples"],
        "skipped_config_types": skipped,
        "seconds": seconds,
    }
    record["path"] = str(path.resolve())
    atomic_json(entry / RECORD, record)
    entry, data_path = publish(entry, final_entry, digest, final_data.name), final_data
    for old_entry, old in known:
        same_file = old.get("path") == record["path"]
        if old_entry != entry and same_file and old["fingerprint"].get("file", {}).get("sha256") != identity["sha256"]:
            shutil.rmtree(old_entry, ignore_errors=True)  # made from another content of this very file
    if log is not None:
        log(
            f"{path}: {counts['samples']} samples prepared in {seconds:.1f} s "
            f"({1000 * seconds / max(counts['samples'], 1):.1f} ms per structure)"
            + (f", {len(isolated)} isolated atoms" if isolated else "")
            + (f", skipped by config type: {skipped}" if skipped else "")
        )
    return ConvertedSource(
        dataset=open_dataset(data_path),
        schema=resolved,
        isolated_atoms=tuple(isolated),
        record=record,
        cached=False,
        seconds=seconds,
        entry=entry,
    )


def _from_cache(
    path: Path,
    entry: Path,
    data_path: Path,
    digest: str,
    record: dict[str, Any],
    identity: dict[str, Any],
    t0: float,
    log: Callable[[str], None] | None,
) -> ConvertedSource | None:
    """The cached entry of ``record`` opened, or ``None`` when its container does not open."""
    dataset = open_entry(data_path, digest, log)
    if dataset is None:
        return None
    if record.get("mtime_ns") != identity["mtime_ns"]:
        atomic_json(entry / RECORD, {**record, "mtime_ns": identity["mtime_ns"]})
    seconds = time.perf_counter() - t0
    if log is not None:
        log(f"{path}: {len(dataset)} prepared samples from the cache {entry} ({seconds:.2f} s)")
    return ConvertedSource(
        dataset=dataset,
        schema=Schema.from_dict(record["schema"]),
        isolated_atoms=tuple((int(z), float(e)) for z, e in record["isolated_atoms"]),
        record=record,
        cached=True,
        seconds=seconds,
        entry=entry,
    )


def _write_samples(
    source: AseSource,
    schema: Schema | None,
    cutoff: float,
    container_format: str,
    data_path: Path,
    digest: str,
    log: Callable[[str], None] | None,
) -> tuple[Schema, list[tuple[int, float]], dict[str, int], dict[str, int]]:
    """Parse, label, prepare and connect every selected frame of ``source`` and write them to
    ``data_path`` (in a private folder the caller removes on failure: removed here too).

    Returns:
        The resolved schema, the isolated-atom energies ``(Z, eV)``, the frame and sample counts
        and the frames skipped per config type.
    """
    path = source.path
    isolated: list[tuple[int, float]] = []
    skipped: dict[str, int] = {}
    counts = {"frames": 0, "samples": 0}
    coincident = _CoincidentAtoms(path)
    frames = iter_frames(source, skipped)
    progress = _Progress(f"converting {path.name}", log)

    def samples_of(first: Frame | None, resolved: Schema, outputs) -> Iterator[Data]:
        frame, chunk = first, []
        while frame is not None:
            data = labelled_sample(frame.atoms, outputs, frame.where)
            try:
                prepared = prepare(data, resolved, index=counts["samples"])
            except SchemaError as exc:
                raise SchemaError(f"{frame.where}: {exc}") from None
            counts["samples"] += 1
            progress.step()
            chunk.append((frame.where, prepared))
            frame = _next_sample(frames, source, isolated, counts)
            if len(chunk) == EDGE_CHUNK or frame is None:
                for where, with_edges in zip((w for w, _ in chunk), _edges_of(chunk, cutoff)):
                    coincident.check(with_edges, where)
                    yield with_edges
                chunk = []

    try:
        first = _next_sample(frames, source, isolated, counts)
        if first is None:
            raise DataError(
                f"{path}: no frame selected (index {source.index!r}, config_types {source.config_types}, "
                f"skipped by config type: {skipped or 'none'}, isolated atoms: {len(isolated)})"
            )
        resolved, outputs = resolve_outputs(source, first.atoms, schema, first.where)
        write_dataset(
            data_path,
            samples_of(first, resolved, outputs),
            container_format,
            schema=resolved,
            metadata={"source": str(path), "digest": digest},
        )
    except BaseException:
        shutil.rmtree(data_path.parent, ignore_errors=True)
        raise
    finally:
        progress.close()
    coincident.warn()
    return resolved, isolated, counts, skipped


def _edges_of(chunk: list[tuple[str, Data]], cutoff: float) -> list[Data]:
    """The samples of ``chunk`` (``(where, sample)`` pairs) with their edges, from one neighbour
    search; a structure the search refuses is named by its file and frame."""
    try:
        return add_edges_many([sample for _, sample in chunk], cutoff)
    except DataError:
        pass
    out = []
    for where, sample in chunk:  # one by one, to name the frame at fault
        try:
            out.append(add_edges(sample, cutoff))
        except DataError as exc:
            raise type(exc)(f"{where}: {exc}") from None
    return out


def _next_sample(
    frames: Iterator[Frame], source: AseSource, isolated: list[tuple[int, float]], counts: dict[str, int]
) -> Frame | None:
    """The next frame that is a sample; isolated-atom frames on the way go to ``isolated``."""
    for frame in frames:
        counts["frames"] += 1
        if len(frame.atoms) == 0:  # no energy per atom, no graph: a damaged or truncated file
            raise SchemaError(
                f"{frame.where}: a frame with no atoms; remove it from the file or leave it out with the "
                "Dataset 'index' selection"
            )
        if not frame.isolated:
            return frame
        atoms = frame.atoms
        if len(atoms) != 1:
            raise SchemaError(f"{frame.where}: an IsolatedAtom frame must hold one atom, found {len(atoms)}")
        key = source.energy_key
        if key is None:
            continue
        labels = FrameLabels.of(atoms)
        if key not in labels.values:
            raise SchemaError(f"{frame.where}: no label {key!r} for the energy of this IsolatedAtom frame; it has {labels.describe()}")
        try:
            energy = float(np.asarray(labels.values[key][1], dtype=np.float64).reshape(()))
        except (TypeError, ValueError):
            raise SchemaError(f"{frame.where}: label {key!r} of an IsolatedAtom frame is not one number") from None
        isolated.append((int(atoms.numbers[0]), energy))
    return None


class _CoincidentAtoms:
    """Counts the frames of one file with atoms closer than ``COINCIDENT_ANGSTROM`` (from the
    edges the conversion builds) and warns once for the file, naming the first ``_EXAMPLES``."""

    def __init__(self, path: Path) -> None:
        self.path, self.frames, self.examples = path, 0, []

    def check(self, data: Data, where: str) -> None:
        pair = _coincident_pair(data)
        if pair is None:
            return
        self.frames += 1
        if len(self.examples) < _EXAMPLES:
            where = where.removeprefix(f"{self.path}: ")
            self.examples.append(f"{where}: atoms {pair[0]} and {pair[1]}, {pair[2]:.2g} Å apart")

    def warn(self) -> None:
        if not self.frames:
            return
        n, shown = self.frames, self.examples
        warnings.warn(
            f"{self.path}: {n} frame{'s' if n != 1 else ''} with atoms closer than {COINCIDENT_ANGSTROM} Å "
            f"({'; '.join(shown)}{'; ...' if n > len(shown) else ''}); they are converted as given: check the file",
            CoincidentAtomsWarning,
            stacklevel=3,
        )


def _coincident_pair(data: Data) -> tuple[int, int, float] | None:
    """``(i, j, distance)``, ``i < j``, of the closest edge shorter than :data:`COINCIDENT_ANGSTROM`
    (edges cover periodic images), or ``None``: one pass over the edges already built."""
    src, dst = cast(torch.Tensor, data.edge_index)  # a prepared sample with its edges built
    if src.numel() == 0:
        return None
    pos = cast(torch.Tensor, data.pos)
    vec = pos[src] - pos[dst]
    shift = getattr(data, "edge_shift", None)
    if shift is not None:
        vec = vec + shift.to(vec.dtype)
    dist = torch.linalg.vector_norm(vec, dim=1)
    k = int(torch.argmin(dist))
    if not dist[k] < COINCIDENT_ANGSTROM:
        return None
    i, j = sorted((int(src[k]), int(dst[k])))
    return i, j, float(dist[k])

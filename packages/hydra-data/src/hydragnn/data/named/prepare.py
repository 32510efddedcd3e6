"""A named data set as a prepared container: fetched once, parsed once, reused while valid.

:func:`prepare_named_dataset` gets the raw archive (:func:`hydragnn.data.named.fetch.fetch_raw`:
placed by hand, cached, or downloaded once), reads every LSMS file of it
(:func:`hydragnn.data.named.lsms.iter_lsms`: text only, no extraction, the entry's atom count and
elements checked on every file), prepares each sample against the schema (the given one, else
the entry's :meth:`~hydragnn.data.named.datasets.NamedDataset.variables`), builds its edges at
``cutoff`` and streams the samples into a container, exactly as files ASE reads are converted
(:mod:`hydragnn.data.io.conversion`, whose cache machinery it shares). Layout::

    <cache>/datasets/<name>/prepared/<name>.<digest16>/data.pt|data.bp   prepared samples (with edges)
    <cache>/datasets/<name>/prepared/<name>.<digest16>/record.json       fingerprint, schema, counts

The fingerprint is the archive's SHA-256 (a folder placed by hand: its listing with sizes and
modification times), the reader version, the checks, the schema, the cutoff and the container
format; the next call with the same fingerprint opens the container and reads nothing else (no
network either: the raw archive is found in the cache under its recorded checksum first). A
first download whose content is not what the entry says (not an archive, not LSMS, another atom
count or other elements) is removed with its recorded checksum, so the next run downloads afresh.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import hydragnn.data.pyg_import  # noqa: F401 (PyG as HydraGNN needs it)

from torch_geometric.data import Data

from ..containers import open_dataset, write_dataset
from ..errors import ContainerError, DataError, SchemaError
from ..io.conversion import ConvertedSource
from ..io.conversion_cache import RECORD, atomic_json, changes, open_entry, publish, records
from ..io.download import ProgressCallback
from ..neighbors import add_edges
from ..prepare import prepare
from ..schema import Schema
from .datasets import NamedDataset
from .fetch import RawData, dataset_home, fetch_raw, forget_pin, lookup_entry
from .lsms import iter_lsms

__all__ = ["READER_VERSION", "prepare_named_dataset"]

READER_VERSION = 1
"""Bumped whenever the samples the LSMS reader builds change meaning; old entries are rebuilt."""
_SUFFIX = {"pt": "pt", "adios": "bp"}


def _identity(raw: RawData) -> dict:
    """``{name, size, sha256}`` of the raw data (a folder: a digest of its listing)."""
    if raw.sha256 is not None:
        return {"name": raw.path.name, "size": raw.path.stat().st_size, "sha256": raw.sha256}
    listing = sorted(
        (p.relative_to(raw.path).as_posix(), p.stat().st_size, p.stat().st_mtime_ns)
        for p in raw.path.rglob("*")
        if p.is_file()
    )
    digest = hashlib.sha256(json.dumps(listing).encode()).hexdigest()
    return {"name": raw.path.name + "/", "size": sum(s for _, s, _ in listing), "sha256": digest}


def prepare_named_dataset(
    name: str,
    *,
    cutoff: float,
    schema: Schema | None = None,
    cache_dir: str | os.PathLike | None = None,
    container_format: str = "pt",
    url: str | None = None,
    sha256: str | None = None,
    log: Callable[[str], None] | None = None,
    progress: ProgressCallback | None = None,
    verify: str = "auto",
) -> ConvertedSource:
    """The prepared container of a named data set (built now, or reused from the cache).

    Args:
        name: a registry name (``FePt_32atoms``, ...; :data:`hydragnn.data.named.datasets.NAMED_DATASETS`).
        cutoff: radius of the edges built for every sample (in the file's length unit).
        schema: the schema to prepare against; ``None``: the entry's default ``Variables``
            (upstream's ``examples/lsms/lsms.json``).
        cache_dir: the cache root (default ``$HYDRAGNN_CACHE`` or ``~/.cache/hydragnn``): the
            download cache, the pin, files placed by hand and the prepared containers live there.
        container_format: ``"pt"`` or ``"adios"``.
        url, sha256: ``Dataset.url`` / ``Dataset.sha256`` (see :func:`~hydragnn.data.named.fetch.fetch_raw`).
        log: receives one line per event (download, recorded checksum, cache hit, conversion).
        progress: ``progress(bytes_done, total)`` during a download.
        verify: how a cached archive is recognised (see :func:`~hydragnn.data.named.fetch.fetch_raw`).

    Returns:
        A :class:`~hydragnn.data.io.conversion.ConvertedSource` (``isolated_atoms`` empty; ``record``
        with the fingerprint, the counts and where the raw data came from).

    Raises:
        DownloadError: the raw data cannot be had (the message says how to place it by hand).
        ChecksumError: the archive is not the one pinned.
        ArchiveError: a damaged archive or a refused member.
        DataError: an unknown name, a bad ``cutoff`` / ``container_format``, a file that is not
            LSMS or breaks the entry's atom count or elements (naming the member and the line).
        SchemaError: a schema naming something the LSMS samples do not have.
    """
    t0 = time.perf_counter()
    entry = lookup_entry(name)
    if container_format not in _SUFFIX:
        raise ContainerError(f"container_format: expected one of {sorted(_SUFFIX)}, found {container_format!r}")
    if not (isinstance(cutoff, (int, float)) and cutoff > 0):
        raise DataError(f"cutoff: expected a number > 0, found {cutoff!r}")
    if entry.format != "lsms":
        raise DataError(f"{entry.name}: no reader for its raw format {entry.format!r} (known: 'lsms')")
    resolved = schema if schema is not None else Schema.from_dict(entry.variables())
    raw = fetch_raw(entry, url=url, sha256=sha256, cache_dir=cache_dir, log=log, progress=progress, verify=verify)
    fingerprint = {
        "converter": READER_VERSION,
        "file": _identity(raw),
        "source": {
            "format": entry.format,
            "dataset": entry.name,
            "n_atoms": entry.n_atoms,
            "elements": list(entry.elements),
        },
        "schema": resolved.to_dict(),
        "cutoff": float(cutoff),
        "container": container_format,
    }
    digest = hashlib.sha256(json.dumps(fingerprint, sort_keys=True).encode()).hexdigest()
    folder = dataset_home(entry, cache_dir) / "prepared"
    known = records(folder, entry.name)
    final = folder / f"{entry.name}.{digest[:16]}"
    data_name = f"data.{_SUFFIX[container_format]}"
    record = next((r for e, r in known if e == final and r.get("digest") == digest), None)
    dataset = open_entry(final / data_name, digest, log) if record is not None else None
    if record is not None and dataset is not None:
        seconds = time.perf_counter() - t0
        if log is not None:
            log(f"{entry.name}: {len(dataset)} prepared samples from the cache {final} ({seconds:.2f} s)")
        return ConvertedSource(dataset, Schema.from_dict(record["schema"]), (), record, True, seconds, final)
    if log is not None:
        why = f"rebuilding ({'; '.join(changes(known[0][1]['fingerprint'], fingerprint))})" if known else "preparing"
        log(f"{entry.name}: {why} {raw.path} into {final}")
    built, record = _write_prepared(
        entry, raw, resolved, float(cutoff), container_format, final, fingerprint, cache_dir
    )
    final = publish(built, final, digest, data_name)
    for old_entry, old in known:
        if old_entry != final and old["fingerprint"].get("file", {}).get("sha256") != fingerprint["file"]["sha256"]:
            shutil.rmtree(old_entry, ignore_errors=True)  # made from other raw data of this name
    n, prep_s = record["samples"], record["seconds"]
    if log is not None:
        log(
            f"{entry.name}: {n} samples prepared in {prep_s:.1f} s "
            f"({1000 * prep_s / max(n, 1):.1f} ms per structure; raw data verified by: {raw.verified})"
        )
    seconds = time.perf_counter() - t0
    return ConvertedSource(open_dataset(final / data_name), resolved, (), record, False, seconds, final)


def _write_prepared(
    entry: NamedDataset,
    raw: RawData,
    schema: Schema,
    cutoff: float,
    container_format: str,
    final: Path,
    fingerprint: dict[str, Any],
    cache_dir: str | os.PathLike | None,
) -> tuple[Path, dict[str, Any]]:
    """Prepare every LSMS sample of ``raw`` into a temporary folder beside ``final``; returns that
    folder and its record (written in it). On a failure the folder is removed, and a failure of the
    content (not of the disk) forgets a first-use checksum pin."""
    t0 = time.perf_counter()
    folder = final.parent
    data_name = f"data.{_SUFFIX[container_format]}"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        built = Path(tempfile.mkdtemp(prefix=f".{final.name}.part-", dir=folder))
    except OSError as exc:
        raise ContainerError(
            f"{folder}: the cache folder is not writable ({exc}); set Dataset.cache_dir or $HYDRAGNN_CACHE"
        ) from exc
    count = [0]

    def samples() -> Iterator[Data]:
        for where, sample in iter_lsms(raw.path, n_atoms=entry.n_atoms, elements=entry.elements):
            try:
                prepared = prepare(sample, schema, index=count[0])
            except SchemaError as exc:
                raise SchemaError(f"{where}: {exc}") from None
            count[0] += 1
            yield add_edges(prepared, cutoff)

    full_digest = hashlib.sha256(json.dumps(fingerprint, sort_keys=True).encode()).hexdigest()
    try:
        write_dataset(
            built / data_name,
            samples(),
            container_format,
            schema=schema,
            metadata={"source": f"{entry.name} ({raw.origin})", "digest": full_digest},
        )
    except BaseException as exc:
        shutil.rmtree(built, ignore_errors=True)
        if isinstance(exc, DataError) and not isinstance(
            exc, (SchemaError, ContainerError)
        ):  # the content, not the disk
            forget_pin(entry, raw, cache_dir)
        raise
    record = {
        "digest": full_digest,
        "fingerprint": fingerprint,
        "created": time.time(),
        "schema": schema.to_dict(),
        "isolated_atoms": [],
        "samples": count[0],
        "raw": {"path": str(raw.path), "origin": raw.origin, "verified": raw.verified},
        "seconds": time.perf_counter() - t0,
    }
    atomic_json(built / RECORD, record)
    return built, record

"""The raw archive of a named data set: placed by hand, in the download cache, or downloaded once.

:func:`fetch_raw` answers with a :class:`RawData` in this order, touching the network only in
the last step:

1. files placed by hand: the LSMS files in ``<cache>/datasets/<name>/raw/`` (any sub-folders), or
   the archive as ``<cache>/datasets/<name>/<archive>`` (checked against a known checksum);
2. the archive already in the download cache under its known SHA-256: ``Dataset.sha256`` (yours),
   else the registry's, else the one recorded at the first download (``pin.json``); re-hashed
   at each use below 64 MiB (or always, with ``verify="hash"``);
3. a download from ``Dataset.url``, ``$HYDRAGNN_DATASET_URL/<archive>`` or the registry's URL,
   through :class:`~hydragnn.data.io.download.DownloadCache` (resumable, bounded by the entry's
   ``max_bytes``, locked between processes): verified against the known SHA-256, or without one
   trusted on first use (:meth:`~hydragnn.data.io.download.DownloadCache.fetch_unpinned`) and its
   SHA-256 recorded in ``<cache>/datasets/<name>/pin.json`` (atomic write) and logged, so that
   every later use is verified against it. The caller checks the content (:mod:`.prepare`
   reads it as LSMS with the expected atom count and elements) and calls :func:`forget_pin` when
   it is not what it should be.

Without a URL, with ``$HYDRAGNN_OFFLINE`` set, or when the download fails, the error names the
URL, the cache folder and how to place the files by hand (:func:`how_to_place`). A checksum
mismatch is a :class:`~hydragnn.data.errors.ChecksumError` naming both hashes and where the
expected one came from. ``<cache>`` is ``cache_dir`` or ``$HYDRAGNN_CACHE`` or ``~/.cache/hydragnn``.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..errors import ChecksumError, DataError, DownloadError
from ..io.atomic import atomic_write
from ..io.download import DownloadCache, ProgressCallback, _normalise_sha, default_cache_dir, sha256_file
from .datasets import ENV_OFFLINE, ENV_URL, NamedDataset, named_dataset, offline, resolve_url

__all__ = [
    "HASH_ALWAYS_BELOW",
    "PIN",
    "RawData",
    "dataset_home",
    "fetch_raw",
    "forget_pin",
    "how_to_place",
    "lookup_entry",
    "progress_lines",
]

HASH_ALWAYS_BELOW = 64 << 20
"""Archives in the download cache smaller than this are re-hashed at every use (as
:data:`hydragnn.data.io.conversion_cache.HASH_ALWAYS_BELOW`)."""

PIN = "pin.json"
"""The record of a trust-on-first-use download: ``{url, sha256, size, archive, time}``."""


@dataclass(frozen=True)
class RawData:
    """Where a named data set's raw files are.

    Attributes:
        path: the archive (a tar or zip) or the folder of LSMS files.
        sha256: the archive's SHA-256 (``None`` for a folder).
        origin: where it came from, in words (a URL, "placed by hand", "the download cache").
        verified: how its bytes are vouched for: ``"Dataset.sha256"``, ``"the registry"``,
            ``"pinned at first download"``, ``"first download (unpinned)"`` or ``"placed by hand"``.
    """

    path: Path
    sha256: str | None
    origin: str
    verified: str


def lookup_entry(name: str) -> NamedDataset:
    """The registry entry of ``name``.

    Raises:
        DataError: an unknown name, listing the known ones.
    """
    entry = named_dataset(name)
    if entry is None:
        from .datasets import NAMED_DATASETS

        raise DataError(f"{name!r}: not a named data set; known names: {sorted(NAMED_DATASETS)}")
    return entry


def dataset_home(entry: NamedDataset, cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """``<cache>/datasets/<name>``: pin, files placed by hand, prepared containers."""
    root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    return root / "datasets" / entry.name


def how_to_place(entry: NamedDataset, url: str | None, home: Path, reason: str) -> str:
    """The message of a data set that cannot be downloaded: why, the URL, the cache, what to do."""
    source = url or f"none confirmed (look it up: {', '.join(entry.landing)})"
    return (
        f"{entry.name}: the raw data cannot be downloaded ({reason}).\n"
        f"  URL:   {source}\n"
        f"  cache: {home}\n"
        "Place the files by hand, then run again (nothing else is needed):\n"
        f"  * the archive (tar, tar.gz / bz2 / xz or zip of the LSMS text files) as {home / entry.archive}, or\n"
        f"  * the LSMS files themselves (one structure per file, any sub-folders) in {home / 'raw'}/\n"
        f"or point ${ENV_URL} at a mirror serving <base>/{entry.archive}, or set Dataset.url to the archive's URL or "
        f"path{'' if not offline() else f'; ${ENV_OFFLINE} forbids downloads'}."
    )


def _read_pin(home: Path) -> dict | None:
    try:
        pin = json.loads((home / PIN).read_text())
    except (OSError, ValueError, RecursionError):
        return None
    try:
        _normalise_sha(pin.get("sha256") if isinstance(pin, dict) else None)
    except DataError:
        return None  # unreadable: as if absent (the next download records a new one)
    return pin


def forget_pin(entry: NamedDataset, raw: RawData, cache_dir: str | os.PathLike[str] | None = None) -> None:
    """Undo a first download whose content proved wrong: remove the pin and the cached archive
    (the next run downloads afresh). Files placed by hand and pinned checksums are left alone."""
    if raw.verified != "first download (unpinned)":
        return
    home = dataset_home(entry, cache_dir)
    (home / PIN).unlink(missing_ok=True)
    raw.path.unlink(missing_ok=True)


def progress_lines(name: str, log: Callable[[str], None], every_s: float = 30.0) -> ProgressCallback:
    """A ``progress(done, total)`` that logs one line every ``every_s`` seconds of a download."""
    last = [time.monotonic()]

    def progress(done: int, total: int | None) -> None:
        now = time.monotonic()
        if now - last[0] >= every_s:
            last[0] = now
            of = f" of {total / 1e9:.2f} GB ({100 * done / total:.0f} %)" if total else ""
            log(f"{name}: {done / 1e9:.2f} GB downloaded{of}")

    return progress


def _placed(entry: NamedDataset, home: Path, sha: str | None, label: str, sha_from: str) -> RawData | None:
    raw_dir = home / "raw"
    if raw_dir.is_dir() and any(p.is_file() for p in raw_dir.rglob("*")):
        return RawData(raw_dir, None, f"placed by hand in {raw_dir}", "placed by hand")
    archive = home / entry.archive
    if not archive.is_file():
        return None
    actual = sha256_file(archive)
    if sha is not None and actual != sha:
        raise ChecksumError(
            f"{archive}: checksum mismatch: expected sha256 {sha} ({sha_from}), the file placed there has {actual}; "
            "replace it with the right archive or remove it"
        )
    return RawData(archive, actual, f"placed by hand as {archive}", label if sha is not None else "placed by hand")


def fetch_raw(
    entry: NamedDataset,
    *,
    url: str | None = None,
    sha256: str | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    log: Callable[[str], None] | None = None,
    progress: ProgressCallback | None = None,
    timeout: float = 60.0,
    verify: str = "auto",
) -> RawData:
    """The raw data of ``entry``, from the places of the module docstring in order.

    Args:
        entry: the registry entry.
        url: ``Dataset.url``: the archive's URL (``http(s)://``, ``file://``) or path.
        sha256: ``Dataset.sha256``: the archive's SHA-256 you trust (wins over any other).
        cache_dir: the cache root (default ``$HYDRAGNN_CACHE`` or ``~/.cache/hydragnn``).
        log: receives one line per event (download, recorded checksum).
        progress: ``progress(bytes_done, total)`` during a download (default with ``log``: a line
            every 30 s, :func:`progress_lines`).
        timeout: socket timeout of the download, seconds.
        verify: ``"auto"`` trusts an archive of :data:`HASH_ALWAYS_BELOW` (64 MiB) or more found at
            its content address in the download cache (it was filed there after its hash was
            checked); ``"hash"`` hashes it again at every call. Smaller archives, and archives
            placed by hand, are always hashed.

    Raises:
        DownloadError: no URL, offline, or a failed transfer: the message names the URL, the
            cache folder and how to place the files by hand (a cut transfer keeps its part).
        ChecksumError: the archive's SHA-256 differs from the one expected (naming both).
        DataError: a malformed ``sha256``.
    """
    if verify not in ("auto", "hash"):
        raise DataError(f"verify: expected 'auto' or 'hash', found {verify!r}")
    home = dataset_home(entry, cache_dir)
    pin = _read_pin(home)
    if sha256 is not None:
        sha, label, sha_from = _normalise_sha(sha256), "Dataset.sha256", "Dataset.sha256"
    elif entry.sha256 is not None:
        sha, label, sha_from = _normalise_sha(entry.sha256), "the registry", "the registry"
    elif pin is not None:
        sha, label = _normalise_sha(pin["sha256"]), "pinned at first download"
        sha_from = f"{label} ({home / PIN}; remove it to accept another archive)"
    else:
        sha, label, sha_from = None, "", ""
    placed = _placed(entry, home, sha, label, sha_from)
    if placed is not None:
        return placed
    cache = DownloadCache(cache_dir)
    if sha is not None:
        filed = cache.path_for(sha, entry.archive)  # filed there only after its hash was checked
        trusted = verify == "auto" and filed.is_file() and filed.stat().st_size >= HASH_ALWAYS_BELOW
        if trusted or cache.lookup(sha, entry.archive) is not None:
            return RawData(filed, sha, f"the download cache ({filed})", label)
    where, where_from = resolve_url(entry, url)
    if where is None:
        raise DownloadError(how_to_place(entry, None, home, "no download URL is known for it"))
    if offline():
        raise DownloadError(how_to_place(entry, where, home, f"${ENV_OFFLINE} is set and it is not in the cache"))
    if log is not None:
        log(f"{entry.name}: downloading {where} (from {where_from}) into {cache.root}")
        progress = progress if progress is not None else progress_lines(entry.name, log)
    try:
        if sha is not None:
            path = cache.fetch(where, sha, entry.archive, progress=progress, timeout=timeout, max_bytes=entry.max_bytes)
            return RawData(path, sha, where, label)
        path, actual = cache.fetch_unpinned(
            where, entry.archive, progress=progress, timeout=timeout, max_bytes=entry.max_bytes
        )
    except ChecksumError as exc:
        raise ChecksumError(f"{exc} (the expected checksum comes from {sha_from})") from None
    except DownloadError as exc:
        raise DownloadError(how_to_place(entry, where, home, str(exc))) from exc
    record = {
        "url": where,
        "sha256": actual,
        "size": path.stat().st_size,
        "archive": entry.archive,
        "time": time.time(),
    }
    atomic_write(home / PIN, json.dumps(record, indent=1, sort_keys=True).encode())
    if log is not None:
        log(
            f"{entry.name}: no published checksum; downloaded {record['size']} bytes with sha256 {actual}, recorded in "
            f"{home / PIN} and checked from now on (set Dataset.sha256 to pin one you trust)"
        )
    return RawData(path, actual, where, "first download (unpinned)")

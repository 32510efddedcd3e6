"""Which ADIOS2 datasets may be opened in this process, and the child-process check for the others.

The ADIOS2 C++ library can crash (SIGSEGV, SIGABRT) or hang on crafted metadata, and an integrity
record can be recomputed by whoever crafted the file. So a dataset is opened in-process only when
it is *known-good*:

* sealed by this user's writer: the integrity record carries an HMAC-SHA256 of its file list
  under a key kept in the user cache (``$HYDRAGNN_CACHE`` or ``~/.cache/hydragnn``,
  ``adios-writer.key``, mode 0600); a file written elsewhere, or re-sealed by someone without the
  key, does not verify;
* or verified before: a child process (:mod:`.adios_probe`) opened it and read every array
  without crashing, and the HMAC of its integrity record was added to ``adios-verified.json`` in
  the same cache (the most recent :data:`MAX_VERIFIED`).

Any other dataset is probed in a child process first (:func:`probe_in_child`, bounded by
:data:`PROBE_TIMEOUT_S` plus a second per 100 MB); a crash, a hang or an error there becomes a
``ContainerError`` naming the file, and the caller's process never hands the file to ADIOS2.
Without a writable cache, nothing is remembered: every open is probed.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from ..errors import ContainerError
from ..io.atomic import atomic_write
from ..io.download import default_cache_dir

KEY_FILE = "adios-writer.key"
VERIFIED_FILE = "adios-verified.json"
MAX_VERIFIED = 10_000
PROBE_TIMEOUT_S = 10.0
"""Seconds a probe may take, plus one per 100 MB of the dataset."""


def _canonical(record: dict[str, Any]) -> bytes:
    return json.dumps({"version": record.get("version"), "files": record.get("files")}, sort_keys=True).encode()


def _key(create: bool) -> bytes | None:
    path = default_cache_dir() / KEY_FILE
    try:
        key = path.read_bytes()
        if len(key) == 32:
            return key
    except OSError:
        pass
    if not create:
        return None
    try:
        key = os.urandom(32)
        atomic_write(path, key, mode=0o600)
        return key
    except OSError:
        return None


def seal(record: dict[str, Any]) -> str | None:
    """The writer's seal of an integrity record (``None`` when no key can be kept)."""
    key = _key(create=True)
    return hmac.new(key, _canonical(record), hashlib.sha256).hexdigest() if key is not None else None


def _digest(record: dict[str, Any], key: bytes) -> str:
    return hmac.new(key, b"verified:" + _canonical(record), hashlib.sha256).hexdigest()


def _verified(key: bytes) -> list[str]:
    try:
        values = json.loads((default_cache_dir() / VERIFIED_FILE).read_text())
    except (OSError, ValueError):
        return []
    return [v for v in values if isinstance(v, str)] if isinstance(values, list) else []


def known_good(record: dict[str, Any]) -> bool:
    """Whether a dataset with this integrity record may be opened in-process (see the module docstring)."""
    key = _key(create=False)
    if key is None:
        return False
    stamp = record.get("seal")
    if isinstance(stamp, str) and hmac.compare_digest(
        stamp, hmac.new(key, _canonical(record), hashlib.sha256).hexdigest()
    ):
        return True
    return _digest(record, key) in _verified(key)


def remember(record: dict[str, Any]) -> None:
    """Add a probed dataset's record to the verified list (best effort: an unwritable cache is fine)."""
    key = _key(create=True)
    if key is None:
        return
    values = [v for v in _verified(key) if v != _digest(record, key)] + [_digest(record, key)]
    try:
        atomic_write(default_cache_dir() / VERIFIED_FILE, json.dumps(values[-MAX_VERIFIED:]).encode(), mode=0o600)
    except OSError:
        pass


def _size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.iterdir() if f.is_file())


def probe_in_child(path: Path, timeout_s: float | None = None) -> None:
    """Open and read the whole dataset with ADIOS2 in a child process.

    Raises:
        ContainerError: the child crashed (naming the signal), hung past the timeout, or failed.
    """
    script = Path(__file__).with_name("adios_probe.py")
    limit = timeout_s if timeout_s is not None else PROBE_TIMEOUT_S + _size(path) / 1e8
    try:
        out = subprocess.run(
            [sys.executable, str(script), str(path)],
            capture_output=True, text=True, timeout=limit, check=False, stdin=subprocess.DEVNULL,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        raise ContainerError(
            f"{path}: the ADIOS2 reader did not finish reading this dataset within {limit:.0f} s in a separate "
            "process; it was not opened here (a crafted or corrupted .bp directory?)"
        ) from None
    if out.returncode == 0 and out.stdout.strip().endswith("ok"):
        return
    if out.returncode < 0:
        name = (
            signal.Signals(-out.returncode).name
            if -out.returncode in signal.Signals._value2member_map_
            else out.returncode
        )
        why = f"the ADIOS2 reader crashed ({name})"
    else:
        tail = (out.stderr.strip().splitlines() or [f"exit status {out.returncode}"])[-1][-300:]
        why = f"the ADIOS2 reader failed: {tail}"
    raise ContainerError(
        f"{path}: {why} on this dataset in a separate process; it was not opened here (a crafted or corrupted "
        ".bp directory? only datasets from this project's writer or that pass this check are opened)"
    )

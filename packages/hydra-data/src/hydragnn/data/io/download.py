"""A download cache keyed by SHA-256: verify, resume, never fetch a good file twice.

Layout under the cache root (``$HYDRAGNN_CACHE``, else ``~/.cache/hydragnn``)::

    <root>/<sha256[:2]>/<sha256>/<filename>        verified file
    <root>/<sha256[:2]>/<sha256>/<filename>.part   download in progress (resumable)
    <root>/<sha256[:2]>/<sha256>/<filename>.lock   advisory lock between processes
    <root>/unpinned/<sha256(url)[:16]>/<filename>.part   unpinned download in progress

A cached file whose hash matches is returned without touching the network. Otherwise the
content streams into ``.part``; an existing ``.part`` is resumed with an HTTP ``Range``
request (a server that answers ``200`` instead of ``206``, or ``206`` with another range,
restarts the transfer from byte 0). A planted symbolic link in place of the ``.part`` is
removed, never written through. Content larger than ``max_bytes`` is refused (from
``Content-Length`` and while streaming) and a transfer longer than ``deadline_s`` stops (the part
is kept).
A transfer cut short (network error, timeout, or a body shorter than its ``Content-Length``)
raises :class:`~hydragnn.data.errors.DownloadError` and keeps the ``.part`` for the next call.
The hash is checked before the atomic rename; on mismatch the part is deleted and
:class:`~hydragnn.data.errors.ChecksumError` (a ``DownloadError``) names the expected and actual
hashes. Content whose hash nobody published is fetched by :meth:`DownloadCache.fetch_unpinned`
(trust on first use: the same transfer, then filed under the hash it has, which the caller
records and pins from then on). Sources:
``http://``, ``https://``, ``file://`` URLs and plain local paths. Only the standard library
(``urllib``) is used.
"""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import os
import re
import stat
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from ..errors import ChecksumError, DataError, DownloadError
from .transfer import Limits, ProgressCallback, RangeMismatch, content_range, copy_stream, open_part

__all__ = ["DownloadCache", "ProgressCallback", "default_cache_dir", "download", "sha256_file"]

_CHUNK = 1 << 20
_SHA_RE = re.compile(r"^[0-9a-f]{64}$")
DEFAULT_MAX_BYTES = 64 << 30
"""Largest download accepted unless ``max_bytes`` says otherwise (64 GiB)."""
DEFAULT_DEADLINE_S = 6 * 3600.0
"""Longest a single ``fetch`` may transfer before it stops (the part is kept for resuming)."""


def default_cache_dir() -> Path:
    """``$HYDRAGNN_CACHE`` when set and non-empty, else ``~/.cache/hydragnn``."""
    env = os.environ.get("HYDRAGNN_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "hydragnn"


def sha256_file(path: str | os.PathLike[str]) -> str:
    """Hex SHA-256 of a file, read in 1 MiB chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def _normalise_sha(sha256: object) -> str:
    sha = sha256.strip().lower() if isinstance(sha256, str) else ""
    if not _SHA_RE.match(sha):
        raise DataError(f"sha256: expected 64 hexadecimal characters, found {sha256!r}")
    return sha


def _source(url: str | os.PathLike[str]) -> tuple[str, str]:
    """``("http", url)`` for http(s) or ``("file", local_path)``."""
    text = os.fspath(url)
    parsed = urllib.parse.urlparse(text)
    scheme = parsed.scheme.lower()
    if scheme in ("http", "https"):
        return "http", text
    if scheme == "file":
        return "file", urllib.request.url2pathname(parsed.path)
    if scheme == "" or (len(scheme) == 1 and os.name == "nt"):  # plain path, or C:\ on Windows
        return "file", text
    raise DownloadError(f"{text}: unsupported URL scheme {scheme!r}; expected http, https, file or a local path")


def _default_filename(kind: str, location: str) -> str:
    path = urllib.parse.unquote(urllib.parse.urlparse(location).path) if kind == "http" else location
    return os.path.basename(path.rstrip("/\\")) or "download"


def _check_filename(filename: str) -> str:
    if not filename or filename in (".", "..") or "/" in filename or "\\" in filename or "\0" in filename:
        raise DataError(f"filename: expected a plain file name without directories, found {filename!r}")
    if filename.endswith((".part", ".lock")):
        raise DataError(f"filename: {filename!r} ends with a suffix reserved by the cache (.part, .lock)")
    return filename


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """Exclusive advisory lock on ``path`` (POSIX ``flock``; a no-op elsewhere)."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows
        yield
        return
    with open(path, "a+b") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


class DownloadCache:
    """A directory of files addressed by their SHA-256.

    Args:
        root: cache directory; :func:`default_cache_dir` when ``None``.
    """

    def __init__(self, root: str | os.PathLike[str] | None = None) -> None:
        self.root = Path(root).expanduser() if root is not None else default_cache_dir()

    def path_for(self, sha256: str, filename: str) -> Path:
        """Where the verified file of ``sha256`` named ``filename`` lives (it may not exist)."""
        sha = _normalise_sha(sha256)
        return self.root / sha[:2] / sha / _check_filename(filename)

    def lookup(self, sha256: str, filename: str) -> Path | None:
        """The cached file if it exists and its hash matches, else ``None`` (no network)."""
        path = self.path_for(sha256, filename)
        if path.is_file() and sha256_file(path) == _normalise_sha(sha256):
            return path
        return None

    def fetch(
        self,
        url: str | os.PathLike[str],
        sha256: str,
        filename: str | None = None,
        progress: ProgressCallback | None = None,
        timeout: float = 60.0,
        max_bytes: int = DEFAULT_MAX_BYTES,
        deadline_s: float = DEFAULT_DEADLINE_S,
    ) -> Path:
        """Return the verified cached copy of ``url``, downloading only when needed.

        Args:
            url: ``http(s)://`` or ``file://`` URL, or a local path.
            sha256: expected hex SHA-256 of the content (case-insensitive).
            filename: name of the cached file; the last component of the URL by default.
            progress: optional ``progress(bytes_done, total)``, called after each chunk.
            timeout: socket timeout in seconds for HTTP.
            max_bytes: refuse content larger than this (checked against ``Content-Length`` and
                while streaming; the part is deleted).
            deadline_s: stop a transfer running longer than this (the part is kept for resuming).

        Returns:
            Path of the verified file inside the cache.

        Raises:
            DownloadError: on a network or file error (the message names the URL).
            ChecksumError: the content's hash differs from ``sha256`` (naming both hashes).
            DataError: on a malformed ``sha256`` or ``filename``.
        """
        sha = _normalise_sha(sha256)
        kind, location = _source(url)
        name = _check_filename(filename if filename is not None else _default_filename(kind, location))
        final = self.path_for(sha, name)
        if self.lookup(sha, name) is not None:
            return final
        try:
            final.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise DownloadError(f"{os.fspath(url)}: cannot create cache directory {final.parent}: {exc}") from exc
        with _locked(final.with_name(name + ".lock")):
            if self.lookup(sha, name) is not None:  # another process finished it meanwhile
                return final
            part = final.with_name(name + ".part")
            limits = Limits(os.fspath(url), max_bytes, deadline_s)
            resumed = self._transfer(kind, location, part, progress, timeout, limits)
            actual = sha256_file(part)
            if actual != sha and resumed:  # a stale partial file: start over once
                part.unlink(missing_ok=True)
                self._transfer(kind, location, part, progress, timeout, limits)
                actual = sha256_file(part)
            if actual != sha:
                part.unlink(missing_ok=True)
                raise ChecksumError(
                    f"{os.fspath(url)}: checksum mismatch: expected sha256 {sha}, got {actual}; "
                    "the partial file was deleted"
                )
            os.replace(part, final)
        return final

    def fetch_unpinned(
        self,
        url: str | os.PathLike[str],
        filename: str | None = None,
        progress: ProgressCallback | None = None,
        timeout: float = 60.0,
        max_bytes: int = DEFAULT_MAX_BYTES,
        deadline_s: float = DEFAULT_DEADLINE_S,
    ) -> tuple[Path, str]:
        """Download content whose checksum nobody published; return its cached file and SHA-256.

        Trust on first use: the content streams into ``<root>/unpinned/<sha256(url)[:16]>/<filename>.part``
        (resumed, bounded and locked as in :meth:`fetch`), is hashed, and moves to its content
        address :meth:`path_for` ``(sha256, filename)``, where :meth:`fetch` and :meth:`lookup`
        find it by that hash without any network. Nothing but the bounds vouches for the bytes:
        the caller checks the content and records the hash it returns, so that later calls are
        pinned. Always transfers (a resumable part excepted); look up a recorded hash first.

        Returns:
            ``(path, sha256)``.

        Raises:
            DownloadError: on a network or file error (the part is kept for resuming).
            DataError: on a malformed ``filename``.
        """
        kind, location = _source(url)
        name = _check_filename(filename if filename is not None else _default_filename(kind, location))
        folder = self.root / "unpinned" / hashlib.sha256(os.fspath(url).encode()).hexdigest()[:16]
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise DownloadError(f"{os.fspath(url)}: cannot create cache directory {folder}: {exc}") from exc
        with _locked(folder / (name + ".lock")):
            part = folder / (name + ".part")
            self._transfer(kind, location, part, progress, timeout, Limits(os.fspath(url), max_bytes, deadline_s))
            sha = sha256_file(part)
            final = self.path_for(sha, name)
            final.parent.mkdir(parents=True, exist_ok=True)
            os.replace(part, final)
        return final, sha

    def _transfer(
        self, kind: str, location: str, part: Path, progress: ProgressCallback | None, timeout: float, limits: Limits
    ) -> bool:
        """Fill ``part`` with the content; ``True`` when it continued an existing part."""
        if kind == "file":
            try:
                if not stat.S_ISREG(os.stat(location).st_mode):  # a FIFO would block, /dev/zero never end
                    raise DownloadError(f"{location}: not a regular file (a FIFO, device or socket); refused")
                with open(location, "rb") as src:
                    total = os.fstat(src.fileno()).st_size
                    limits.check_size(total, part)
                    with open_part(part, append=False) as dst:
                        copy_stream(src, dst, 0, total, progress, limits, part)
            except OSError as exc:
                raise DownloadError(f"{location}: cannot read local file: {exc}") from exc
            return False
        try:
            return self._http(location, part, progress, timeout, limits)
        except RangeMismatch:  # the server answered another range: the part cannot be trusted
            part.unlink(missing_ok=True)
            return self._http(location, part, progress, timeout, limits)

    def _http(self, url: str, part: Path, progress: ProgressCallback | None, timeout: float, limits: Limits) -> bool:
        if part.is_symlink():
            part.unlink()
        offset = part.stat().st_size if part.is_file() else 0
        request = urllib.request.Request(url, headers={"User-Agent": "hydragnn-data"})
        if offset:
            request.add_header("Range", f"bytes={offset}-")
        limits.check_time(part)  # a deadline already past: its own message, not a connection timeout
        try:
            response = urllib.request.urlopen(request, timeout=min(timeout, limits.remaining()))
        except urllib.error.HTTPError as exc:
            exc.close()
            if exc.code == 416 and offset:  # the part may already be complete; verification decides
                return True
            raise DownloadError(f"{url}: HTTP {exc.code} {exc.reason}") from exc
        except (urllib.error.URLError, OSError) as exc:
            limits.check_time(part)  # the connection outlived the deadline
            raise DownloadError(f"{url}: {getattr(exc, 'reason', exc)}") from exc
        with response:
            status = response.status
            crange = content_range(response.headers.get("Content-Range"))
            resume = offset > 0 and status == 206 and crange is not None and crange[0] == offset
            if status == 206 and not resume:
                if offset:
                    raise RangeMismatch  # restart the part from byte 0 (once)
                raise DownloadError(
                    f"{url}: asked for the whole file but the server sent Content-Range "
                    f"{response.headers.get('Content-Range')!r}"
                )
            if resume and crange is not None:  # resume implies a Content-Range
                total = crange[1]
            else:
                offset = 0
                length = response.headers.get("Content-Length")
                total = int(length) if length and length.isdigit() else None
            if total is not None:
                limits.check_size(total, part)
            try:
                with open_part(part, append=resume) as dst:
                    done = copy_stream(response, dst, offset, total, progress, limits, part)
            except (urllib.error.URLError, OSError, http.client.HTTPException) as exc:
                raise DownloadError(f"{url}: transfer interrupted ({exc!r}); run again to resume") from exc
        if total is not None and done < total:
            # http.client ends a body cut short by the server without an error: keep the part
            raise DownloadError(
                f"{url}: transfer interrupted after {done} of {total} bytes; the partial file {part} "
                "is kept, run again to resume"
            )
        return resume


def download(
    url: str | os.PathLike[str],
    sha256: str,
    cache_dir: str | os.PathLike[str] | None = None,
    filename: str | None = None,
    progress: ProgressCallback | None = None,
    timeout: float = 60.0,
    max_bytes: int = DEFAULT_MAX_BYTES,
    deadline_s: float = DEFAULT_DEADLINE_S,
) -> Path:
    """Fetch ``url`` into the checksum-keyed cache and return the verified file.

    A file already cached with the right hash is returned without any network access.

    Args:
        url: ``http(s)://`` or ``file://`` URL, or a local path.
        sha256: expected hex SHA-256 of the content.
        cache_dir: cache root; ``$HYDRAGNN_CACHE`` or ``~/.cache/hydragnn`` when ``None``.
        filename: cached file name; the URL's last component by default.
        progress: optional ``progress(bytes_done, total)`` callback.
        timeout: socket timeout in seconds for HTTP.
        max_bytes: refuse larger content (the part is deleted).
        deadline_s: stop a longer transfer (the part is kept for resuming).

    Returns:
        ``<cache_dir>/<sha256[:2]>/<sha256>/<filename>``.

    Raises:
        DownloadError: on network or file errors; ChecksumError (a DownloadError) on a checksum mismatch.
        DataError: on a malformed ``sha256`` or ``filename``.
    """
    return DownloadCache(cache_dir).fetch(
        url, sha256, filename=filename, progress=progress, timeout=timeout, max_bytes=max_bytes, deadline_s=deadline_s
    )

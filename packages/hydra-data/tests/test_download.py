"""The checksum-keyed download cache, against local files and a local HTTP server."""

from __future__ import annotations

import hashlib
import http.server
import os
import threading
import time
from pathlib import Path

import pytest

from hydragnn.data.errors import DataError, DownloadError
from hydragnn.data.io.download import DownloadCache, default_cache_dir, download

CONTENT = bytes(range(256)) * 40 + b"tail"  # 10,244 bytes
SHA = hashlib.sha256(CONTENT).hexdigest()


class _Server(http.server.ThreadingHTTPServer):
    files: dict[str, bytes]
    honour_range: bool
    wrong_range: bool  # answer a Range request with 206 and a Content-Range from byte 0
    cut_after: int | None  # send only this many body bytes, then drop the connection
    drip_s: float | None  # send the body one byte at a time, this many seconds apart
    requests: list[dict]


class _Handler(http.server.BaseHTTPRequestHandler):
    server: _Server

    def log_message(self, *args):  # keep test output quiet
        pass

    def do_GET(self):
        body = self.server.files.get(self.path)
        record = {"path": self.path, "range": self.headers.get("Range"), "sent": 0}
        self.server.requests.append(record)
        if body is None:
            self.send_error(404, "Not Found")
            return
        start = 0
        rng = self.headers.get("Range")
        if rng and self.server.wrong_range:
            self.send_response(206)
            self.send_header("Content-Range", f"bytes 0-{len(body) - 1}/{len(body)}")
        elif rng and self.server.honour_range:
            start = int(rng.removeprefix("bytes=").split("-")[0])
            if start >= len(body):
                self.send_response(416)
                self.send_header("Content-Range", f"bytes */{len(body)}")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{len(body) - 1}/{len(body)}")
        else:
            self.send_response(200)
        payload = body[start:]
        self.send_header("Content-Length", str(len(payload)))  # the full length, even when cut
        if self.server.cut_after is not None:
            payload = payload[: self.server.cut_after]
            self.close_connection = True
        record["sent"] = len(payload)  # before writing: the client may assert as soon as it has read
        self.end_headers()
        if self.server.drip_s is not None:
            for i in range(len(payload)):
                try:
                    self.wfile.write(payload[i : i + 1])
                    self.wfile.flush()
                except OSError:  # the client gave up
                    return
                time.sleep(self.server.drip_s)
            return
        self.wfile.write(payload)


@pytest.fixture
def server(monkeypatch):
    for var in ("no_proxy", "NO_PROXY"):  # a proxy configured in the environment must not intercept
        monkeypatch.setenv(var, "127.0.0.1,localhost")
    srv = _Server(("127.0.0.1", 0), _Handler)
    srv.files = {"/data/file.bin": CONTENT, "/other.bin": b"something else"}
    srv.honour_range = True
    srv.wrong_range = False
    srv.cut_after = None
    srv.drip_s = None
    srv.requests = []
    thread = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    srv.base = f"http://127.0.0.1:{srv.server_address[1]}"
    yield srv
    srv.shutdown()
    srv.server_close()
    thread.join(5)


def _entry(root: Path, name: str = "file.bin") -> Path:
    return root / SHA[:2] / SHA / name


def test_local_path_and_file_url(tmp_path):
    src = tmp_path / "src" / "file.bin"
    src.parent.mkdir()
    src.write_bytes(CONTENT)
    cache = tmp_path / "cache"
    seen = []
    path = download(src, SHA.upper(), cache_dir=cache, progress=lambda done, total: seen.append((done, total)))
    assert path == _entry(cache) and path.read_bytes() == CONTENT
    assert seen[-1] == (len(CONTENT), len(CONTENT))
    assert download(src.as_uri(), SHA, cache_dir=cache) == path
    src.unlink()  # cached: the source is never read again
    assert download(str(src), SHA, cache_dir=cache) == path
    assert DownloadCache(cache).lookup(SHA, "file.bin") == path


def test_http_download_then_cached_without_request(server, tmp_path):
    url = server.base + "/data/file.bin"
    seen = []
    path = download(url, SHA, cache_dir=tmp_path, progress=lambda d, t: seen.append((d, t)))
    assert path == _entry(tmp_path) and path.read_bytes() == CONTENT
    assert seen[-1] == (len(CONTENT), len(CONTENT))
    assert [r["sent"] for r in server.requests] == [len(CONTENT)]
    assert not list(path.parent.glob("*.part"))
    server.requests.clear()
    assert download(url, SHA, cache_dir=tmp_path) == path
    assert server.requests == []


def test_resume_sends_range_and_transfers_only_the_rest(server, tmp_path):
    part = _entry(tmp_path, "file.bin.part")
    part.parent.mkdir(parents=True)
    part.write_bytes(CONTENT[:4000])
    seen = []
    path = download(server.base + "/data/file.bin", SHA, cache_dir=tmp_path, progress=lambda d, t: seen.append((d, t)))
    assert path.read_bytes() == CONTENT and not part.exists()
    assert server.requests == [{"path": "/data/file.bin", "range": "bytes=4000-", "sent": len(CONTENT) - 4000}]
    assert seen[-1] == (len(CONTENT), len(CONTENT))


def test_interrupted_transfer_keeps_the_part_and_the_next_call_resumes(server, tmp_path):
    url = server.base + "/data/file.bin"
    server.cut_after = 3000  # the connection drops after 3000 of the announced 10,244 bytes
    with pytest.raises(DownloadError, match=r"interrupted after 3000 of 10244 bytes.*run again to resume"):
        download(url, SHA, cache_dir=tmp_path)
    assert _entry(tmp_path, "file.bin.part").read_bytes() == CONTENT[:3000]
    assert not _entry(tmp_path).exists()  # nothing unverified is ever published
    server.cut_after = None
    server.requests.clear()
    path = download(url, SHA, cache_dir=tmp_path)
    assert path.read_bytes() == CONTENT and not _entry(tmp_path, "file.bin.part").exists()
    assert server.requests == [{"path": "/data/file.bin", "range": "bytes=3000-", "sent": len(CONTENT) - 3000}]


def test_server_ignoring_range_restarts_from_zero(server, tmp_path):
    server.honour_range = False
    part = _entry(tmp_path, "file.bin.part")
    part.parent.mkdir(parents=True)
    part.write_bytes(CONTENT[:4000])
    path = download(server.base + "/data/file.bin", SHA, cache_dir=tmp_path)
    assert path.read_bytes() == CONTENT
    assert server.requests[0]["range"] == "bytes=4000-" and server.requests[0]["sent"] == len(CONTENT)


def test_stale_or_complete_part_files(server, tmp_path):
    url = server.base + "/data/file.bin"
    part = _entry(tmp_path, "file.bin.part")
    part.parent.mkdir(parents=True)
    part.write_bytes(b"x" * 100)  # not a prefix of the content: resumed result fails, restart
    assert download(url, SHA, cache_dir=tmp_path).read_bytes() == CONTENT
    assert [r["range"] for r in server.requests] == ["bytes=100-", None]
    _entry(tmp_path).unlink()
    server.requests.clear()
    part.write_bytes(CONTENT)  # complete part: the server answers 416, verification accepts it
    assert download(url, SHA, cache_dir=tmp_path).read_bytes() == CONTENT
    assert [r["sent"] for r in server.requests] == [0]


def test_corrupted_cache_file_is_downloaded_again(server, tmp_path):
    url = server.base + "/data/file.bin"
    path = download(url, SHA, cache_dir=tmp_path)
    path.write_bytes(b"corrupted" + CONTENT[9:])
    server.requests.clear()
    assert download(url, SHA, cache_dir=tmp_path).read_bytes() == CONTENT
    assert len(server.requests) == 1


def test_checksum_mismatch(server, tmp_path):
    wrong = hashlib.sha256(b"expected something else").hexdigest()
    with pytest.raises(DownloadError) as info:
        download(server.base + "/other.bin", wrong, cache_dir=tmp_path)
    message = str(info.value)
    assert wrong in message and hashlib.sha256(b"something else").hexdigest() in message
    entry = tmp_path / wrong[:2] / wrong
    assert not (entry / "other.bin").exists() and not (entry / "other.bin.part").exists()


def test_http_404_and_unreachable(server, tmp_path):
    with pytest.raises(DownloadError, match="404"):
        download(server.base + "/missing.bin", SHA, cache_dir=tmp_path)
    with pytest.raises(DownloadError, match="missing.bin"):
        download(tmp_path / "missing.bin", SHA, cache_dir=tmp_path)


def test_bad_arguments_and_default_dir(tmp_path, monkeypatch):
    with pytest.raises(DataError, match="sha256"):
        download(tmp_path / "f", "abc", cache_dir=tmp_path)
    with pytest.raises(DataError, match="filename"):
        download(tmp_path / "f", SHA, cache_dir=tmp_path, filename="../escape")
    with pytest.raises(DownloadError, match="scheme"):
        download("ftp://example.invalid/f", SHA, cache_dir=tmp_path)
    monkeypatch.setenv("HYDRAGNN_CACHE", str(tmp_path / "env"))
    assert default_cache_dir() == tmp_path / "env"
    assert DownloadCache().root == tmp_path / "env"
    monkeypatch.delenv("HYDRAGNN_CACHE")
    assert default_cache_dir() == Path.home() / ".cache" / "hydragnn"


def test_a_wrong_content_range_restarts_the_part_instead_of_failing_forever(server, tmp_path):
    server.wrong_range = True
    part = _entry(tmp_path, "file.bin.part")
    part.parent.mkdir(parents=True)
    part.write_bytes(CONTENT[:4000])
    path = download(server.base + "/data/file.bin", SHA, cache_dir=tmp_path)
    assert path.read_bytes() == CONTENT
    assert [r["range"] for r in server.requests] == ["bytes=4000-", None]


def test_size_cap_and_deadline(server, tmp_path):
    url = server.base + "/data/file.bin"
    with pytest.raises(DownloadError, match=r"10244 bytes, more than max_bytes=1000; the partial file was deleted"):
        download(url, SHA, cache_dir=tmp_path, max_bytes=1000)
    assert not _entry(tmp_path, "file.bin.part").exists()
    server.drip_s = 0.05  # a slow server: part of the file arrives before the deadline
    with pytest.raises(DownloadError, match=r"longer than deadline_s=1 s; the partial file .* is kept"):
        download(url, SHA, cache_dir=tmp_path, deadline_s=1)
    assert 0 < _entry(tmp_path, "file.bin.part").stat().st_size < len(CONTENT)
    server.drip_s = None
    with pytest.raises(DownloadError, match=r"longer than deadline_s=0 s"):  # a deadline already past
        download(url, SHA, cache_dir=tmp_path, deadline_s=0)
    assert download(url, SHA, cache_dir=tmp_path).read_bytes() == CONTENT  # and it resumes
    local = tmp_path / "big.bin"
    local.write_bytes(CONTENT)
    with pytest.raises(DownloadError, match="more than max_bytes=10"):
        download(local, SHA, cache_dir=tmp_path / "other", max_bytes=10)


def test_a_symlinked_part_is_never_written_through(server, tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_bytes(b"precious")
    part = _entry(tmp_path / "cache", "file.bin.part")
    part.parent.mkdir(parents=True)
    part.symlink_to(victim)
    path = download(server.base + "/data/file.bin", SHA, cache_dir=tmp_path / "cache")
    assert path.read_bytes() == CONTENT and victim.read_bytes() == b"precious" and not path.is_symlink()


def test_a_dripping_server_is_cut_at_the_deadline(server, tmp_path):
    """One byte every 0.2 s: the transfer stops at deadline_s (2 s), not at the socket timeout (30 s)."""
    server.drip_s = 0.2
    start = time.perf_counter()
    with pytest.raises(DownloadError, match=r"longer than deadline_s=2 s; the partial file .* is kept"):
        download(server.base + "/data/file.bin", SHA, cache_dir=tmp_path, deadline_s=2, timeout=30)
    assert time.perf_counter() - start < 3.5


def test_a_fifo_or_device_is_refused(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    start = time.perf_counter()
    with pytest.raises(DownloadError, match=r"pipe: not a regular file \(a FIFO, device or socket\); refused"):
        download(fifo, SHA, cache_dir=tmp_path / "cache")
    with pytest.raises(DownloadError, match="not a regular file"):
        download("/dev/zero", SHA, cache_dir=tmp_path / "cache")
    assert time.perf_counter() - start < 5

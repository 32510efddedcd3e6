"""The named data sets end to end against a loopback HTTP server serving a small archive in the
real LSMS layout: downloaded once, checksums, resume, offline messages, files placed by hand,
parsing, preparation and the prepared cache."""

from __future__ import annotations

import hashlib
import http.server
import io
import json
import tarfile
import threading

import pytest
import torch

from hydragnn.data import Schema, prepare_named_dataset
from hydragnn.data.errors import ChecksumError, DataError, DownloadError
from hydragnn.data.named.datasets import NAMED_DATASETS, named_dataset
from hydragnn.data.named.fetch import PIN, dataset_home
from hydragnn.data.named.lsms import LSMS_VARIABLES
from hydragnn.data.named.lsms_synthetic import synthetic_alloy

NAME = "FePt_32atoms"
ARCHIVE = NAMED_DATASETS[NAME].archive


def fixture_archive(n: int = 6, seed: int = 0, atoms: tuple[int, int, int] = (2, 2, 4)) -> bytes:
    """A tar.gz laid out as upstream's data: ``FePt_32atoms/output_files/out_<k>``, plus a README."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        members = [
            (f"FePt_32atoms/output_files/{name}", text.encode())
            for name, text in synthetic_alloy(n, seed, repeat=atoms)
        ]
        for name, content in [("FePt_32atoms/README.md", b"synthetic fixture"), *members]:
            info = tarfile.TarInfo(name)
            info.size = len(content)
            tar.addfile(info, io.BytesIO(content))
    return buf.getvalue()


ARCHIVE_BYTES = fixture_archive()
SHA = hashlib.sha256(ARCHIVE_BYTES).hexdigest()


class _Server(http.server.ThreadingHTTPServer):
    files: dict[str, bytes]
    cut_after: int | None
    requests: list[dict]


class _Handler(http.server.BaseHTTPRequestHandler):
    server: _Server

    def log_message(self, *args):
        pass

    def do_GET(self):
        body = self.server.files.get(self.path)
        rng = self.headers.get("Range")
        self.server.requests.append({"path": self.path, "range": rng})
        if body is None:
            self.send_error(404, "Not Found")
            return
        start = int(rng.removeprefix("bytes=").split("-")[0]) if rng else 0
        self.send_response(206 if rng else 200)
        if rng:
            self.send_header("Content-Range", f"bytes {start}-{len(body) - 1}/{len(body)}")
        payload = body[start:]
        self.send_header("Content-Length", str(len(payload)))
        if self.server.cut_after is not None:
            payload, self.close_connection = payload[: self.server.cut_after], True
        self.end_headers()
        self.wfile.write(payload)


@pytest.fixture
def server(monkeypatch, tmp_path):
    for var in ("no_proxy", "NO_PROXY"):
        monkeypatch.setenv(var, "127.0.0.1,localhost")
    monkeypatch.delenv("HYDRAGNN_OFFLINE", raising=False)
    srv = _Server(("127.0.0.1", 0), _Handler)
    srv.files, srv.cut_after, srv.requests = {f"/mirror/{ARCHIVE}": ARCHIVE_BYTES}, None, []
    thread = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    srv.base = f"http://127.0.0.1:{srv.server_address[1]}"
    monkeypatch.setenv("HYDRAGNN_DATASET_URL", f"{srv.base}/mirror/")
    yield srv
    srv.shutdown()
    srv.server_close()


def _prepare(tmp_path, lines=None, **kw):
    return prepare_named_dataset(
        NAME, cutoff=7.0, cache_dir=tmp_path / "cache", log=lines.append if lines is not None else None, **kw
    )


def test_registry_names_upstream_sets_without_invented_sources():
    assert sorted(NAMED_DATASETS) == ["CuAu_32atoms", "FePt_32atoms", "FeSi_1024atoms"]
    for entry in NAMED_DATASETS.values():
        assert entry.url is None and entry.sha256 is None  # nothing confirmed: nothing made up
        assert "https://doi.ccs.ornl.gov/" in entry.landing and "unknown" in entry.provenance
        assert entry.variables() == LSMS_VARIABLES and entry.variables() is not LSMS_VARIABLES
    assert named_dataset("fept_32atoms") is None and named_dataset(NAME).n_atoms == 32


def test_downloaded_once_parsed_prepared_and_cached(server, tmp_path):
    lines: list[str] = []
    first = _prepare(tmp_path, lines)
    assert not first.cached and len(first.dataset) == 6 and [r["range"] for r in server.requests] == [None]
    pin = json.loads((dataset_home(NAMED_DATASETS[NAME], tmp_path / "cache") / PIN).read_text())
    assert pin["sha256"] == SHA and pin["url"] == f"{server.base}/mirror/{ARCHIVE}"
    assert any(f"sha256 {SHA}, recorded in" in line for line in lines)
    sample = first.dataset[0]
    assert first.schema == Schema.from_dict(LSMS_VARIABLES) and sample.edge_index.shape[0] == 2
    assert sample.x.shape == (32, 1) and sample.y.shape == (1 + 32 + 32, 1) and sample.pos.shape == (32, 3)
    assert first.record["raw"]["verified"] == "first download (unpinned)"

    second = _prepare(tmp_path)  # the prepared container: no network, nothing parsed
    assert second.cached and len(server.requests) == 1 and second.entry == first.entry
    assert torch.equal(second.dataset[3].y, first.dataset[3].y)

    lines.clear()
    third = _prepare(
        tmp_path, lines, schema=Schema.from_dict({**LSMS_VARIABLES, "outputs": LSMS_VARIABLES["outputs"][:1]})
    )
    assert not third.cached and len(server.requests) == 1  # re-prepared from the download cache, by the pinned hash
    assert third.record["raw"]["verified"] == "pinned at first download" and any(
        "rebuilding (schema changed)" in x for x in lines
    )


def test_a_pinned_checksum_verifies_and_a_wrong_one_is_refused(server, tmp_path):
    with pytest.raises(ChecksumError) as info:
        _prepare(tmp_path, sha256="0" * 64)
    assert SHA in str(info.value) and "0" * 64 in str(info.value) and "Dataset.sha256" in str(info.value)
    home = dataset_home(NAMED_DATASETS[NAME], tmp_path / "cache")
    assert not (home / PIN).exists() and not (home / "prepared").exists()
    good = _prepare(tmp_path, sha256=SHA.upper())
    assert good.record["raw"]["verified"] == "Dataset.sha256" and len(good.dataset) == 6


def test_an_interrupted_download_resumes(server, tmp_path):
    server.cut_after = 1000
    with pytest.raises(DownloadError) as info:
        _prepare(tmp_path)
    message = str(info.value)
    assert "transfer interrupted after 1000" in message and "run again to resume" in message
    assert f"{server.base}/mirror/{ARCHIVE}" in message and str(tmp_path / "cache") in message
    server.cut_after = None
    done = _prepare(tmp_path)
    assert [r["range"] for r in server.requests] == [None, "bytes=1000-"]
    assert done.record["fingerprint"]["file"]["sha256"] == SHA and len(done.dataset) == 6


def test_offline_and_unreachable_say_how_to_place_the_files(server, tmp_path, monkeypatch):
    home = dataset_home(NAMED_DATASETS[NAME], tmp_path / "cache")
    monkeypatch.setenv("HYDRAGNN_OFFLINE", "1")
    with pytest.raises(DownloadError) as info:
        _prepare(tmp_path)
    message = str(info.value)
    for part in (
        f"{server.base}/mirror/{ARCHIVE}",
        "HYDRAGNN_OFFLINE",
        str(home / ARCHIVE),
        str(home / "raw"),
        "HYDRAGNN_DATASET_URL",
    ):
        assert part in message, part
    assert server.requests == []
    monkeypatch.delenv("HYDRAGNN_OFFLINE")
    monkeypatch.setenv("HYDRAGNN_DATASET_URL", "http://127.0.0.1:9/nowhere")  # the discard port: refused
    with pytest.raises(DownloadError, match="cannot be downloaded") as info:
        _prepare(tmp_path)
    assert "http://127.0.0.1:9/nowhere/FePt_32atoms.tar.gz" in str(info.value)
    monkeypatch.delenv("HYDRAGNN_DATASET_URL")
    with pytest.raises(DownloadError) as info:
        _prepare(tmp_path)
    assert "no download URL is known" in str(info.value) and "https://doi.ccs.ornl.gov/" in str(info.value)


def test_files_placed_by_hand_need_no_network(tmp_path, monkeypatch):
    monkeypatch.setenv("HYDRAGNN_OFFLINE", "1")
    monkeypatch.delenv("HYDRAGNN_DATASET_URL", raising=False)
    home = dataset_home(NAMED_DATASETS[NAME], tmp_path / "cache")
    home.mkdir(parents=True)
    (home / ARCHIVE).write_bytes(ARCHIVE_BYTES)
    placed = _prepare(tmp_path)
    assert placed.record["raw"]["verified"] == "placed by hand" and len(placed.dataset) == 6
    with pytest.raises(ChecksumError, match="the file placed there has"):
        _prepare(tmp_path, sha256="1" * 64)
    (home / ARCHIVE).unlink()
    raw = home / "raw" / "output_files"
    raw.mkdir(parents=True)
    for name, text in synthetic_alloy(3, seed=5):
        (raw / name).write_text(text)
    folder = _prepare(tmp_path)
    assert len(folder.dataset) == 3 and folder.record["fingerprint"]["file"]["name"] == "raw/"


def test_a_wrong_first_download_is_forgotten(server, tmp_path):
    server.files[f"/mirror/{ARCHIVE}"] = b"<html>the landing page, not the archive</html>"
    with pytest.raises(DataError, match="neither a folder nor a tar or zip archive"):
        _prepare(tmp_path)
    home = dataset_home(NAMED_DATASETS[NAME], tmp_path / "cache")
    assert not (home / PIN).exists()
    server.files[f"/mirror/{ARCHIVE}"] = fixture_archive(2, atoms=(2, 2, 2))  # 16-atom cells: not this data set
    with pytest.raises(DataError, match="16 atoms, expected 32"):
        _prepare(tmp_path)
    assert not (home / PIN).exists()
    server.files[f"/mirror/{ARCHIVE}"] = ARCHIVE_BYTES
    assert len(_prepare(tmp_path).dataset) == 6 and len(server.requests) == 3


def test_dataset_url_wins_and_local_paths_work(tmp_path, monkeypatch):
    monkeypatch.delenv("HYDRAGNN_DATASET_URL", raising=False)
    monkeypatch.delenv("HYDRAGNN_OFFLINE", raising=False)
    local = tmp_path / "FePt.zip-or-anything.tgz"
    local.write_bytes(ARCHIVE_BYTES)
    got = _prepare(tmp_path, url=local.as_uri())
    assert len(got.dataset) == 6 and got.record["raw"]["origin"] == local.as_uri()
    with pytest.raises(DataError, match="not a named data set; known names"):
        prepare_named_dataset("FePt", cutoff=7.0, cache_dir=tmp_path)

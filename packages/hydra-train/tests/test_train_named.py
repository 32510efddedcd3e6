"""``Dataset.name`` alone selects a published data set (``FePt_32atoms``, ...): the config, and a
short ``run_training`` end to end against a loopback HTTP mirror serving a small archive in the
real LSMS layout (downloaded once; the second run reads the caches only)."""

from __future__ import annotations

import copy
import http.server
import io
import json
import subprocess
import sys
import tarfile
import threading

import pytest

from hydragnn.data.named.lsms import LSMS_VARIABLES
from hydragnn.data.named.lsms_synthetic import synthetic_alloy
from hydragnn.train.config import load_config
from hydragnn.train.config_dataset import DatasetConfig
from hydragnn.train.errors import ConfigError

ARCH = {
    "mpnn_type": "SchNet",
    "hidden_dim": 8,
    "num_conv_layers": 1,
    "radius": 7.0,
    "num_radial": 6,
    "output_heads": {"graph": {"num_sharedlayers": 1, "num_headlayers": 1}, "node": {"num_headlayers": 1}},
    "task_weights": [1.0, 1.0, 1.0],
}


def named_config(cache_dir, **dataset) -> dict:
    return {
        "Verbosity": {"level": 0},
        "Dataset": {
            "name": "FePt_32atoms",
            "split": [0.5, 0.25, 0.25],
            "seed": 0,
            "cache_dir": str(cache_dir),
            **dataset,
        },
        "NeuralNetwork": {
            "Architecture": copy.deepcopy(ARCH),
            "Training": {
                "num_epoch": 1,
                "batch_size": 4,
                "Optimizer": {"type": "Adam", "learning_rate": 0.01},
                "Checkpoint": {"every": 1},
            },
        },
    }


def _archive() -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, text in synthetic_alloy(8, seed=3):
            info = tarfile.TarInfo(f"FePt_32atoms/output_files/{name}")
            info.size = len(text.encode())
            tar.addfile(info, io.BytesIO(text.encode()))
    return buf.getvalue()


class _Handler(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def do_GET(self):
        self.server.requests.append(self.path)
        body = self.server.files.get(self.path)
        if body is None:
            self.send_error(404, "Not Found")
            return
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def mirror(monkeypatch):
    for var in ("no_proxy", "NO_PROXY"):
        monkeypatch.setenv(var, "127.0.0.1,localhost")
    monkeypatch.delenv("HYDRAGNN_OFFLINE", raising=False)
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    srv.files, srv.requests = {"/hydragnn/FePt_32atoms.tar.gz": _archive()}, []
    threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    monkeypatch.setenv("HYDRAGNN_DATASET_URL", f"http://127.0.0.1:{srv.server_address[1]}/hydragnn")
    yield srv
    srv.shutdown()
    srv.server_close()


def test_the_name_alone_selects_the_published_set_and_other_names_stay_names(tmp_path):
    run = load_config(named_config(tmp_path))
    assert run.dataset.named and run.dataset.cutoff == 7.0 and run.schema is None
    assert load_config(run.to_dict()).dataset == run.dataset  # the completed config reads back equal
    with_source = named_config(tmp_path, generator={"name": "cuau", "n_structures": 4})
    assert not load_config(with_source).dataset.named  # another source: the name only names the run
    plain = DatasetConfig.from_dict({"name": "my_run", "generator": {}})
    assert plain.name == "my_run" and not plain.named


@pytest.mark.parametrize(
    ("dataset", "message"),
    [
        ({"name": "FePt_32"}, "found none, and name 'FePt_32' (did you mean 'FePt_32atoms'?)"),
        ({"name": "FePt_32atoms", "energy_key": "E"}, "Dataset.energy_key: not for the published data set"),
        ({"name": "FePt_32atoms", "format": "pt"}, "Dataset.format: not for the published data set"),
        ({"name": "x", "generator": {}, "url": "http://m/a.tgz"}, "Dataset.url: only for a published data set"),
        ({"name": "FePt_32atoms", "sha256": "12ab"}, "Dataset.sha256: expected the archive's SHA-256"),
    ],
)
def test_config_errors(dataset, message):
    with pytest.raises(ConfigError, match="^Dataset") as info:
        DatasetConfig.from_dict(dataset)
    assert message in str(info.value)


def test_a_named_config_validates_without_torch(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(named_config(tmp_path)))
    code = (
        "import sys; from hydragnn.train.config import load_config; c = load_config(sys.argv[1]); "
        "print(c.dataset.named, [m for m in ('torch', 'torch_geometric') if m in sys.modules])"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(path)], capture_output=True, text=True, timeout=120, check=True
    )
    assert out.stdout.strip() == "True []", out.stderr[-2000:]


def test_run_training_on_a_named_set_end_to_end(mirror, tmp_path):
    from hydragnn.train.pipeline import run_training

    cfg = named_config(tmp_path / "cache")
    cfg["Verbosity"]["level"] = 1  # the data lines reach train.log
    first = run_training(cfg, tmp_path / "run1")
    assert mirror.requests == ["/hydragnn/FePt_32atoms.tar.gz"]
    assert first["epochs_run"] == 1
    assert set(first["test"]["mae"]) == {"free_energy_scaled_num_nodes", "charge_density", "magnetic_moment"}
    saved = json.loads((tmp_path / "run1" / "config.json").read_text())
    assert saved["Variables"] == LSMS_VARIABLES and saved["Dataset"]["name"] == "FePt_32atoms"
    log = (tmp_path / "run1" / "train.log").read_text()
    assert "no published checksum; downloaded" in log and "8 samples prepared" in log

    # downloaded once: the second run reads the caches; pinning the recorded checksum keeps the
    # meaning of the checkpoint (the data's digest is the same), so the run resumes
    pin = json.loads((tmp_path / "cache" / "datasets" / "FePt_32atoms" / "pin.json").read_text())
    cfg["Dataset"]["sha256"] = pin["sha256"]
    cfg["NeuralNetwork"]["Training"]["num_epoch"] = 2
    second = run_training(cfg, tmp_path / "run1", resume=True)
    assert mirror.requests == ["/hydragnn/FePt_32atoms.tar.gz"] and [h["epoch"] for h in second["history"]] == [0, 1]
    assert "8 prepared samples from the cache" in (tmp_path / "run1" / "train.log").read_text()


def test_offline_run_names_the_url_the_cache_and_the_way_by_hand(tmp_path, monkeypatch):
    from hydragnn.data.errors import DownloadError
    from hydragnn.train.pipeline import run_training

    monkeypatch.setenv("HYDRAGNN_OFFLINE", "1")
    monkeypatch.setenv("HYDRAGNN_DATASET_URL", "https://mirror.example.org/hydragnn")
    with pytest.raises(DownloadError) as info:
        run_training(named_config(tmp_path / "cache"), tmp_path / "run")
    message = str(info.value)
    assert "https://mirror.example.org/hydragnn/FePt_32atoms.tar.gz" in message
    assert (
        str(tmp_path / "cache" / "datasets" / "FePt_32atoms" / "raw") in message
        and "Place the files by hand" in message
    )

"""``Training.device``: where a run trains, its validation, and a whole run on a GPU (``gpu``)."""

from __future__ import annotations

import json
from unittest import mock

import pytest
import torch
from train_helpers import FILE_ARCH, REF_KEYS

from hydragnn.data.emt import generate_cuau_atoms, write_extxyz
from hydragnn.models import load_artifact
from hydragnn.train import ConfigError, load_config
from hydragnn.train.pipeline import run_training
from hydragnn.train.run_folder import fingerprint
from hydragnn.train.strategies import make_strategy
from hydragnn.train.strategies.base import resolve_device


def _training(**extra) -> dict:
    return {"num_epoch": 2, "batch_size": 4, "Optimizer": {"learning_rate": 0.005}, **extra}


@pytest.mark.parametrize("bad", ["gpu", "cuda:", "cuda:x", "CUDA", "mps", ""])
def test_unknown_device_names_the_key(bad):
    with pytest.raises(ConfigError, match=r"NeuralNetwork\.Training\.device: expected 'auto'"):
        make_strategy(_training(device=bad))


def test_auto_and_cpu_train_on_the_cpu_without_cuda():
    with mock.patch.object(torch.cuda, "is_available", return_value=False):
        assert resolve_device("auto") == torch.device("cpu")
        assert make_strategy(_training()).device == torch.device("cpu")
    assert make_strategy(_training(device="cpu")).device == torch.device("cpu")


@pytest.mark.parametrize("request_", ["cuda", "cuda:0"])
def test_cuda_without_a_gpu_is_a_config_error(request_):
    with (
        mock.patch.object(torch.cuda, "is_available", return_value=False),
        pytest.raises(ConfigError, match=r"Training\.device: 'cuda.*sees no CUDA device"),
    ):
        make_strategy(_training(device=request_))


def test_a_gpu_index_beyond_the_visible_ones_is_a_config_error():
    with (
        mock.patch.object(torch.cuda, "is_available", return_value=True),
        mock.patch.object(torch.cuda, "device_count", return_value=2),
        mock.patch.object(torch.cuda, "current_device", return_value=0),
    ):
        assert resolve_device("auto") == torch.device("cuda", 0)
        assert resolve_device("cuda") == torch.device("cuda", 0)
        assert resolve_device("cuda:1") == torch.device("cuda", 1)
        with pytest.raises(ConfigError, match="'cuda:2', but torch sees 2 CUDA device"):
            resolve_device("cuda:2")


def test_a_distributed_rank_takes_its_local_gpu_not_an_index():
    strategy = make_strategy(_training(Parallelism={"strategy": "ddp"}))  # one-process gloo group
    try:
        assert strategy.device == torch.device("cpu")
        with pytest.raises(ConfigError, match="LOCAL_RANK's GPU: use 'cuda' or 'auto'"):
            strategy.place("cuda:1")
        if not torch.cuda.is_available():
            with pytest.raises(ConfigError, match="sees no CUDA device on rank 0"):
                strategy.place("cuda")
        strategy.place("cpu")
        assert strategy.device == torch.device("cpu")
    finally:
        strategy.teardown()


def test_device_is_written_and_free_on_resume():
    cfg = {
        "Dataset": {"name": "x", "train_file": "train.xyz"},
        "NeuralNetwork": {"Architecture": dict(FILE_ARCH), "Training": _training(device="cpu")},
    }
    parsed = load_config(cfg)
    assert parsed.training.device == "cpu"
    assert parsed.to_dict()["NeuralNetwork"]["Training"]["device"] == "cpu"
    other = json.loads(json.dumps(cfg))
    other["NeuralNetwork"]["Training"]["device"] = "auto"
    assert fingerprint(parsed.to_dict()) == fingerprint(load_config(other).to_dict())


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_potential_trains_on_the_gpu_like_on_the_cpu(tmp_path):
    """Same data, seed and config on both devices: the GPU run says where it trained, its losses
    follow the CPU run's, and its artifact loads and predicts on the CPU."""
    atoms = generate_cuau_atoms(16, seed=5)
    write_extxyz(tmp_path / "train.xyz", atoms[:10])
    write_extxyz(tmp_path / "valid.xyz", atoms[10:13])
    write_extxyz(tmp_path / "test.xyz", atoms[13:])
    metrics = {}
    for device in ("cpu", "cuda"):
        cfg = {
            "Verbosity": {"level": 1},
            "Dataset": {"name": "gpu", "train_file": "train.xyz", "valid_file": "valid.xyz", "test_file": "test.xyz"}
            | {k: v for k, v in REF_KEYS.items() if v},
            "NeuralNetwork": {"Architecture": dict(FILE_ARCH), "Training": _training(device=device)},
        }
        (tmp_path / f"{device}.json").write_text(json.dumps(cfg))
        metrics[device] = run_training(tmp_path / f"{device}.json", tmp_path / device)
        log = (tmp_path / device / "train.log").read_text()
        assert f"device: {device}" in log
    cpu, gpu = ([h["train_loss"] for h in metrics[d]["history"]] for d in ("cpu", "cuda"))
    assert len(cpu) == len(gpu) == 2
    assert gpu == pytest.approx(cpu, rel=1e-3)
    model = load_artifact(tmp_path / "cuda" / "model.hydra")
    assert all(p.device.type == "cpu" for p in model.parameters())

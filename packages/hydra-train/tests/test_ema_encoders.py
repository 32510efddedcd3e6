"""EMA weights (``Training.EMA``) for every encoder: the average is kept per parameter name, so an
encoder whose deep copy re-orders its submodules (e3nn's generated modules in MACE) averages
each parameter with itself, and a run with EMA on trains."""

from __future__ import annotations

import copy

import pytest
import torch
from train_helpers import MLIP_ARCH, config, samples

from hydragnn.data import Schema
from hydragnn.data.emt import CUAU_VARIABLES
from hydragnn.models import build_model
from hydragnn.models.encoder_configs import ENCODER_CONFIGS
from hydragnn.models.testing import missing_extra
from hydragnn.train import create_dataloaders, train_validate_test
from hydragnn.train.averaging import WeightAverage

# MACE at 32 channels: its dense tensor-product buffers exist (their order in a deep copy differs)
SMALL = {"UMA": {"lmax": 1, "mmax": 1}, "MACE": {"hidden_dim": 32}}


def mlip(mpnn_type: str, seed: int = 0):
    arch = {**MLIP_ARCH, "mpnn_type": mpnn_type, **SMALL.get(mpnn_type, {})}
    torch.manual_seed(seed)
    return build_model(arch, Schema.from_dict(CUAU_VARIABLES))


@pytest.mark.parametrize("mpnn_type", sorted(ENCODER_CONFIGS))
def test_average_of_every_encoder_is_kept_by_name(mpnn_type):
    """Three updates of random steps: inside ``applied`` each parameter is its own EMA, the live
    values come back after, and a checkpoint round trip keeps the average."""
    if reason := missing_extra(mpnn_type):
        pytest.skip(reason)
    model = mlip(mpnn_type)
    decay = 0.75
    average = WeightAverage(model, decay, warmup=False)
    expected: dict[str, torch.Tensor] = {}
    generator = torch.Generator().manual_seed(1)
    for _ in range(3):
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn(p.shape, generator=generator, dtype=p.dtype))
        average.update(model)
        for name, p in model.named_parameters():
            expected[name] = p.detach().clone() if name not in expected else decay * expected[name] + (1 - decay) * p
    live = {name: p.detach().clone() for name, p in model.named_parameters()}
    with average.applied(model):
        for name, p in model.named_parameters():
            torch.testing.assert_close(p, expected[name], msg=name)
    for name, p in model.named_parameters():
        assert torch.equal(p, live[name]), name
    restored = WeightAverage(
        copy.deepcopy(model), decay, warmup=False
    )  # a deep copy: the order may differ, names do not
    restored.load_state_dict(average.state_dict())
    assert restored.updates == 3
    for name in expected:
        torch.testing.assert_close(restored.average[name], expected[name], msg=name)


def test_mace_trains_with_ema(tmp_path):
    """The shipped setting (EMA on) with the MACE encoder: the run completes and keeps the average."""
    data = samples("mlip", 8)
    train, val, test = create_dataloaders(data[:6], data[6:], data[6:], 2)
    model = mlip("MACE")
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    nn_config = config("mlip", epochs=1, EMA={"enabled": True, "decay": 0.9})["NeuralNetwork"]
    summary = train_validate_test(model, optimizer, train, val, test, None, None, nn_config, "ema", 0, run_dir=tmp_path)
    assert len(summary["history"]) == 1
    assert torch.isfinite(torch.tensor(summary["history"][0]["train_loss"]))

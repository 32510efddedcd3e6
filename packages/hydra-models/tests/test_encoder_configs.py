"""The torch-free config registry (``encoder_configs``) against the encoder registry (``ENCODERS``).

A whole ``Architecture`` section parses without torch; the two registries hold the same names,
each encoder's ``Config`` is its registered config class and the recorded capabilities are the
encoder's class attributes, so they cannot drift.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import pytest

from hydragnn.models import ENCODERS, ModelConfig, ModelConfigError, get_encoder, register_encoder
from hydragnn.models.config_names import ACTIVATION_NAMES, POOLING_NAMES
from hydragnn.models.encoder_configs import (
    ENCODER_CONFIGS,
    EncoderConfig,
    EncoderEntry,
    encoder_entry,
    register_encoder_config,
)
from hydragnn.models.encoders import Encoder
from hydragnn.models.nn.activations import ACTIVATIONS
from hydragnn.models.nn.scatter import POOLINGS

HEAVY = ("torch", "torch_geometric", "e3nn", "fairchem")


def _run_without_torch(code: str) -> dict:
    """Run ``code`` in a fresh interpreter; it sets ``out`` (JSON); ``heavy`` lists the heavy modules it loaded."""
    script = (
        f"import json, sys\n{code}\nout['heavy'] = [m for m in {HEAVY!r} if m in sys.modules]\nprint(json.dumps(out))"
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_config_registry_matches_encoder_registry():
    # the names come from the config modules alone, in a process that never imports an encoder
    out = _run_without_torch(
        "from hydragnn.models.encoder_configs import ENCODER_CONFIGS\nout = {'names': sorted(ENCODER_CONFIGS)}"
    )
    assert out["heavy"] == []
    assert out["names"] == sorted(ENCODERS)
    for name, cls in ENCODERS.items():
        entry = ENCODER_CONFIGS[name]
        assert cls.Config is entry.config, name
        assert cls.supports_layer_mixing == entry.supports_layer_mixing, name
        assert entry.name == name


def test_whole_architectures_parse_without_torch():
    code = """
from hydragnn.models import ModelConfig, ModelConfigError
out = {}
out['schnet'] = ModelConfig.from_dict({"mpnn_type": "SchNet", "hidden_dim": 8, "num_filters": 16, "num_gaussians": 12,
    "enable_interatomic_potential": True, "reference_energies": {"Cu": -3.7}, "activation": "tanh",
    "graph_pooling": "sum", "precision": "bf16", "output_heads": {"node": {"num_headlayers": 1}}}).encoder.num_gaussians
out['mace'] = ModelConfig.from_dict({"mpnn_type": "MACE", "max_ell": 3, "correlation": 2}).encoder.max_ell
out['uma'] = ModelConfig.from_dict({"mpnn_type": "UMA", "lmax": 1, "mmax": 1}).encoder.lmax
errors = []
for arch in ({"mpnn_type": "SchNet", "num_gausians": 4}, {"mpnn_type": "DimeNet", "global_attn_engine": "GPS"},
             {"mpnn_type": "MACE", "max_ell": 1, "node_max_ell": 2}, {"mpnn_type": "Schnet"}):
    try:
        ModelConfig.from_dict(arch)
    except ModelConfigError as exc:
        errors.append(str(exc))
out['errors'] = errors
"""
    out = _run_without_torch(code)
    assert out["heavy"] == []
    assert (out["schnet"], out["mace"], out["uma"]) == (12, 3, 1)
    typo, gps, mace, name = out["errors"]
    assert typo.startswith("NeuralNetwork.Architecture.num_gausians: unknown key (did you mean 'num_gaussians'?)")
    assert "GPS mixes attention" in gps and "DimeNet has no per-layer node state" in gps
    assert mace.startswith("NeuralNetwork.Architecture.node_max_ell: expected an int in [0, max_ell=1]")
    assert name.startswith("NeuralNetwork.Architecture.mpnn_type: unknown encoder 'Schnet' (did you mean 'SchNet'?)")


def test_unknown_encoder_message_is_the_same_from_both_registries():
    with pytest.raises(ModelConfigError) as from_configs:
        encoder_entry("Painn")
    with pytest.raises(ModelConfigError) as from_encoders:
        get_encoder("Painn")
    assert str(from_configs.value) == str(from_encoders.value)
    assert str(from_configs.value).startswith(
        "NeuralNetwork.Architecture.mpnn_type: unknown encoder 'Painn' (did you mean 'PAINN'?); known: ['AllScAIP', "
    )


def test_name_tables_name_the_torch_tables():
    assert tuple(ACTIVATIONS) == ACTIVATION_NAMES
    assert tuple(POOLINGS) == POOLING_NAMES
    assert ModelConfig.from_dict({"mpnn_type": "SchNet", "precision": "fp64"}).dtype.is_floating_point


@pytest.fixture
def scratch_registries():
    """Names registered by a test are removed from both registries afterwards."""
    before_configs, before_encoders = dict(ENCODER_CONFIGS), dict(ENCODERS)
    yield
    for registry, before in ((ENCODER_CONFIGS, before_configs), (ENCODERS, before_encoders)):
        registry.clear()
        registry.update(before)


@pytest.mark.usefixtures("scratch_registries")
def test_an_encoder_defined_elsewhere_registers_its_config():
    @dataclasses.dataclass(frozen=True)
    class PluginConfig(EncoderConfig):
        width: int = 4

    @register_encoder("PluginNet")
    class PluginNet(Encoder):
        Config = PluginConfig
        supports_layer_mixing = False

    assert ENCODER_CONFIGS["PluginNet"] == EncoderEntry("PluginNet", PluginConfig, False)
    assert ModelConfig.from_dict({"mpnn_type": "PluginNet", "width": 7}).encoder == PluginConfig(width=7)
    with pytest.raises(ModelConfigError, match="PluginNet has no per-layer node state"):
        ModelConfig.from_dict({"mpnn_type": "PluginNet", "global_attn_engine": "GPS"})


@pytest.mark.usefixtures("scratch_registries")
def test_an_encoder_that_disagrees_with_its_config_entry_is_refused():
    @register_encoder_config("DriftNet", supports_layer_mixing=False)
    @dataclasses.dataclass(frozen=True)
    class DriftConfig(EncoderConfig):
        pass

    with pytest.raises(ValueError, match="'DriftNet'.*disagrees with its config registry entry"):

        @register_encoder("DriftNet")
        class DriftNet(Encoder):  # supports_layer_mixing defaults to True
            Config = DriftConfig

    assert "DriftNet" not in ENCODERS

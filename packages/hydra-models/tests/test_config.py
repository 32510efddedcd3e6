"""``ModelConfig`` / ``build_model`` validation: clear errors naming the JSON path."""

from __future__ import annotations

import pytest
import torch

from hydragnn.data import Schema
from hydragnn.models import ModelConfig, ModelConfigError, build_model

BASE = {"mpnn_type": "SchNet", "hidden_dim": 8, "num_conv_layers": 1, "radius": 3.0}


def _arch(**changes):
    arch = dict(BASE)
    arch.update(changes)
    return {k: v for k, v in arch.items() if v is not ...}


def test_defaults_and_common_keys():
    cfg = ModelConfig.from_dict({"mpnn_type": "SchNet"})
    assert (cfg.hidden_dim, cfg.num_conv_layers, cfg.radius, cfg.num_radial) == (64, 3, 5.0, 20)
    assert cfg.precision == "fp32" and cfg.dtype == torch.float32 and cfg.loss.function == "mse"
    assert cfg.output_heads.graph.shared_dims == (64,) and cfg.output_heads.graph.head_dims == (64, 64)
    assert cfg.output_heads.node.type == "mlp"
    cfg = ModelConfig.from_dict(
        _arch(
            precision="bf16",
            radius=4,  # an int is a valid float
            output_heads={
                "graph": {
                    "num_sharedlayers": 2,
                    "dim_sharedlayers": 12,
                    "num_headlayers": 2,
                    "dim_headlayers": [10, 6],
                },
                "node": {"num_headlayers": 1, "dim_headlayers": [5], "type": "conv"},
            },
            task_weights={"energy": 2.0},
            reference_energies={"Au": -3.0, "29": -3.5},
            num_filters=16,
            activation_function="tanh",
        )
    )
    assert cfg.dtype == torch.bfloat16 and cfg.radius == 4.0 and isinstance(cfg.radius, float)
    assert cfg.output_heads.graph.shared_dims == (12, 12) and cfg.output_heads.graph.head_dims == (10, 6)
    assert cfg.output_heads.node == type(cfg.output_heads.node)(head_dims=(5,), type="conv")
    assert cfg.mlip.reference_energies == ((29, -3.5), (79, -3.0))
    assert cfg.encoder.num_filters == 16 and cfg.activation == "tanh"
    assert cfg.raw["activation_function"] == "tanh"  # the section is stored as given


def test_groups_read_the_flat_keys():
    """The groups (mlip, attention, conditioning, loss) take their keys from the flat section:
    the JSON keys are the common keys, a group's name is not a key, ``raw`` stays flat."""
    from hydragnn.data.config_parse import key_values, to_json
    from hydragnn.models.config import COMMON_KEYS

    arch = _arch(
        enable_interatomic_potential=True,
        dynamic_graph=True,
        energy_name="E",
        energy_heads=["a", "b"],
        global_attn_engine="GPS",
        global_attn_type="performer",
        global_attn_heads=2,
        use_graph_attr_conditioning=True,
        graph_attr_conditioning_mode="film",
        loss_function_type="huber",
        huber_delta=0.5,
        task_weights=[1.0, 2.0],
        energy_weight=3.0,
        energy_loss="total",
    )
    cfg = ModelConfig.from_dict(arch)
    assert cfg.mlip.enabled and cfg.mlip.dynamic_graph and cfg.mlip.energy_name == "E"
    assert [h.name for h in cfg.mlip.head_specs()] == ["a", "b"]
    assert (cfg.attention.engine, cfg.attention.attn_type, cfg.attention.heads) == ("GPS", "performer", 2)
    assert cfg.conditioning.enabled and cfg.conditioning.mode == "film"
    assert (cfg.loss.function, cfg.loss.huber_delta, cfg.loss.task_weights) == ("huber", 0.5, (1.0, 2.0))
    assert (cfg.loss.energy_weight, cfg.loss.energy_loss) == (3.0, "total")
    assert cfg.raw == arch and ModelConfig.from_dict(cfg.raw) == cfg
    assert {"enable_interatomic_potential", "global_attn_engine", "pe_dim", "task_weights"} <= COMMON_KEYS
    assert not {"mlip", "attention", "conditioning", "loss", "enabled"} & COMMON_KEYS
    assert set(key_values(cfg)) == COMMON_KEYS | {"encoder", "raw"}
    assert to_json(cfg)["global_attn_type"] == "performer" and "attention" not in to_json(cfg)
    with pytest.raises(ModelConfigError, match=r"Architecture\.mlip: unknown key; neither a common key"):
        ModelConfig.from_dict(_arch(mlip={"enabled": True}))


@pytest.mark.parametrize(
    ("arch", "pattern"),
    [
        ({"hidden_dim": 8}, r"NeuralNetwork\.Architecture\.mpnn_type: required"),
        (
            _arch(mpnn_type="NoSuchNet"),
            r"mpnn_type: unknown encoder 'NoSuchNet' \(did you mean 'SchNet'\?\); known: \[.*'SchNet'",
        ),
        (_arch(mpnn_type=3), r"mpnn_type: expected str"),
        (_arch(hidden_dim="64"), r"Architecture\.hidden_dim: expected int, found str '64'"),
        (_arch(hidden_dim=True), r"Architecture\.hidden_dim: expected int, found bool"),
        (_arch(hidden_dim=0), r"Architecture\.hidden_dim: expected a value > 0"),
        (_arch(radius=-1.0), r"Architecture\.radius: expected a value > 0"),
        (_arch(max_neighbours="x"), r"max_neighbours: expected int or null"),
        (_arch(precision="fp16"), r"Architecture\.precision: expected one of .*'bf16'.*found 'fp16'"),
        (_arch(activation="swishy"), r"Architecture\.activation: expected one of"),
        (_arch(graph_pooling="median"), r"Architecture\.graph_pooling: expected one of"),
        (_arch(loss_function_type="l3"), r"loss_function_type: expected one of \['huber', 'mae', 'mse', 'smooth_l1'\]"),
        (_arch(conv_checkpointing="yes"), r"conv_checkpointing: expected bool"),
        (
            _arch(num_filtres=8),
            r"Architecture\.num_filtres: unknown key \(did you mean 'num_filters'\?\); neither a common key .* nor a "
            r"SchNet key .*num_filters",
        ),
        (_arch(num_filters="8"), r"NeuralNetwork\.Architecture\.num_filters: expected int\|None, found str"),
        (_arch(output_heads=[1]), r"output_heads: expected an object"),
        (
            _arch(output_heads={"nodes": {}}),
            r"output_heads\.nodes: unknown key \(did you mean 'node'\?\); allowed: \['edge', 'graph', 'node'\]",
        ),
        (_arch(output_heads={"node": {"type": "gnn"}}), r"output_heads\.node\.type: expected one of \['conv', 'mlp'\]"),
        (_arch(output_heads={"graph": {"depth": 2}}), r"output_heads\.graph\.depth: unknown key; allowed"),
        (
            _arch(output_heads={"graph": {"num_headlayers": 2, "dim_headlayers": [4]}}),
            r"graph\.dim_headlayers: expected 2 widths",
        ),
        (_arch(output_heads={"node": {"num_headlayers": -1}}), r"node\.num_headlayers: expected a value >= 0"),
        (_arch(output_heads={"edge": {"dim_headlayers": [4, "a"]}}), r"edge\.dim_headlayers\[1\]: expected int"),
        (_arch(radius=float("nan")), r"Architecture\.radius: expected a finite float, found float nan"),
        (_arch(radius=float("inf")), r"Architecture\.radius: expected a finite float"),
        (_arch(task_weights=[1.0, float("nan")]), r"task_weights\[1\]: expected a finite float"),
        (_arch(mpnn_type="EGNN", avg_num_neighbors=float("inf")), r"avg_num_neighbors: expected a finite float"),
        (_arch(task_weights="1"), r"task_weights: expected a list"),
        (_arch(task_weights=[1.0, -1.0]), r"task_weights: weights must be >= 0"),
        (_arch(reference_energies={"Xy": 1.0}), r"reference_energies: 'Xy' is neither a chemical symbol"),
        (_arch(reference_energies={"Cu": 1.0, "29": 2.0}), r"reference_energies: Cu \(Z=29\) is given twice"),
        (_arch(reference_energies={"200": 1.0}), r"reference_energies: '200' is not an atomic number"),
        (_arch(energy_loss="mean"), r"energy_loss: expected one of \['per_atom', 'total'\]"),
        (_arch(forces_weight=-1.0), r"forces_weight: expected a value >= 0"),
        (_arch(forces_weight=10.0), r"forces_weight: only for interatomic potentials"),
        (_arch(reference_energies={"29": "x"}), r"reference_energies\.29: expected float"),
        (_arch(activation="relu", activation_function="relu"), r"either 'activation_function' or 'activation'"),
        ([1, 2], r"NeuralNetwork\.Architecture: expected an object"),
    ],
)
def test_invalid_sections(arch, pattern):
    with pytest.raises(ModelConfigError, match=pattern):
        ModelConfig.from_dict(arch)


def test_errors_are_value_errors():
    assert issubclass(ModelConfigError, ValueError)


MLIP_VARS = {
    "inputs": [
        {"name": "atomic_number", "level": "node", "dim": 1},
        {"name": "pos", "level": "node", "dim": 3, "role": "position"},
    ],
    "outputs": [{"name": "energy", "level": "graph", "dim": 1}, {"name": "forces", "level": "node", "dim": 3}],
}


def _schema(outputs=None, inputs=None):
    return Schema.from_dict({"inputs": inputs or MLIP_VARS["inputs"], "outputs": outputs or MLIP_VARS["outputs"]})


@pytest.mark.parametrize(
    ("arch", "schema", "pattern"),
    [
        (
            _arch(task_weights=[1.0]),
            _schema(),
            r"task_weights: expected 2 weights \(one per output: \['energy', 'forces'\]\), found 1",
        ),
        (_arch(task_weights={"enrgy": 1.0}), _schema(), r"task_weights: unknown output\(s\) \['enrgy'\]"),
        (
            _arch(enable_interatomic_potential=True),
            _schema(outputs=[{"name": "E", "level": "graph", "dim": 1}]),
            r"needs a graph output 'energy' \(dim 1\).*energy_name",
        ),
        (
            _arch(enable_interatomic_potential=True),
            _schema(
                outputs=[{"name": "energy", "level": "graph", "dim": 1}, {"name": "forces", "level": "node", "dim": 2}]
            ),
            r"output 'forces' is the forces; expected level 'node' and dim in \[3\], found level 'node' dim 2",
        ),
        (
            _arch(enable_interatomic_potential=True),
            _schema(outputs=[{"name": "energy", "level": "graph", "dim": 3}]),
            r"output 'energy' is the energy",
        ),
        (
            _arch(),
            _schema(inputs=[{"name": "feat", "level": "node", "dim": 2}]),
            r"mpnn_type: SchNet needs positions; the schema has no 'pos' input",
        ),
        (
            _arch(enable_interatomic_potential=True, dynamic_graph=True),
            _schema(outputs=MLIP_VARS["outputs"] + [{"name": "bond", "level": "edge", "dim": 1}]),
            r"dynamic_graph: edge outputs need the dataset's edges",
        ),
        (
            _arch(enable_interatomic_potential=True, forces_weight=10.0, task_weights=[1.0, 2.0]),
            _schema(),
            r"forces_weight: output 'forces' is also weighted by .*task_weights; give its weight in one place",
        ),
        (
            _arch(enable_interatomic_potential=True, stress_weight=10.0),
            _schema(),
            r"stress_weight: the schema has no stress output to weigh",
        ),
    ],
)
def test_config_against_schema(arch, schema, pattern):
    with pytest.raises(ModelConfigError, match=pattern):
        build_model(arch, schema)


def test_energy_name_and_task_weights_by_name():
    schema = _schema(outputs=[{"name": "E", "level": "graph", "dim": 1}, {"name": "F", "level": "node", "dim": 3}])
    model = build_model(
        _arch(enable_interatomic_potential=True, energy_name="E", forces_name="F", task_weights={"F": 5.0}), schema
    )
    assert model.special == {"energy": "E", "forces": "F"}
    assert model.task_weights == {"E": 1.0, "F": 5.0}
    # MACE-style role weights land on the outputs playing those roles, next to task_weights for others
    model = build_model(
        _arch(
            enable_interatomic_potential=True, energy_name="E", forces_name="F", forces_weight=50.0, energy_weight=2.0
        ),
        schema,
    )
    assert model.task_weights == {"E": 2.0, "F": 50.0}
    three = _schema(outputs=[*MLIP_VARS["outputs"], {"name": "charge", "level": "node", "dim": 1}])
    model = build_model(
        _arch(enable_interatomic_potential=True, forces_weight=7.0, task_weights={"charge": 0.5}), three
    )
    assert model.task_weights == {"energy": 1.0, "forces": 7.0, "charge": 0.5}


def test_num_species_auto():
    assert build_model(_arch(), _schema()).dims.num_species == 119
    feat = _schema(inputs=[{"name": "feat", "level": "node", "dim": 1}, MLIP_VARS["inputs"][1]])
    assert build_model(_arch(), feat).dims.num_species == 0
    assert build_model(_arch(num_species=100), feat).dims.num_species == 100


@pytest.mark.parametrize("mlip", [False, True])
def test_schema_without_outputs_is_refused_with_a_reason(mlip):
    # hydra-data prepares samples from a schema without outputs (prediction inputs); a model
    # needs at least one output to predict and train on, and says so
    schema = Schema.from_dict({"inputs": MLIP_VARS["inputs"]})
    with pytest.raises(
        ModelConfigError, match=r"Variables.outputs: a model needs at least one output to predict and train on"
    ):
        build_model(_arch(enable_interatomic_potential=mlip), schema)

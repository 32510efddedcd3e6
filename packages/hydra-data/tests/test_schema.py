"""Schema rules: each rule has a test that fails without it."""

from __future__ import annotations

import copy

import pytest

from hydragnn.data import RESERVED_NAMES, Schema, SchemaError
from hydragnn.data.errors import did_you_mean

BASE = {
    "inputs": [
        {"name": "atomic_number", "level": "node", "dim": 1},
        {"name": "pos", "level": "node", "dim": 3, "role": "position"},
        {"name": "charge", "level": "graph", "dim": 1},
        {"name": "bond_order", "level": "edge", "dim": 2},
    ],
    "outputs": [
        {"name": "energy", "level": "graph", "dim": 1},
        {"name": "forces", "level": "node", "dim": 3},
        {"name": "bond_energy", "level": "edge", "dim": 1},
    ],
}


def variant(**edits):
    spec = copy.deepcopy(BASE)
    for path, value in edits.items():
        kind, idx, key = path.split("__")
        if value is ...:
            del spec[kind][int(idx)][key]
        else:
            spec[kind][int(idx)][key] = value
    return spec


def test_valid_schema_parses_in_json_order():
    s = Schema.from_dict(BASE)
    assert [v.name for v in s.inputs] == ["atomic_number", "pos", "charge", "bond_order"]
    assert s.position.name == "pos"
    assert [v.name for v in s.feature_inputs("node")] == ["atomic_number"]
    assert s.input_dim("node") == 1 and s.input_dim("edge") == 2 and s.input_dim("graph") == 1
    assert s.output_slices() == {"energy": slice(0, 1), "forces": slice(0, 3), "bond_energy": slice(0, 1)}
    assert Schema.from_dict(s.to_dict()) == s


def test_position_role_only_on_pos_node_dim3():
    with pytest.raises(SchemaError, match="'coords'.*role 'position' is only for the input named 'pos'"):
        Schema.from_dict(variant(inputs__1__name="coords"))
    with pytest.raises(SchemaError, match="'pos'.*level 'node' and dim 3"):
        Schema.from_dict(variant(inputs__1__dim=2))
    with pytest.raises(SchemaError, match="'pos'.*level 'node' and dim 3"):
        Schema.from_dict(variant(inputs__1__level="graph"))


def test_pos_without_role_rejected():
    with pytest.raises(SchemaError, match="'pos'.*must declare role 'position'"):
        Schema.from_dict(variant(inputs__1__role=...))


def test_outputs_cannot_have_a_role():
    spec = copy.deepcopy(BASE)
    spec["outputs"][1]["role"] = "position"
    with pytest.raises(SchemaError, match=r"outputs\[1\] \('forces'\): outputs cannot have a role"):
        Schema.from_dict(spec)


def test_ordinary_node_input_required():
    spec = copy.deepcopy(BASE)
    spec["inputs"] = [v for v in spec["inputs"] if v["name"] != "atomic_number"]
    with pytest.raises(SchemaError, match="at least one ordinary node input"):
        Schema.from_dict(spec)


@pytest.mark.parametrize("name", sorted(RESERVED_NAMES))
@pytest.mark.parametrize("kind", ["inputs", "outputs"])
def test_reserved_names_rejected(name, kind):
    spec = copy.deepcopy(BASE)
    spec[kind].append({"name": name, "level": "node", "dim": 1})
    with pytest.raises(SchemaError, match=f"'{name}'.*reserved"):
        Schema.from_dict(spec)


def test_duplicate_names_rejected_across_inputs_and_outputs():
    spec = copy.deepcopy(BASE)
    spec["outputs"].append({"name": "charge", "level": "graph", "dim": 1})
    with pytest.raises(SchemaError, match="'charge'.*duplicate name.*inputs"):
        Schema.from_dict(spec)


def test_unknown_keys_and_levels_rejected():
    with pytest.raises(SchemaError, match=r"inputs\[0\] \('atomic_number'\): unknown key\(s\) \['units'\]"):
        Schema.from_dict(variant(inputs__0__units="e"))
    with pytest.raises(SchemaError, match="'energy'.*unknown level 'system'"):
        Schema.from_dict(variant(outputs__0__level="system"))
    with pytest.raises(SchemaError, match=r"Variables: unknown key\(s\) \['targets'\]"):
        Schema.from_dict({**BASE, "targets": []})
    with pytest.raises(SchemaError, match="unknown role 'velocity'"):
        Schema.from_dict(variant(inputs__0__role="velocity"))


def test_unknown_keys_suggest_the_nearest_allowed_one():
    with pytest.raises(SchemaError, match=r"\['Level'\] \(did you mean 'level'\?\); allowed keys are"):
        Schema.from_dict(variant(inputs__0__Level="node"))
    with pytest.raises(SchemaError, match=r"Variables: unknown key\(s\) \['output'\] \(did you mean 'outputs'\?\)"):
        Schema.from_dict({**BASE, "output": []})
    assert did_you_mean(["LR"], ["lr", "seed"]) == " (did you mean 'lr'?)"  # case-insensitive
    assert did_you_mean(["sed", "zzz", "LR"], ["lr", "seed"]) == " (did you mean 'seed' for 'sed', 'lr' for 'LR'?)"
    assert did_you_mean(["units"], ["name", "level", "dim", "role"]) == ""  # nothing close: no guess


@pytest.mark.parametrize("dim", [0, -1, 1.5, True, "3"])
def test_dim_must_be_positive_int(dim):
    with pytest.raises(SchemaError, match="'forces'.*'dim' must be an integer > 0"):
        Schema.from_dict(variant(outputs__1__dim=dim))


def test_missing_fields_and_wrong_containers():
    with pytest.raises(SchemaError, match="missing 'level'"):
        Schema.from_dict(variant(outputs__0__level=...))
    with pytest.raises(SchemaError, match="'name' must be a non-empty string"):
        Schema.from_dict(variant(outputs__0__name=""))
    with pytest.raises(SchemaError, match="Variables.inputs: expected a list"):
        Schema.from_dict({"inputs": {"a": 1}, "outputs": []})


def test_feature_role_written_explicitly_is_the_default():
    # the seed: "ordinary inputs use the default feature role"; writing it is the same as leaving it out
    spec = copy.deepcopy(BASE)
    for entry in spec["inputs"]:
        if entry["name"] != "pos":
            entry["role"] = "feature"
    s = Schema.from_dict(spec)
    assert s == Schema.from_dict(BASE) and s.to_dict() == Schema.from_dict(BASE).to_dict()
    assert [v.name for v in s.feature_inputs("node")] == ["atomic_number"] and s["charge"].role is None
    with pytest.raises(SchemaError, match="'pos'.*must declare role 'position'"):
        Schema.from_dict(variant(inputs__1__role="feature"))  # pos is never an ordinary feature
    with pytest.raises(SchemaError, match=r"unknown role 'coordinates'; expected one of \['feature', 'position'\]"):
        Schema.from_dict(variant(inputs__0__role="coordinates"))


@pytest.mark.parametrize("outputs", [[], None])
def test_outputs_are_optional(outputs):
    # the seed: "Edge inputs, graph inputs, and outputs are optional" (absent or an empty list)
    spec = {"inputs": BASE["inputs"]} if outputs is None else {"inputs": BASE["inputs"], "outputs": outputs}
    s = Schema.from_dict(spec)
    assert s.outputs == () and not s.has_outputs and Schema.from_dict(BASE).has_outputs
    assert s.to_dict()["outputs"] == [] and Schema.from_dict(s.to_dict()) == s
    assert s.output_slices() == {} and s.input_dim("node") == 1

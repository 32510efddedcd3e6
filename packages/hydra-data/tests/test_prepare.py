"""prepare(sample, schema): the prepared-graph contract."""

from __future__ import annotations

import pytest
import torch
from torch_geometric.data import Batch, Data

from hydragnn.data import Schema, SchemaError, prepare
from hydragnn.data.prepare import derived_tensors

SCHEMA = Schema.from_dict(
    {
        "inputs": [
            {"name": "atomic_number", "level": "node", "dim": 1},
            {"name": "pos", "level": "node", "dim": 3, "role": "position"},
            {"name": "spin", "level": "node", "dim": 2},
            {"name": "bond", "level": "edge", "dim": 1},
            {"name": "charge", "level": "graph", "dim": 1},
        ],
        "outputs": [
            {"name": "energy", "level": "graph", "dim": 1},
            {"name": "forces", "level": "node", "dim": 3},
            {"name": "dipole", "level": "graph", "dim": 3},
            {"name": "bond_energy", "level": "edge", "dim": 1},
        ],
    }
)


def make_sample(n=4, e=5, seed=0, **overrides):
    g = torch.Generator().manual_seed(seed)
    fields = dict(
        atomic_number=torch.randint(1, 80, (n, 1), generator=g),
        pos=torch.randn(n, 3, generator=g, dtype=torch.float64),
        spin=torch.randn(n, 2, generator=g),
        edge_index=torch.randint(0, n, (2, e), generator=g),
        bond=torch.randn(e, 1, generator=g),
        charge=torch.tensor([[1.0]]),
        energy=torch.tensor([[-3.5]]),
        forces=torch.randn(n, 3, generator=g),
        dipole=torch.randn(1, 3, generator=g),
        bond_energy=torch.randn(e, 1, generator=g),
    )
    fields.update(overrides)
    return Data(**{k: v for k, v in fields.items() if v is not None})


def test_derived_tensors_follow_json_order():
    s = make_sample()
    d = prepare(s, SCHEMA)
    assert torch.equal(d.x, torch.cat([s.atomic_number.double(), s.spin.double()], dim=1))
    assert d.x.shape == (4, 3) and d.x.is_floating_point()
    assert torch.equal(d.edge_attr, s.bond.reshape(-1, 1))
    assert torch.equal(d.graph_attr, s.charge)
    assert torch.equal(d.graph_output, torch.cat([s.energy, s.dipole], dim=1))
    assert torch.equal(d.node_output, s.forces)
    assert torch.equal(d.edge_output, s.bond_energy)
    flat = torch.cat([s.energy.reshape(-1), s.forces.reshape(-1), s.dipole.reshape(-1), s.bond_energy.reshape(-1)])
    assert torch.equal(d.y, flat.reshape(-1, 1))
    assert d.y_loc.tolist() == [[0, 1, 13, 16, 21]]
    for i, var in enumerate(SCHEMA.outputs):
        lo, hi = d.y_loc[0, i], d.y_loc[0, i + 1]
        assert torch.equal(d.y[lo:hi].reshape(-1), getattr(s, var.name).reshape(-1).float())


def test_pos_stays_out_of_x_and_keeps_autograd():
    pos = torch.randn(4, 3, dtype=torch.float64, requires_grad=True)
    d = prepare(make_sample(pos=pos), SCHEMA)
    assert d.pos is pos and d.pos.requires_grad
    assert d.x.shape[1] == 3  # atomic_number (1) + spin (2), not pos
    (d.pos**2).sum().backward()
    assert torch.allclose(pos.grad, 2 * pos)


def test_stale_derived_tensors_removed_and_sources_kept():
    # every derived name present with wrong content, as a third-party dataset or an earlier
    # preparation with another schema would leave them
    stale = make_sample(
        x=torch.zeros(4, 9),
        edge_attr=torch.zeros(5, 4),
        graph_attr=torch.zeros(1, 5),
        y=torch.zeros(2),
        y_loc=torch.tensor([[0, 7, 9]]),
        node_output=torch.zeros(4, 7),
        edge_output=torch.zeros(5, 2),
        graph_output=torch.zeros(1, 3),
    )
    schema = Schema.from_dict(
        {
            "inputs": [{"name": "atomic_number", "level": "node", "dim": 1}],
            "outputs": [{"name": "energy", "level": "graph", "dim": 1}],
        }
    )
    d = prepare(stale, schema)
    assert torch.equal(d.x, stale.atomic_number.float())
    assert torch.equal(d.graph_output, stale.energy)
    assert torch.equal(d.y, stale.energy) and d.y_loc.tolist() == [[0, 1]]
    for key in ("graph_attr", "node_output", "edge_attr", "edge_output"):
        assert key not in d, key  # not declared by this schema: removed, not carried over
    for key in ("atomic_number", "spin", "forces", "bond", "edge_index", "pos", "charge", "dipole"):
        assert key in d and d[key] is stale[key], key  # named sources stay, untouched


def test_preparing_twice_gives_the_same_result():
    once = prepare(make_sample(), SCHEMA)
    twice = prepare(once, SCHEMA)
    assert set(once.keys()) == set(twice.keys())
    for key in once.keys():
        assert torch.equal(once[key], twice[key]), key


@pytest.mark.parametrize(
    ("overrides", "pattern"),
    [
        (
            {"atomic_number": torch.tensor([1, 2, 3, 4])},
            r"'atomic_number' \(node, dim 1\): wrong shape: expected shape \(N=4 from 'pos', 1\).*found shape \(4,\) "
            r"int64; node variables have shape \(N, dim\): use atomic_number.reshape\(-1, 1\)",
        ),
        (
            {"bond": torch.zeros(5)},
            r"'bond' \(edge, dim 1\): wrong shape.*found shape \(5,\) float32; edge variables have shape \(E, dim\): "
            r"use bond.reshape\(-1, 1\)",
        ),
        (
            {"energy": torch.tensor(-2.0)},
            r"'energy' \(graph, dim 1\): wrong shape.*found shape \(\) float32; graph variables have shape "
            r"\(1, dim\): use energy.reshape\(1, 1\)",
        ),
        (
            {"dipole": torch.tensor([1.0, 2.0, 3.0])},
            r"'dipole' \(graph, dim 3\): wrong shape.*found shape \(3,\) float32; graph variables have shape "
            r"\(1, dim\): use dipole.reshape\(1, 3\)",
        ),
    ],
)
def test_flat_sources_refused_with_the_shape_to_give(overrides, pattern):
    # the seed: node variables (N, dim), edge variables (E, dim), graph variables (1, dim); a flat
    # or scalar tensor is refused and the message says which reshape gives the contract's shape
    with pytest.raises(SchemaError, match=pattern):
        prepare(make_sample(**overrides), SCHEMA, index=2)
    fixed = {k: v.reshape(-1, SCHEMA[k].dim) for k, v in overrides.items()}
    prepare(make_sample(**fixed), SCHEMA, index=2)  # the reshape the message names is accepted


REAL = r"with a real dtype \(floating or integer\)"


@pytest.mark.parametrize(
    ("overrides", "pattern"),
    [
        (
            {"forces": torch.zeros(4, 2)},
            rf"sample 7: variable 'forces' \(node, dim 3\): wrong shape: expected shape \(N=4 from 'pos', 3\) {REAL}, "
            r"found shape \(4, 2\) float32",
        ),
        (
            {"forces": torch.zeros(5, 3, dtype=torch.float64)},
            rf"'forces'.*expected shape \(N=4 from 'pos', 3\) {REAL}, found shape \(5, 3\) float64",
        ),
        (
            {"bond": torch.zeros(4, dtype=torch.int32)},
            rf"'bond' \(edge, dim 1\): wrong shape: expected shape \(E=5, 1\) {REAL}, found shape \(4,\) int32",
        ),
        (
            {"dipole": torch.zeros(2, 3)},
            rf"'dipole' \(graph, dim 3\): wrong shape: expected shape \(1, 3\) {REAL}, found shape \(2, 3\) float32",
        ),
        (
            {"energy": None},
            rf"'energy' \(graph, dim 1\): attribute missing; expected a tensor of shape \(1, 1\) {REAL}",
        ),
        (
            {"spin": [[0.0, 1.0]] * 4},
            rf"'spin'.*expected a torch.Tensor of shape \(N=4 from 'pos', 2\) {REAL}, found a list",
        ),
        (
            {"spin": torch.zeros(4, 2, dtype=torch.complex64)},
            rf"'spin'.*wrong dtype: expected shape \(N=4 from 'pos', 2\) {REAL}, found shape \(4, 2\) complex64",
        ),
        (
            {"spin": torch.zeros(4, 2, dtype=torch.bool)},
            rf"'spin'.*wrong dtype: expected .* {REAL}, found shape \(4, 2\) bool",
        ),
        (
            {"pos": torch.zeros(4, 3, dtype=torch.int64)},
            r"'pos' \(node, dim 3\): positions must be floating point: expected shape \(N=4, 3\) with a floating dtype, "
            r"found shape \(4, 3\) int64",
        ),
        (
            {"pos": torch.zeros(3, 3)},
            rf"'atomic_number'.*expected shape \(N=3 from 'pos', 1\) {REAL}, found shape \(4, 1\) int64",
        ),
        ({"edge_index": torch.zeros(2, 5)}, r"'edge_index': expected dtype int64, found shape \(2, 5\) float32"),
        ({"edge_index": None}, r"'bond'.*edge-level variables need 'edge_index'"),
        ({"cell": torch.eye(2)}, r"'cell': expected a floating tensor of shape \(3, 3\).*found shape \(2, 2\) float32"),
        ({"edge_shift": torch.zeros(4, 3)}, r"'edge_shift': expected shape \(E=5, 3\).*found shape \(4, 3\) float32"),
    ],
)
def test_errors_name_sample_variable_and_shapes(overrides, pattern):
    with pytest.raises(SchemaError, match=pattern) as err:
        prepare(make_sample(**overrides), SCHEMA, index=7)
    assert str(err.value).startswith("sample 7: ")  # every message names the sample index


def test_periodic_geometry_normalised_for_batching():
    d = prepare(
        make_sample(cell=torch.eye(3) * 4.0, pbc=torch.tensor([True, True, False]), edge_shift=torch.zeros(5, 3)),
        SCHEMA,
    )
    assert d.cell.shape == (1, 3, 3) and d.pbc.shape == (1, 3) and d.pbc.dtype == torch.bool
    b = Batch.from_data_list(
        [
            d,
            prepare(
                make_sample(
                    n=6,
                    e=2,
                    seed=1,
                    cell=torch.eye(3),
                    pbc=torch.ones(3, dtype=torch.bool),
                    edge_shift=torch.ones(2, 3),
                ),
                SCHEMA,
            ),
        ]
    )
    assert b.cell.shape == (2, 3, 3) and b.pbc.shape == (2, 3) and b.edge_shift.shape == (7, 3)


def test_batched_y_loc_locates_each_graph_outputs():
    a, b = prepare(make_sample(n=3, e=2, seed=1), SCHEMA), prepare(make_sample(n=5, e=4, seed=2), SCHEMA)
    batch = Batch.from_data_list([a, b])
    assert batch.y_loc.shape == (2, 5)
    offset = a.y.shape[0]
    for g, d in enumerate((a, b)):
        base = 0 if g == 0 else offset
        forces = batch.y[base + batch.y_loc[g, 1] : base + batch.y_loc[g, 2]].reshape(-1, 3)
        assert torch.equal(forces, d.forces)
    assert batch.x.shape == (8, 3) and batch.graph_output.shape == (2, 4) and batch.edge_output.shape == (6, 1)


def test_non_data_input_rejected():
    with pytest.raises(SchemaError, match="sample 3: expected a torch_geometric Data, found dict"):
        prepare({"pos": torch.zeros(1, 3)}, SCHEMA, index=3)


def test_schema_without_outputs_prepares_samples_for_prediction():
    # the seed: "Edge inputs, graph inputs, and outputs are optional"; with none declared the
    # prepared sample has inputs only, and stale targets from a labelled source are removed
    schema = Schema.from_dict({"inputs": SCHEMA.to_dict()["inputs"]})
    stale = prepare(make_sample(), SCHEMA)  # carries y, y_loc and the *_output tensors
    d = prepare(stale, schema, index=0)
    assert d.x.shape == (4, 3) and d.edge_attr.shape == (5, 1) and d.graph_attr.shape == (1, 1)
    for key in ("y", "y_loc", "node_output", "edge_output", "graph_output"):
        assert key not in d, key
    batch = Batch.from_data_list([d, prepare(make_sample(n=3, e=2, seed=1), schema)])
    assert batch.x.shape == (7, 3) and batch.graph_attr.shape == (2, 1) and batch.num_graphs == 2


def test_derived_tensors_of_samples_laid_end_to_end_equal_each_sample_s():
    sizes = [(3, 2), (1, 0), (6, 7), (2, 1)]
    samples = [make_sample(n=n, e=e, seed=k, charge=torch.tensor([[float(k)]])) for k, (n, e) in enumerate(sizes)]
    names = [v.name for v in (*SCHEMA.inputs, *SCHEMA.outputs)]
    each = [derived_tensors({name: s[name] for name in names}, SCHEMA) for s in samples]
    columns = {name: torch.cat([s[name] for s in samples]) for name in names}
    rows = {
        "node": torch.tensor([n for n, _ in sizes]),
        "edge": torch.tensor([e for _, e in sizes]),
        "graph": torch.ones(len(sizes), dtype=torch.long),
    }
    many = derived_tensors(columns, SCHEMA, rows)
    order = ["x", "node_output", "edge_attr", "edge_output", "graph_attr", "graph_output", "y", "y_loc"]
    assert list(many) == list(each[0]) == order
    for key in many:
        joined = torch.cat([d[key] for d in each])
        assert many[key].dtype == joined.dtype and torch.equal(many[key], joined), key
    prepared = [prepare(s, SCHEMA) for s in samples]  # what prepare sets is what derived_tensors gives
    assert all(torch.equal(p.y, d["y"]) and torch.equal(p.y_loc, d["y_loc"]) for p, d in zip(prepared, each))

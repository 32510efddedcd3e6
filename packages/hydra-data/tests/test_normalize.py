"""Normalizer: statistics against numpy, round trips, per-atom option, serialisation, errors."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from torch_geometric.data import Batch, Data

from hydragnn.data import Schema, prepare
from hydragnn.data.errors import DataError
from hydragnn.data.normalize import Normalizer


def _raw(n: int = 12, seed: int = 0) -> list[Data]:
    gen = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        k = int(torch.randint(2, 7, (1,), generator=gen))
        out.append(
            Data(
                atomic_number=torch.randint(1, 9, (k, 1), generator=gen),
                pos=torch.randn(k, 3, generator=gen),
                energy=torch.randn(1, 1, generator=gen, dtype=torch.float64) * 50 - 300,
                forces=torch.randn(k, 3, generator=gen) * torch.tensor([1.0, 2.0, 5.0]) + 3,
                dipole=torch.randn(1, 2, generator=gen),  # graph vector, (1, dim)
                const=torch.full((k,), 7.0),
            )
        )
    return out


SCHEMA = Schema.from_dict(
    {
        "inputs": [
            {"name": "atomic_number", "level": "node", "dim": 1},
            {"name": "pos", "level": "node", "dim": 3, "role": "position"},
        ],
        "outputs": [
            {"name": "energy", "level": "graph", "dim": 1},
            {"name": "forces", "level": "node", "dim": 3},
            {"name": "dipole", "level": "graph", "dim": 2},
        ],
    }
)


def _stack(ds, name, cols):
    return np.concatenate([d[name].numpy().astype(np.float64).reshape(-1, cols) for d in ds])


def test_standard_stats_match_numpy():
    ds = _raw()
    norm = Normalizer.fit(ds, ["energy", "forces", "dipole"], schema=SCHEMA)
    for name, cols in (("energy", 1), ("forces", 3), ("dipole", 2)):
        ref = _stack(ds, name, cols)
        s = norm.stats[name]
        np.testing.assert_allclose(s.shift, ref.mean(0), rtol=1e-12)
        np.testing.assert_allclose(s.scale, ref.std(0), rtol=1e-10)
        assert s.count == ref.shape[0]


def test_minmax_stats_and_range():
    ds = _raw()
    norm = Normalizer.fit(ds, ["forces"], method="minmax")
    ref = _stack(ds, "forces", 3)
    np.testing.assert_allclose(norm.stats["forces"].shift, ref.min(0))
    np.testing.assert_allclose(norm.stats["forces"].scale, ref.max(0) - ref.min(0))
    out = torch.cat([norm.apply(d)["forces"] for d in ds])
    assert out.min() >= -1e-6 and out.max() <= 1 + 1e-6


def test_apply_invert_round_trip_and_input_untouched():
    ds = _raw()
    norm = Normalizer.fit(
        ds, ["energy", "forces", "const"], method={"energy": "standard", "forces": "minmax", "const": "standard"}
    )
    before = ds[3].forces.clone()
    out = norm.apply(ds[3], index=3)
    assert torch.equal(ds[3].forces, before) and out is not ds[3]
    assert out.energy.dtype == torch.float64 and out.forces.dtype == torch.float32
    assert not torch.allclose(out.forces, before)
    back = norm.invert(out)
    for name in ("energy", "forces", "const"):
        torch.testing.assert_close(back[name], ds[3][name])
    torch.testing.assert_close(norm.invert(out.forces, "forces"), before)


def test_constant_column_gets_scale_one():
    norm = Normalizer.fit(_raw(), ["const"])
    assert norm.stats["const"].shift == (7.0,) and norm.stats["const"].scale == (1.0,)
    assert torch.all(norm.apply(_raw()[0])["const"] == 0)


def test_normalized_data_has_zero_mean_unit_std():
    ds = _raw(30)
    norm = Normalizer.fit(ds, ["forces"])
    allf = torch.cat([norm.apply(d)["forces"] for d in ds]).double()
    torch.testing.assert_close(allf.mean(0), torch.zeros(3, dtype=torch.float64), atol=1e-6, rtol=0)
    torch.testing.assert_close(allf.std(0, unbiased=False), torch.ones(3, dtype=torch.float64), atol=1e-6, rtol=0)


def test_per_atom_energy():
    ds = _raw()
    norm = Normalizer.fit(ds, ["energy"], per_atom=["energy"])
    per_atom = np.array([d.energy.item() / d.num_nodes for d in ds])
    np.testing.assert_allclose(norm.stats["energy"].shift, [per_atom.mean()])
    np.testing.assert_allclose(norm.stats["energy"].scale, [per_atom.std()])
    normed = [norm.apply(d) for d in ds]
    torch.testing.assert_close(norm.invert(normed[0])["energy"], ds[0].energy)
    batch = Batch.from_data_list(normed[:4])
    torch.testing.assert_close(norm.invert(batch, "energy")["energy"], torch.cat([d.energy for d in ds[:4]]))
    counts = torch.tensor([d.num_nodes for d in ds[:4]])
    torch.testing.assert_close(
        norm.invert(batch.energy, "energy", num_nodes=counts), torch.cat([d.energy for d in ds[:4]])
    )
    with pytest.raises(DataError, match="num_nodes"):
        norm.invert(batch.energy, "energy")
    with pytest.raises(DataError, match="one row per graph"):
        Normalizer.fit(ds, ["forces"], per_atom=["forces"])


def test_dict_round_trip_is_json():
    ds = _raw()
    norm = Normalizer.fit(ds, ["energy", "forces"], per_atom=["energy"])
    d = json.loads(json.dumps(norm.to_dict()))
    assert d["format_version"] == 1 and set(d["variables"]) == {"energy", "forces"}
    again = Normalizer.from_dict(d)
    assert again.stats == norm.stats
    torch.testing.assert_close(again.apply(ds[0]).forces, norm.apply(ds[0]).forces)


@pytest.mark.parametrize(
    ("d", "match"),
    [
        ({"variables": {}}, "format_version"),
        ({"format_version": 2, "variables": {}}, "format_version: this reader handles 1..1"),
        ({"format_version": 1, "variables": {"e": {"method": "standard"}}}, r"normalization\.variables\.e"),
        (
            {
                "format_version": 1,
                "variables": {"e": {"method": "log", "shift": [0.0], "scale": [1.0], "per_atom": False, "count": 1}},
            },
            "method",
        ),
        (
            {
                "format_version": 1,
                "variables": {
                    "e": {"method": "standard", "shift": [0.0], "scale": [0.0], "per_atom": False, "count": 1}
                },
            },
            "scale",
        ),
        ([], "normalization"),
    ],
)
def test_from_dict_errors(d, match):
    with pytest.raises(DataError, match=match):
        Normalizer.from_dict(d)


def test_missing_name_errors_name_sample_and_variable():
    ds = _raw(4)
    del ds[2].forces
    with pytest.raises(DataError, match="sample 2: normalized tensor 'forces' is missing"):
        Normalizer.fit(ds, ["forces"])
    norm = Normalizer.fit(_raw(4), ["forces"])
    with pytest.raises(DataError, match="sample 2: normalized tensor 'forces' is missing"):
        norm.apply(ds[2], index=2)


def test_fit_errors():
    with pytest.raises(DataError, match="method"):
        Normalizer.fit(_raw(2), ["energy"], method="zscore")
    with pytest.raises(DataError, match="names"):
        Normalizer.fit(_raw(2), [])
    with pytest.raises(DataError, match="no values"):
        Normalizer.fit([], ["energy"])
    bad = _raw(2)
    bad[1].energy = torch.tensor([[float("nan")]])
    with pytest.raises(DataError, match="sample 1: 'energy' holds non-finite"):
        Normalizer.fit(bad, ["energy"])
    with pytest.raises(DataError, match="columns|column"):
        Normalizer.fit(_raw(2), ["forces"]).invert(torch.zeros(4, 2), "forces")


def test_prepared_samples_need_schema():
    ds = _raw()
    norm = Normalizer.fit(ds, ["energy"])
    prepared = prepare(ds[0], SCHEMA, index=0)
    with pytest.raises(DataError, match="already prepared"):
        norm.apply(prepared, index=0)
    out = norm.apply(prepared, schema=SCHEMA)
    s = norm.stats["energy"]
    expected = (ds[0].energy - s.shift[0]) / s.scale[0]
    torch.testing.assert_close(out.graph_output[:, :1], expected)
    torch.testing.assert_close(out.y[:1], expected.reshape(1, 1))


@pytest.mark.parametrize("fmt", ["pickle", "pt", "adios"])
def test_stats_stored_with_the_dataset_undo_after_loading(tmp_path, fmt):
    """The statistics travel inside the container; a reader rebuilds the normalizer and inverts."""
    if fmt == "adios":
        pytest.importorskip("adios2")
    from hydragnn.data.containers import open_dataset, write_dataset

    raw = _raw(8)
    norm = Normalizer.fit(raw, ["energy", "forces"], per_atom=["energy"])
    prepared = [norm.apply(s, index=i, schema=SCHEMA) for i, s in enumerate(raw)]
    path = write_dataset(tmp_path / "ds", prepared, fmt, schema=SCHEMA, normalization=norm.to_dict())
    del norm  # only what is on disk from here on

    ds = open_dataset(path)
    loaded = Normalizer.from_dict(ds.normalization)
    for i in (5, 0, 7):
        sample = ds[i]
        assert not torch.allclose(sample.forces, raw[i].forces)  # stored normalized
        back = loaded.invert(sample)
        torch.testing.assert_close(back.energy, raw[i].energy, rtol=1e-12, atol=1e-9)
        torch.testing.assert_close(back.forces, raw[i].forces)
        # a prediction of the normalized target (here the stored one) maps back to physical units
        energy = loaded.invert(sample.graph_output[:, :1], "energy", num_nodes=sample.num_nodes)
        torch.testing.assert_close(energy, raw[i].energy, rtol=1e-12, atol=1e-9)

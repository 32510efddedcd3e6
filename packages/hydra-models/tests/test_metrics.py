"""hydragnn.models.metrics: the errors every scoring command reports, against numpy."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from hydragnn.models import ModelError
from hydragnn.models.metrics import ErrorStats, error_report, format_errors, jsonable, training_label_keys


def _data(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    natoms = torch.tensor([3, 5, 4])
    trues = {"energy": torch.randn(3, 1, generator=g), "forces": torch.randn(12, 3, generator=g)}
    preds = {k: v + 0.1 * torch.randn(v.shape, generator=g) for k, v in trues.items()}
    return trues, preds, natoms


def test_errors_per_head_in_units_and_per_atom():
    trues, preds, natoms = _data()
    report = error_report(trues, preds, natoms, totals=("energy",))
    d_energy = (preds["energy"] - trues["energy"]).double().numpy().ravel()
    d_forces = (preds["forces"] - trues["forces"]).double().numpy().ravel()
    per_atom = d_energy / natoms.numpy()
    assert report["energy"]["mae"] == pytest.approx(np.abs(per_atom).mean())
    assert report["energy"]["rmse"] == pytest.approx(np.sqrt((per_atom**2).mean()))
    assert report["energy_total"]["mae"] == pytest.approx(np.abs(d_energy).mean())
    assert (report["energy"]["unit"], report["energy_total"]["unit"]) == ("eV/atom", "eV")
    assert report["forces"] == {
        "mae": pytest.approx(np.abs(d_forces).mean()),
        "rmse": pytest.approx(np.sqrt((d_forces**2).mean())),
        "unit": "eV/Å",
        "count": 12,
    }
    assert list(report) == ["energy", "energy_total", "forces"]


def test_running_sums_equal_all_rows_at_once():
    trues, preds, natoms = _data(1)
    stats = ErrorStats()
    stats.add({"energy": trues["energy"][:1]}, {"energy": preds["energy"][:1]}, natoms[:1])
    stats.add({"energy": trues["energy"][1:]}, {"energy": preds["energy"][1:]}, natoms[1:])
    whole = error_report({"energy": trues["energy"]}, {"energy": preds["energy"]}, natoms)
    assert stats.report()["energy"]["mae"] == pytest.approx(whole["energy"]["mae"], rel=1e-12)
    assert stats.report()["energy"]["count"] == 3


def test_mismatches_are_errors_naming_the_head():
    trues, preds, natoms = _data()
    with pytest.raises(ModelError, match="'forces'.*differ in shape"):
        error_report(trues, {**preds, "forces": preds["forces"][:5]}, natoms)
    with pytest.raises(ModelError, match="'gap': no predictions"):
        error_report({"gap": torch.zeros(3)}, preds, natoms)


def test_table_and_json():
    report = {
        "energy": {"mae": 0.0041, "rmse": 0.0055, "unit": "eV/atom", "count": 3},
        "x": {"mae": math.nan, "unit": ""},
    }
    lines = format_errors(report)
    assert lines[0].split() == ["head", "MAE", "RMSE", "unit"]
    assert lines[1].split() == ["energy", "0.0041", "0.0055", "eV/atom"]
    assert json.loads(json.dumps(jsonable({"a": [math.inf, 1.0], "b": math.nan}), allow_nan=False)) == {
        "a": [None, 1.0],
        "b": None,
    }


def test_training_label_keys_of_the_served_source():
    class Head:
        default_head = 1

    class Model:
        energy_head_names = ["dft", "emt"]
        energy_head = Head()
        manifest = {
            "extra": {
                "config": {
                    "Dataset": {
                        "sources": [
                            {"name": "dft", "energy_key": "E_dft"},
                            {"name": "emt", "energy_key": "E_emt", "forces_key": "F_emt", "keys": {"gap": "REF_gap"}},
                        ]
                    }
                }
            }
        }

    keys = training_label_keys(Model())
    assert keys == {"energy_key": "E_emt", "forces_key": "F_emt", "extra_keys": (("gap", "REF_gap"),)}
    assert training_label_keys(object()) == {}

"""torch-sim adapter: torch-sim's own validator, and forces / stress equal to the calculator's."""

from __future__ import annotations

import pytest
import torch

ts = pytest.importorskip("torch_sim")

from ase.build import bulk  # noqa: E402
from torch_sim.models.interface import validate_model_outputs  # noqa: E402

from hydragnn.infer import HydraCalculator  # noqa: E402


def test_validate_model_outputs(model64):
    from hydragnn.infer import HydraTorchSimModel

    model = HydraTorchSimModel(HydraCalculator(model64))
    validate_model_outputs(model, torch.device("cpu"), torch.float64)


def test_matches_calculator(model64):
    from hydragnn.infer import HydraTorchSimModel

    calc = HydraCalculator(model64)
    model = HydraTorchSimModel(calc)
    systems = [bulk("Cu", "fcc", a=3.6, cubic=True).repeat(2), bulk("Au", "fcc", a=4.1, orthorhombic=True)]
    systems[0].rattle(0.05, seed=1)
    state = ts.io.atoms_to_state(systems, torch.device("cpu"), torch.float64)
    out = model(state)
    for i, atoms in enumerate(systems):
        ref = calc(atoms.positions, atoms.numbers, cell=atoms.cell.array, forces=True, stress=True)
        torch.testing.assert_close(out["energy"][i], ref["energy"][0])
        sel = state.system_idx == i
        torch.testing.assert_close(out["forces"][sel], ref["forces"])
        torch.testing.assert_close(out["stress"][i], ref["stress"][0])

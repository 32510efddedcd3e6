"""The calculator's execution profile: its backends run on a view of the model that shares the
weights, the model given is untouched, every profile answers as the reference does."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from ase.build import bulk

from hydragnn.data import Schema
from hydragnn.data.emt import CUAU_VARIABLES
from hydragnn.infer import HydraCalculator, InferenceError
from hydragnn.models import build_model
from hydragnn.models.execution import Execution
from hydragnn.models.nn import Primitive


def _potential(encoder: str):
    arch = {
        "mpnn_type": encoder,
        "hidden_dim": 8,
        "num_conv_layers": 2,
        "radius": 3.0,
        "num_radial": 6,
        "enable_interatomic_potential": True,
        "output_heads": {"node": {"num_headlayers": 1}},
    }
    torch.manual_seed(0)
    return build_model(arch, Schema.from_dict(CUAU_VARIABLES)).double()


def _cell(rattle: float):
    atoms = bulk("Cu", "fcc", a=3.6, cubic=True).repeat((2, 1, 1))
    atoms.rattle(rattle, seed=1)
    numbers = atoms.numbers.copy()
    numbers[::3] = 79
    return atoms.positions, numbers, np.asarray(atoms.cell)


def _backends(model) -> set[str]:
    return {m.backend for m in model.modules() if isinstance(m, Primitive)}


@pytest.mark.parametrize(("encoder", "backend"), [("SchNet", "distinct"), ("MACE", "dense")])
def test_the_default_profile_answers_as_the_reference_and_leaves_the_model_alone(encoder, backend):
    model = _potential(encoder)
    calc, ref = HydraCalculator(model), HydraCalculator(model, execution="reference")
    assert calc.execution is Execution.cpu() and ref.execution is Execution.reference()
    assert backend in _backends(calc.eager_model) and _backends(model) == {"torch"}
    assert any(backend in counts for counts in calc.execution_report["primitives"].values())
    for rattle in (0.0, 0.05):  # an ideal lattice (repeated lengths) and a rattled cell
        pos, numbers, cell = _cell(rattle)
        for forces in (False, True):
            got = calc(pos, numbers, cell=cell, forces=forces)
            want = ref(pos, numbers, cell=cell, forces=forces)
            for key in want:
                torch.testing.assert_close(got[key], want[key], rtol=1e-9, atol=1e-10)


def test_weight_updates_of_the_model_reach_the_view():
    model = _potential("SchNet")
    calc = HydraCalculator(model)
    pos, numbers, cell = _cell(0.05)
    before = calc(pos, numbers, cell=cell)["energy"]
    with torch.no_grad():
        next(model.parameters()).add_(0.1)
    after = calc(pos, numbers, cell=cell)["energy"]
    assert not torch.equal(before, after)
    torch.testing.assert_close(after, HydraCalculator(model, execution="reference")(pos, numbers, cell=cell)["energy"])


@pytest.mark.parametrize("bad", ["fast", 3])
def test_an_unknown_profile_is_refused_by_name(bad):
    with pytest.raises(InferenceError, match="execution: unknown execution profile"):
        HydraCalculator(_potential("SchNet"), execution=bad)

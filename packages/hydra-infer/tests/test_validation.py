"""Input validation: every bad input gives an InferenceError naming the argument."""

from __future__ import annotations

import numpy as np
import pytest
from infer_helpers import CUTOFF, cluster

from hydragnn.infer import HydraCalculator, InferenceError


@pytest.fixture(scope="module")
def calc(model64):
    return HydraCalculator(model64, species=[29, 79])


POS, Z = cluster(4)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"coord": POS[:, :2]}, r"coord: expected \[N, 3\]"),
        ({"coord": POS[None, None]}, r"coord: expected \[N, 3\]"),
        ({"numbers": Z[:3]}, r"numbers: expected \(4,\)"),
        ({"coord": POS[None], "numbers": Z}, r"numbers: expected \(1, 4\)"),
        ({"numbers": Z * 0.5}, r"numbers: expected integers"),
        ({"numbers": np.array([29, 0, 29, 29])}, "padding"),
        ({"mol_idx": [0, 1, 0, 1]}, "mol_idx: expected sorted"),
        ({"mol_idx": [0, 0, 1]}, "mol_idx: expected one entry per atom"),
        ({"mol_idx": [0, 0, 1, 10**9]}, r"mol_idx: indices up to 1000000000 for 4 atoms would make"),
        ({"cell": np.eye(2)}, r"cell: expected \[3, 3\]"),
        ({"cell": 10 * np.eye(3), "pbc": [True, False]}, r"pbc: expected \[3\]"),
        ({"pbc": [True, True, True]}, "cell: periodic boundary conditions"),
        ({"charge": [1.0, 2.0]}, "charge: expected a scalar"),
        ({"cell": np.full((3, 3), np.nan)}, "cell: expected finite"),
    ],
)
def test_shape_and_value_errors(calc, kwargs, match):
    args = {"coord": POS, "numbers": Z, **kwargs}
    with pytest.raises(InferenceError, match=match):
        calc(**args)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_coordinates(calc, bad):
    pos = POS.copy()
    pos[2, 1] = bad
    with pytest.raises(InferenceError, match=r"coord: expected finite coordinates.*\[2\]"):
        calc(pos, Z)


def test_unknown_species(calc, model64):
    with pytest.raises(
        InferenceError, match=r"numbers: species \[8\] were not in the model's training species \[29, 79\]"
    ):
        calc(POS, np.array([29, 8, 79, 29]))
    free = HydraCalculator(model64)  # no species list: the embedding bounds the atomic numbers
    free(POS, np.array([29, 8, 79, 29]))
    with pytest.raises(InferenceError, match="outside the model's species embedding"):
        free(POS, np.array([29, 200, 79, 29]))


def test_inference_error_is_a_value_error():
    assert issubclass(InferenceError, ValueError)


def test_cell_too_small_for_cutoff(calc):
    # cutoff 4 Å, max_cell_images 8: widths below 0.5 Å are refused (e.g. a cell given in nm)
    with pytest.raises(
        InferenceError,
        match=r"cell: too small for the cutoff 4 Å: structure 0 .*0.36 Å along periodic lattice vector 0",
    ):
        calc(POS * 0.1, Z, cell=np.diag([0.36, 0.5, 0.5]))
    calc(POS * 0.1, Z, cell=np.diag([0.5, 0.5, 0.5]))  # 8 images per direction is allowed
    tight = HydraCalculator(calc.model, species=[29, 79], max_cell_images=2)
    with pytest.raises(InferenceError, match="max_cell_images=2"):
        tight(POS, Z, cell=np.diag([1.9, 10.0, 10.0]))
    # a thin direction that is not periodic is fine
    calc(POS, Z, cell=np.diag([10.0, 10.0, 0.0]), pbc=[True, True, False])
    assert CUTOFF == 4.0


def test_singular_cell(calc):
    cell = np.array([[3.0, 0, 0], [0, 3.0, 0], [3.0, 3.0, 0]])
    with pytest.raises(
        InferenceError, match="cell: graph 0 has a singular cell.*expected linearly independent lattice vectors"
    ):
        calc(POS, Z, cell=cell)


def test_stress_and_forces_requests(calc):
    with pytest.raises(InferenceError, match="stress: requested for a structure without a periodic cell"):
        calc(POS, Z, stress=True)


def test_unsupported_model():
    from infer_helpers import tiny_model

    variables = {
        "inputs": [
            {"name": "atomic_number", "level": "node", "dim": 1},
            {"name": "spin", "level": "node", "dim": 1},
            {"name": "pos", "level": "node", "dim": 3, "role": "position"},
        ],
        "outputs": [{"name": "energy", "level": "graph", "dim": 1}, {"name": "forces", "level": "node", "dim": 3}],
    }
    with pytest.raises(InferenceError, match="model: expected exactly one node input"):
        HydraCalculator(tiny_model(variables=variables))
    with pytest.raises(InferenceError, match="model_or_artifact: expected a HydraModel"):
        HydraCalculator(object())


@pytest.mark.parametrize("species", [["Cu", "Au"], [29, 3.5], "CuAu", [True]])
def test_a_manifest_species_that_is_not_atomic_numbers_is_refused(model64, species):
    from hydragnn.infer.model_info import model_info

    manifest = dict(getattr(model64, "manifest", None) or {})
    saved = getattr(model64, "manifest", None)
    model64.manifest = {**manifest, "species": species}
    try:
        with pytest.raises(InferenceError, match="'species' must be a list of atomic numbers"):
            model_info(model64)
    finally:
        model64.manifest = saved

"""One structure validation for every entry point: species, finite values, cells too small for the cutoff."""

from __future__ import annotations

import pytest
import torch
from torch_geometric.data import Data

from hydragnn.data import DataError, Schema, prepare
from hydragnn.data.emt import CUAU_VARIABLES, generate_cuau
from hydragnn.data.neighbors import radius_graph
from hydragnn.data.validation import MAX_ATOMIC_NUMBER, StructureError, check_cell_size, check_species


@pytest.mark.parametrize(
    "numbers, kwargs, message",
    [
        (torch.tensor([29, 150]), {}, r"atomic numbers \[150\] are outside elements \(expected 1..118\)"),
        (torch.tensor([29, 0]), {}, r"atomic numbers \[0\] are outside elements"),
        (torch.tensor([-3, 29]), {}, r"atomic numbers \[-3\]"),
        (torch.tensor([29.0, 2.5]), {}, r"expected integer atomic numbers, found \[2.5\]"),
        (torch.tensor([29.0, float("nan")]), {}, r"expected integer atomic numbers"),
        (torch.tensor([29, 80]), {"limit": 80}, r"\[80\] are outside the model's species embedding \(expected 1..79\)"),
    ],
)
def test_bad_species(numbers, kwargs, message):
    with pytest.raises(StructureError, match=message):
        check_species(numbers, "sample 3: 'atomic_number'", **kwargs)


def test_good_species_and_padding():
    check_species(torch.tensor([1, 29, MAX_ATOMIC_NUMBER]), "x")
    check_species(torch.tensor([[29.0], [79.0]]), "x")
    check_species(torch.tensor([[29, 0], [79, 79]]), "x", padding=True)
    assert issubclass(StructureError, DataError) and issubclass(StructureError, ValueError)


def _cuau_sample(index: int = 0) -> Data:
    return generate_cuau(4, seed=0)[index]


def test_prepare_refuses_unknown_species_naming_the_sample():
    sample = _cuau_sample()
    sample.atomic_number = sample.atomic_number.clone()
    sample.atomic_number[5] = 150
    with pytest.raises(StructureError, match=r"sample 7: 'atomic_number': atomic numbers \[150\]"):
        prepare(sample, Schema.from_dict(CUAU_VARIABLES), index=7)
    sample = _cuau_sample()
    sample.pos = sample.pos.clone()
    sample.pos[2, 1] = float("inf")
    with pytest.raises(
        StructureError, match=r"sample 1: 'pos': expected finite positions, found NaN or inf \(rows \[2\]\)"
    ):
        prepare(sample, Schema.from_dict(CUAU_VARIABLES), index=1)


def test_a_cell_twenty_times_too_small_is_refused_before_the_search():
    sample = _cuau_sample()
    cell = sample.cell.reshape(3, 3) / 20  # nm typed as Å, say: ~0.36 Å wide
    with pytest.raises(StructureError, match=r"too small for the cutoff 5 Å.*max_cell_images=8"):
        radius_graph(sample.pos / 20, 5.0, cell=cell)
    edge_index, _ = radius_graph(sample.pos, 5.0, cell=sample.cell.reshape(3, 3))  # the real cell is fine
    assert edge_index.shape[1] > 0


def test_cell_size_rule_counts_periodic_directions_only():
    slab = torch.diag(torch.tensor([6.0, 6.0, 0.1], dtype=torch.float64)).unsqueeze(0)
    check_cell_size(slab, torch.tensor([[True, True, False]]), cutoff=5.0)  # the thin direction is not periodic
    with pytest.raises(StructureError, match="along periodic lattice vector 2"):
        check_cell_size(slab, torch.tensor([[True, True, True]]), cutoff=5.0)
    check_cell_size(slab, torch.tensor([[True, True, True]]), cutoff=5.0, max_cell_images=64)


def test_containers_check_samples_on_request(tmp_path):
    from hydragnn.data import open_dataset, write_dataset

    samples = [prepare(s, Schema.from_dict(CUAU_VARIABLES), index=i) for i, s in enumerate(generate_cuau(3, seed=0))]
    samples[2].atomic_number = samples[2].atomic_number.clone()
    samples[2].atomic_number[0] = 150
    path = write_dataset(tmp_path / "ds.pkl", samples, "pickle", schema=Schema.from_dict(CUAU_VARIABLES))
    assert int(open_dataset(path)[2].atomic_number[0]) == 150  # stored as written: loading is authoritative
    checked = open_dataset(path, validate=True)
    checked[1]
    with pytest.raises(StructureError, match=r"ds.pkl: sample 2: 'atomic_number': atomic numbers \[150\]"):
        checked[2]

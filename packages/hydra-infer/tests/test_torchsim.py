"""torch-sim adapter: torch-sim's own validator, forces / stress equal to the calculator's, MD with
neighbour-list reuse equal to a search per step, and ``check_model`` on good and broken models.

MD measurement (untrained fp64 SchNet, cutoff 4 Å, a 32-atom Cu cell and a 32-atom Cu-Au cell in
one state, 2 fs, 300 K, 20 steps, seed 0; skin 0.5 Å): NVE and Langevin NVT 3 builds and 18 reuses
for 21 calls, Langevin NPT (two calls per step) 2 builds and 39 reuses; every energy and force
bit-equal to skin 0's. While wrapped positions counted as moved, Langevin NVT on a 108-atom Cu
cell (1 fs, ``ts.integrate``) searched on 12 of 22 calls; now on 1.
"""

from __future__ import annotations

import pytest
import torch

ts = pytest.importorskip("torch_sim")

from ase.build import bulk  # noqa: E402
from infer_helpers import tiny_model  # noqa: E402
from torch_sim.models.interface import ModelInterface, validate_model_outputs  # noqa: E402

from hydragnn.infer import HydraCalculator, InferenceError  # noqa: E402
from hydragnn.infer.torchsim import HydraTorchSimModel, check_model  # noqa: E402
from hydragnn.models import save_artifact  # noqa: E402

STEPS = 20


def test_validate_model_outputs(model64):
    """torch-sim's validator builds Si and Fe: it runs on a model without a species list."""
    model = HydraTorchSimModel(HydraCalculator(model64))
    validate_model_outputs(model, torch.device("cpu"), torch.float64)


def test_matches_calculator(model64):
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


def _md(model64, cuau_atoms, integrator: str, skin: float) -> tuple[list[tuple[torch.Tensor, ...]], dict]:
    """Energies, forces and cells of every step of a torch-sim run on a Cu cell and a Cu-Au cell."""
    model = HydraTorchSimModel(model64, skin=skin)
    systems = [bulk("Cu", "fcc", a=3.6, cubic=True).repeat(2), cuau_atoms[0]]
    state = ts.io.atoms_to_state(systems, torch.device("cpu"), torch.float64)
    units = ts.units.MetalUnits
    kwargs = {"external_pressure": torch.tensor(0.0, dtype=torch.float64)} if integrator == "npt_langevin" else {}
    init, update = getattr(ts.integrators, integrator)(
        model,
        dt=torch.tensor(0.002 * units.time, dtype=torch.float64),
        kT=torch.tensor(300 * units.temperature, dtype=torch.float64),
        seed=0,
        **kwargs,
    )
    torch.manual_seed(0)  # the Langevin noise
    state = init(state)
    steps = [(state.energy.clone(), state.forces.clone(), state.cell.clone())]
    for _ in range(STEPS):
        state = update(state)
        steps.append((state.energy.clone(), state.forces.clone(), state.cell.clone()))
    return steps, model.hydra.neighbor_stats


@pytest.mark.parametrize("integrator", ["nve", "nvt_langevin", "npt_langevin"])
def test_md_reuses_lists_with_fresh_results(model64, cuau_atoms, integrator):
    """torch-sim wraps positions into the cell every step (and NPT strains it): lists are still
    reused, and every step's energies and forces are those of a search per call, bit for bit."""
    reused, stats = _md(model64, cuau_atoms, integrator, skin=0.5)
    fresh, fresh_stats = _md(model64, cuau_atoms, integrator, skin=0.0)
    for (e1, f1, c1), (e0, f0, c0) in zip(reused, fresh, strict=True):
        assert torch.equal(c1, c0)
        assert torch.equal(e1, e0)
        assert torch.equal(f1, f0)
    calls = fresh_stats["builds"]
    assert fresh_stats["reuses"] == 0
    assert stats["builds"] + stats["reuses"] == calls
    assert stats["reuses"] > 4 * stats["builds"], stats
    if integrator == "npt_langevin":
        assert not torch.equal(reused[-1][2], reused[0][2])  # the cell did change


def test_check_model_passes_where_the_validator_cannot(model64, tmp_path):
    """A Cu-Au model fails torch-sim's validator on species alone; check_model runs on its own species."""
    path = save_artifact(model64, tmp_path / "cuau.hydra", species=[29, 79])
    with pytest.raises(InferenceError, match="species"):
        validate_model_outputs(HydraTorchSimModel(path), torch.device("cpu"), torch.float64)
    report = check_model(path)
    assert report["checks"] == ["interface", "outputs", "state", "batch", "forces", "stress"]
    assert report["species"] == [29, 79] and report["skipped"] == {}
    assert report["max_force_error"] < 1e-6 and report["max_stress_error"] < 1e-6


def test_check_model_float32_and_without_stress():
    model = tiny_model(precision="fp32")
    report = check_model(HydraTorchSimModel(model, compute_stress=False), species=[29, 79])
    assert report["dtype"] == "torch.float32"
    assert report["checks"] == ["interface", "outputs", "state", "batch", "forces"]
    assert report["skipped"] == {"stress": "compute_stress is False"}


class _Broken(ModelInterface):
    """A HydraTorchSimModel with one defect."""

    def __init__(self, inner: HydraTorchSimModel, defect: str) -> None:
        super().__init__()
        self.inner, self.defect = inner, defect
        self._device, self._dtype = inner.device, inner.dtype
        self._compute_forces, self._compute_stress = inner.compute_forces, inner.compute_stress

    def forward(self, state, **kwargs):
        out = dict(self.inner(state))
        if self.defect == "forces":
            out["forces"] = -out["forces"]
        elif self.defect == "stress" and "stress" in out:
            out["stress"] = -out["stress"]
        elif self.defect == "batch":
            out["energy"] = out["energy"] + 0.01 * state.n_systems
        elif self.defect == "state":
            state.positions.add_(1e-3)
        elif self.defect == "outputs":
            out["energy"] = out["energy"].unsqueeze(-1)
        return out


@pytest.mark.parametrize("defect", ["forces", "stress", "batch", "state", "outputs"])
def test_check_model_names_the_failed_check(model64, defect):
    broken = _Broken(HydraTorchSimModel(model64), defect)
    with pytest.raises(InferenceError, match=f"check_model: {defect}:"):
        check_model(broken, species=[29, 79])


def test_check_model_needs_species_for_other_models(model64):
    with pytest.raises(InferenceError, match="check_model: species:"):
        check_model(_Broken(HydraTorchSimModel(model64), "none"))

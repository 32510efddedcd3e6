"""A NaN or inf from the potential stops an MD run in ASE and torch-sim, naming the call and the
atoms, before any position becomes NaN (the LAMMPS drivers: tests/test_lammps.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from ase import units
from ase.md.verlet import VelocityVerlet

from hydragnn.infer import HydraASECalculator, HydraCalculator
from hydragnn.infer.finite import NonFiniteOutput, require_finite

BAD_ATOMS = [3, 17]


class Poisoned(HydraCalculator):
    """A calculator whose forces on :data:`BAD_ATOMS` become NaN from its ``after``-th call on."""

    def __init__(self, model, after: int, value: float = float("nan")) -> None:
        super().__init__(model)
        self.after, self.value, self.calls = after, value, 0

    def __call__(self, *args, **kwargs):
        out = super().__call__(*args, **kwargs)
        self.calls += 1
        if self.calls >= self.after and "forces" in out:
            out["forces"][BAD_ATOMS] = self.value
        return out


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_ase_md_stops_naming_the_calculation_and_atoms(model64, cuau_atoms, value):
    atoms = cuau_atoms[0].copy()
    atoms.calc = HydraASECalculator(Poisoned(model64, after=4, value=value))
    dyn = VelocityVerlet(atoms, timestep=1.0 * units.fs)
    with pytest.raises(NonFiniteOutput) as info:
        dyn.run(10)
    message = str(info.value)
    symbols = atoms.get_chemical_symbols()
    assert "HydraASECalculator, calculation 4" in message
    assert f"non-finite forces (NaN or inf) on 2 of {len(atoms)} atoms" in message
    assert f"atoms 3 ({symbols[3]}), 17 ({symbols[17]})" in message
    assert info.value.atoms == BAD_ATOMS and info.value.output == "forces"
    assert np.isfinite(atoms.positions).all()


def test_torchsim_md_stops_naming_the_call_and_atoms(model64, cuau_atoms):
    ts = pytest.importorskip("torch_sim")
    from hydragnn.infer.torchsim import HydraTorchSimModel

    model = HydraTorchSimModel(Poisoned(model64, after=3))
    state = ts.io.atoms_to_state([cuau_atoms[0]], torch.device("cpu"), torch.float64)
    mu = ts.units.MetalUnits
    init, update = ts.integrators.nve(
        model,
        dt=torch.tensor(0.002 * mu.time, dtype=torch.float64),
        kT=torch.tensor(300 * mu.temperature, dtype=torch.float64),
        seed=0,
    )
    state = init(state)
    with pytest.raises(NonFiniteOutput, match=r"HydraTorchSimModel, call 3: .* on 2 of 32 atoms, atoms 3, 17;"):
        for _ in range(10):
            state = update(state)
    assert torch.isfinite(state.positions).all()


def test_other_outputs_are_named_alone_and_finite_values_pass():
    require_finite("here", {"forces": np.zeros((4, 3))}, {"energy": 1.0, "stress": torch.zeros(3, 3)})
    with pytest.raises(
        NonFiniteOutput, match=r"here: the potential returned a non-finite energy \(NaN or inf: \[nan\]\)"
    ):
        require_finite("here", {"forces": np.zeros((4, 3))}, {"energy": float("nan")})
    forces = np.zeros((30, 3))
    forces[:12, 1] = np.inf
    with pytest.raises(NonFiniteOutput, match=r"on 12 of 30 atoms, LAMMPS atom ids 101, 102, .*, 110, ... and 2 more;"):
        require_finite("there", {"forces": forces}, atom_ids=np.arange(101, 131), id_name="LAMMPS atom id")

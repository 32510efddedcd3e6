"""Learning test: every encoder learns EMT Cu-Au energies and forces on one CPU core.

48 training / 16 test structures of the ``CuAu_32atoms`` reference set (32 atoms each),
20 epochs of Adam (batch 4, lr 1e-2, cosine decay), loss through ``HydraModel.loss`` with
``task_weights`` (total-energy MSE weighted 3/32² = per-atom MSE x 3, forces MSE x 1, the
per-atom energy target unused). Errors are measured on the held-out structures.

Measured (torch 2.13 CPU, 1 thread, seed 0):

========  ==================  ================  ==========================
encoder   energy MAE eV/atom  force MAE eV/Å    time
========  ==================  ================  ==========================
baseline  0.0210 (mean)       0.417 (zero)
SchNet    0.0048              0.040             3 s (10 s on a busy machine)
========  ==================  ================  ==========================

Thresholds below sit about 1.7x above the measurement; every encoder must also beat half the
predict-the-mean energy error and a quarter of the predict-zero force error. An encoder class may
set ``learning_config = {...}`` (``Architecture`` keys overriding this recipe, after its
``conformance_config``); record its measurement and thresholds here.
"""

from __future__ import annotations

import pytest
import torch
from graphs import collate, with_edges

from hydragnn.data import Schema, prepare
from hydragnn.data.reference import CUAU_VARIABLES, generate_cuau
from hydragnn.models import ENCODERS, build_model

RADIUS = 4.0
N_ATOMS = 32
EPOCHS = 20
BATCH = 4
LR = 1e-2
# encoder -> (energy MAE eV/atom, force MAE eV/Å) thresholds, set from the measurements above.
THRESHOLDS: dict[str, tuple[float, float]] = {
    "SchNet": (0.008, 0.07),
}
BASELINE_FACTORS = (0.5, 0.25)


@pytest.fixture(scope="module")
def cuau():
    schema = Schema.from_dict(CUAU_VARIABLES)
    data = [with_edges(prepare(s, schema, index=i), RADIUS) for i, s in enumerate(generate_cuau(64, seed=0))]
    return schema, data[:48], data[48:]


def _composition(data) -> torch.Tensor:
    return torch.tensor(
        [[float((d.atomic_number == 29).sum()), float((d.atomic_number == 79).sum())] for d in data],
        dtype=torch.float64,
    )


def _errors(model, data) -> tuple[float, float]:
    model.eval()
    batch = collate(data)
    with torch.no_grad():
        out = model(batch)
    energy = float((out["energy"] - batch.energy).abs().mean()) / N_ATOMS
    forces = float((out["forces"] - batch.forces).abs().mean())
    return energy, forces


@pytest.mark.parametrize("encoder_name", sorted(THRESHOLDS))
def test_learns_emt_energy_and_forces(encoder_name, cuau):
    schema, train, test = cuau
    # per-species reference energies from a least-squares fit on the training set
    energies = torch.tensor([float(d.energy) for d in train], dtype=torch.float64)
    ref = torch.linalg.lstsq(_composition(train), energies.unsqueeze(-1)).solution.squeeze(-1)
    arch = {
        "mpnn_type": encoder_name,
        "hidden_dim": 16,
        "num_conv_layers": 2,
        "radius": RADIUS,
        "num_radial": 16,
        "enable_interatomic_potential": True,
        "reference_energies": {"29": float(ref[0]), "79": float(ref[1])},
        "output_heads": {"node": {"num_headlayers": 1}},
        "task_weights": [3.0 / N_ATOMS**2, 0.0, 1.0],
        "loss_function_type": "mse",
    }
    arch.update(getattr(ENCODERS[encoder_name], "conformance_config", {}))
    arch.update(getattr(ENCODERS[encoder_name], "learning_config", {}))
    torch.manual_seed(0)
    model = build_model(arch, schema)
    optimizer = torch.optim.Adam(model.parameters(), lr=LR)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, EPOCHS)
    generator = torch.Generator().manual_seed(0)
    first = last = None
    for _ in range(EPOCHS):
        model.train()
        order = torch.randperm(len(train), generator=generator).tolist()
        for start in range(0, len(train), BATCH):
            batch = collate([train[i] for i in order[start : start + BATCH]])
            loss, _ = model.loss(model(batch), batch)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            last = float(loss.detach())
            first = last if first is None else first
        scheduler.step()
    assert last < first

    test_batch = collate(test)
    mean_energy = float(torch.tensor([float(d.energy) for d in train]).mean()) / N_ATOMS
    base_energy = float((test_batch.energy / N_ATOMS - mean_energy).abs().mean())
    base_forces = float(test_batch.forces.abs().mean())
    energy_mae, force_mae = _errors(model, test)
    print(
        f"{encoder_name}: energy MAE {energy_mae:.4f} eV/atom (mean baseline {base_energy:.4f}), "
        f"force MAE {force_mae:.4f} eV/Å (zero baseline {base_forces:.4f})"
    )
    assert energy_mae < BASELINE_FACTORS[0] * base_energy
    assert force_mae < BASELINE_FACTORS[1] * base_forces
    if encoder_name in THRESHOLDS:
        e_max, f_max = THRESHOLDS[encoder_name]
        assert energy_mae < e_max, f"{encoder_name}: energy MAE {energy_mae:.4f} eV/atom >= {e_max}"
        assert force_mae < f_max, f"{encoder_name}: force MAE {force_mae:.4f} eV/Å >= {f_max}"

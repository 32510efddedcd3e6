"""Learning test: every encoder learns EMT Cu-Au energies and forces on one CPU core.

Recipe: 48 training / 16 test structures of the ``CuAu_32atoms`` reference set (32 atoms each),
20 epochs of Adam (batch 4, lr 1e-2, cosine decay), loss through ``HydraModel.loss`` (per-atom
energy MSE x 3, forces MSE x 1); errors on the held-out structures. Every encoder must beat half
the predict-the-mean energy error and a quarter of the predict-zero force error, and its
:data:`THRESHOLDS` entry (about 1.5x above its measurement) when it has one: a new encoder gets
the baseline criteria alone. :data:`LEARNING_ARCH` holds ``Architecture`` overrides and
:data:`RECIPES` ``epochs`` / ``lr`` / ``stress`` overrides for encoders that need them; encoders
in :data:`XFAIL` are strict xfails. The measurements behind the thresholds, and the settings
tried, are in ``docs/notes/encoder_learning.md``.
"""

from __future__ import annotations

import pytest
import torch

from hydragnn.data import Schema, prepare
from hydragnn.data.emt import CUAU_VARIABLES, generate_cuau
from hydragnn.models import build_model
from hydragnn.models.testing import REGISTERED_ENCODERS
from hydragnn.models.testing.graphs import collate, with_edges

RADIUS = 4.0
N_ATOMS = 32
EPOCHS = 20
BATCH = 4
LR = 1e-2
# encoder -> (energy MAE eV/atom, force MAE eV/Å) thresholds, set from the measurements above.
THRESHOLDS: dict[str, tuple[float, float]] = {
    "CGCNN": (0.0056, 0.10),
    "DimeNet": (0.0105, 0.037),
    "EGNN": (0.012, 0.082),
    "GAT": (0.012, 0.082),
    "GIN": (0.013, 0.059),
    "MACE": (0.013, 0.052),
    "MFC": (0.011, 0.057),
    "PAINN": (0.0056, 0.048),
    "PNA": (0.0135, 0.038),
    "PNAEq": (0.008, 0.059),
    "PNAPlus": (0.014, 0.047),
    "SAGE": (0.015, 0.104),
    "SchNet": (0.008, 0.07),
}
BASELINE_FACTORS = (0.5, 0.25)
# encoder -> recipe overrides ("epochs", "lr", "stress") for encoders that need them.
RECIPES: dict[str, dict[str, float]] = {"PNAPlus": {"lr": 5e-3}, "PNA": {"epochs": 60}}
# encoder -> Architecture overrides of the recipe (small widths / bases to fit the time budget,
# or the setting that learns; docs/notes/encoder_learning.md says why).
LEARNING_ARCH: dict[str, dict] = {
    "DimeNet": {
        "num_radial": 4,
        "num_spherical": 2,
        "int_emb_size": 16,
        "basis_emb_size": 4,
        "out_emb_size": 16,
        "triplet_capacity": None,
    },
    "GIN": {"hidden_dim": 32},
    "MACE": {"max_ell": 1, "correlation": 2, "radial_mlp_dim": 16},
    "PNA": {"radial_basis": "bessel", "cutoff_function": "polynomial", "residual": False},
    "PNAPlus": {"hidden_dim": 32},
    "UMA": {"lmax": 1, "mmax": 1, "hidden_dim": 32},
    "AllScAIP": {"max_neighbor_slots": 24},
}
# encoder -> why it does not reach the baseline criteria yet (strict xfail).
XFAIL: dict[str, str] = {}


STRESS_VARIABLES = {
    **CUAU_VARIABLES,
    "outputs": [*CUAU_VARIABLES["outputs"], {"name": "stress", "level": "graph", "dim": 6}],
}
"""The recipe's variables with the EMT stress (Voigt, eV/Å³) as a fourth output."""


def emt_split() -> tuple:
    """The recipe's data: (schema, 48 training, 16 test) EMT Cu-Au structures with edges.

    The samples carry the EMT stress too (a recipe with ``stress`` trains on it; the others'
    models do not declare it and ignore it).
    """
    schema = Schema.from_dict(CUAU_VARIABLES)
    stress_schema = Schema.from_dict(STRESS_VARIABLES)
    data = [with_edges(prepare(s, stress_schema, index=i), RADIUS) for i, s in enumerate(generate_cuau(64, seed=0))]
    return schema, data[:48], data[48:]


@pytest.fixture(scope="module")
def cuau():
    return emt_split()


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


def train_and_measure(encoder_name: str, train, test, arch_overrides: dict | None = None) -> dict:
    """Train ``encoder_name`` with the recipe (+ its :data:`LEARNING_ARCH` and :data:`RECIPES` entries).

    Returns the trained model, first/last training loss, test energy MAE (eV/atom), force MAE (eV/Å) and the
    predict-the-mean / predict-zero baselines; with a ``stress`` recipe also the test stress MAE
    and the predict-zero stress error (eV/Å³).
    """
    recipe = {"epochs": EPOCHS, "lr": LR, **RECIPES.get(encoder_name, {})}
    unknown = set(recipe) - {"epochs", "lr", "stress"}
    if unknown:
        raise ValueError(f"RECIPES[{encoder_name!r}]: unknown keys {sorted(unknown)} (epochs, lr, stress)")
    stress_weight = recipe.get("stress")
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
        "task_weights": [3.0, 0.0, 1.0] + ([float(stress_weight)] if stress_weight else []),
        "loss_function_type": "mse",
    }
    arch.update(LEARNING_ARCH.get(encoder_name, {}))
    arch.update(arch_overrides or {})
    torch.manual_seed(0)
    model = build_model(arch, Schema.from_dict(STRESS_VARIABLES if stress_weight else CUAU_VARIABLES))
    optimizer = torch.optim.Adam(model.parameters(), lr=recipe["lr"])
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, recipe["epochs"])
    generator = torch.Generator().manual_seed(0)
    first = last = None
    for _ in range(recipe["epochs"]):
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

    test_batch = collate(test)
    mean_energy = float(torch.tensor([float(d.energy) for d in train]).mean()) / N_ATOMS
    energy_mae, force_mae = _errors(model, test)
    stress = {}
    if stress_weight:
        model.eval()
        predicted = model(test_batch)["stress"].detach()
        target = test_batch.stress.view(-1, 6)
        stress = {"stress_mae": float((predicted - target).abs().mean()), "base_stress": float(target.abs().mean())}
    return {
        **stress,
        "model": model,
        "first_loss": first,
        "last_loss": last,
        "energy_mae": energy_mae,
        "force_mae": force_mae,
        "base_energy": float((test_batch.energy / N_ATOMS - mean_energy).abs().mean()),
        "base_forces": float(test_batch.forces.abs().mean()),
    }


@pytest.mark.parametrize(
    "encoder_name",
    [
        pytest.param(name, marks=pytest.mark.xfail(strict=True, reason=XFAIL[name])) if name in XFAIL else name
        for name in REGISTERED_ENCODERS
    ],
)
def test_learns_emt_energy_and_forces(encoder_name, cuau):
    _, train, test = cuau
    r = train_and_measure(encoder_name, train, test)
    energy_mae, force_mae = r["energy_mae"], r["force_mae"]
    print(
        f"{encoder_name}: energy MAE {energy_mae:.4f} eV/atom (mean baseline {r['base_energy']:.4f}), "
        f"force MAE {force_mae:.4f} eV/Å (zero baseline {r['base_forces']:.4f})"
    )
    assert r["last_loss"] < r["first_loss"]
    assert energy_mae < BASELINE_FACTORS[0] * r["base_energy"]
    assert force_mae < BASELINE_FACTORS[1] * r["base_forces"]
    e_max, f_max = THRESHOLDS.get(encoder_name, (float("inf"), float("inf")))
    assert energy_mae < e_max, f"{encoder_name}: energy MAE {energy_mae:.4f} eV/atom >= {e_max}"
    assert force_mae < f_max, f"{encoder_name}: force MAE {force_mae:.4f} eV/Å >= {f_max}"

"""``Architecture.zbl``: the ZBL repulsion any encoder carries. The conformance suite on two
encoders with it, its exact contribution against the plain model with the same weights, close
contacts, and the refusals. (Its pair energy is checked against LAMMPS's ``pair_style zbl`` in
hydra-infer's test_lammps.py.)"""

from __future__ import annotations

import pytest
import torch
from ase.data import covalent_radii

from hydragnn.models import ModelConfig, ModelConfigError, load_artifact, save_artifact
from hydragnn.models.locality import receptive_field
from hydragnn.models.nn.radial import PolynomialCutoff
from hydragnn.models.nn.zbl import ZBLRepulsion, zbl_pair_energy
from hydragnn.models.testing import CUTOFF, EncoderConformance, Tolerances, build, check_locality, register_variant
from hydragnn.models.testing.graphs import collate, periodic_samples, to_dtype, with_edges

PAINN = register_variant("PAINN+zbl", mpnn_type="PAINN", zbl=True)
SCHNET = register_variant("SchNet+zbl", mpnn_type="SchNet", zbl=True)
MACE = register_variant("MACE+zbl", mpnn_type="MACE", zbl=True)


@pytest.mark.parametrize("encoder_name", [PAINN, SCHNET])
class TestZBLConformance(EncoderConformance):
    """Invariance, forces vs finite differences, batching, padding, capture safety, artifacts, dtypes."""

    @pytest.fixture
    def conformance_tolerances(self) -> Tolerances:
        # the rattled Cu-Au samples hold pairs inside 2 x Cu's covalent radius, where the
        # repulsion curves far more steeply than the network: the central differences' h^2 error
        # (h = 1e-4 Å) reaches 4e-7 eV/Å there, so their forces are compared at 1e-6
        return Tolerances(finite_differences=(1e-5, 1e-6))


def _pair_terms(batch) -> torch.Tensor:
    """Each atom's half of ``V(r) f(r)`` over its incoming edges, written out pair by pair with
    the project's polynomial envelope at the sum of ASE's covalent radii."""
    z = batch.x[:, 0].long()
    pos = batch.pos.double()
    shift = getattr(batch, "edge_shift", None)
    out = torch.zeros(z.shape[0], dtype=torch.float64)
    for e in range(batch.edge_index.shape[1]):
        j, i = (int(v) for v in batch.edge_index[:, e])
        vec = pos[j] - pos[i] + (shift[e].double() if shift is not None else 0.0)
        r = vec.norm()
        cutoff = float(covalent_radii[z[i]] + covalent_radii[z[j]])
        if 0 < r < cutoff:
            v = zbl_pair_energy(z[i : i + 1], z[j : j + 1], r.reshape(1))
            out[i] += 0.5 * float(v * PolynomialCutoff(cutoff, p=6)(r.reshape(1)))
    return out


def _close_contacts_samples(cutoff: float = CUTOFF):
    """Periodic Cu-Au samples, the first atom of each moved onto a neighbour (0.6-1.0 Å away)."""
    samples = []
    for k, data in enumerate(periodic_samples(cutoff)[:3]):
        data = data.clone()
        data.pos[0] = data.pos[1] + torch.tensor([0.6 + 0.2 * k, 0.0, 0.0], dtype=data.pos.dtype)
        samples.append(with_edges(data, cutoff))
    return samples


def _close_contacts():
    return collate(_close_contacts_samples())


@pytest.mark.parametrize("name", [PAINN, MACE])
def test_the_repulsion_adds_exactly_its_pair_terms(name):
    """Same weights with and without ``zbl`` (it has none): the atomic energies differ by the
    pair terms written out, and close contacts push apart."""
    model = build(name).double()
    plain = build(name.split("+")[0]).double()
    plain.load_state_dict(model.state_dict())
    batch = _close_contacts()
    out, ref = model(batch), plain(batch)
    extra = _pair_terms(batch)
    assert float(extra.max()) > 1.0  # the contacts are close enough to matter (eV)
    torch.testing.assert_close(
        (out["atomic_energy"] - ref["atomic_energy"]).reshape(-1), extra.to(out["atomic_energy"].dtype)
    )
    starts = torch.cumsum(torch.bincount(batch.batch), 0) - torch.bincount(batch.batch)
    for s in starts.tolist():  # the moved atom (s) is pushed away from its partner (s + 1), along +x
        assert float(out["forces"][s, 0] - ref["forces"][s, 0]) > 0.5


def test_padding_edges_and_far_pairs_add_nothing():
    zbl = ZBLRepulsion()
    species = torch.tensor([1, 6, 8, 29])
    edges = torch.tensor([[1, 0, 3, 2], [0, 1, 2, 3]])
    length = torch.tensor([0.0, 3.0, 0.0, 5.0], requires_grad=True)  # padding, and pairs beyond R_i + R_j
    energy = zbl(species, edges, length)
    (grad,) = torch.autograd.grad(energy.sum(), length)
    assert torch.equal(energy, torch.zeros(4, 1)) and torch.equal(grad, torch.zeros(4))


def test_a_rank_of_a_decomposed_engine_gets_its_atoms_repulsion():
    """A cut-out cluster (what one LAMMPS rank evaluates through ``local_energy``) gives the
    periodic atomic energies, forces and virial with the repulsion in them, to 1e-12."""
    sample = to_dtype(_close_contacts_samples(3.0)[0], torch.float64)
    model = build(SCHNET, radius=3.0).double()
    check_locality(model, sample)


def test_it_changes_neither_the_range_nor_the_artifact_contract(tmp_path):
    model, plain = build(PAINN), build("PAINN")
    assert receptive_field(model) == receptive_field(plain)
    assert model.state_dict().keys() == plain.state_dict().keys()
    loaded = load_artifact(save_artifact(model, tmp_path / "m.hydra", species=[29, 79]))
    assert loaded.config.mlip.zbl
    batch = _close_contacts()
    torch.testing.assert_close(loaded(batch)["energy"], model(batch)["energy"])


def test_refused_without_an_interatomic_potential():
    with pytest.raises(ModelConfigError, match="zbl: only for interatomic potentials"):
        ModelConfig.from_dict({"mpnn_type": "SchNet", "hidden_dim": 8, "num_conv_layers": 2, "zbl": True})

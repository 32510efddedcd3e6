"""What the calculator needs to know about a model: inputs, species, units, output kinds.

Supported models take, as node feature inputs, exactly one atomic-number input (a name in
``hydragnn.models.config.SPECIES_INPUT_NAMES``, dim 1) and, as graph inputs, nothing, a total
charge (``charge`` / ``total_charge``, dim 1) filled from the call's ``charge``, a spin
(``spin`` / ``spin_multiplicity``, dim 1) filled from the call's ``spin``, or both, in the
schema's order (each defaults to 0 when a call omits it).
The model must have positions (``role: "position"``). Edge inputs are not supported (the
calculator builds the edges itself).

Species rule: the manifest's ``species`` list when the artifact has one, else the ``species``
given to the calculator, else no list; without a list, atomic numbers must fit the model's
species embedding (``1 .. num_species - 1``), and without an embedding anything goes.

Units: a model trained on normalized energies (artifact ``normalization`` with stats for the
energy output) is mapped back: ``E = scale * E' + shift`` (per atom when ``per_atom``), and the
energy derivatives (forces, stress, per-atom energies) are scaled by the same factor. Other
heads with statistics are inverted with :class:`hydragnn.data.Normalizer`. Separate statistics
for forces or stress would break ``F = -dE/dR``: such a model is refused.
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias

import torch

from hydragnn.data import Normalizer
from hydragnn.data.validation import SPECIES_INPUT_NAMES
from hydragnn.models import Committee, HydraModel

from .errors import InferenceError

CHARGE_INPUT_NAMES = frozenset({"charge", "total_charge", "charges"})
SPIN_INPUT_NAMES = frozenset({"spin", "spin_multiplicity", "total_spin"})
ServedModel: TypeAlias = HydraModel | Committee
"""The model a calculator serves: a :class:`~hydragnn.models.HydraModel` or a :class:`~hydragnn.models.Committee`."""
GRAPH_INPUT_ROLES: dict[str, frozenset[str]] = {"charge": CHARGE_INPUT_NAMES, "spin": SPIN_INPUT_NAMES}
"""Graph inputs the calculator can fill: role -> accepted schema names (each dim 1)."""


@dataclass(frozen=True)
class ModelInfo:
    """Facts about a model, read once.

    Attributes:
        cutoff: neighbour cutoff (Å).
        max_neighbours: the model's neighbour cap (``None``: all).
        species: training species, or ``None``.
        max_species: size of the species embedding (exclusive bound), or ``None``.
        graph_inputs: roles of the model's graph inputs in ``graph_attr`` order (``"charge"``,
            ``"spin"``), empty without graph inputs.
        energy, forces, stress, atomic_energy: output names of the MLIP roles (``None`` if absent).
        node_outputs / graph_outputs: other per-atom / per-structure output names.
        normalizer: statistics to undo, or ``None``.
    """

    cutoff: float
    max_neighbours: int | None
    species: frozenset[int] | None
    max_species: int | None
    graph_inputs: tuple[str, ...]
    energy: str | None
    forces: str | None
    stress: str | None
    atomic_energy: str | None
    node_outputs: tuple[str, ...]
    graph_outputs: tuple[str, ...]
    normalizer: Normalizer | None

    @property
    def charge_input(self) -> bool:
        """Whether the model reads a total charge."""
        return "charge" in self.graph_inputs

    @property
    def spin_input(self) -> bool:
        """Whether the model reads a spin."""
        return "spin" in self.graph_inputs

    @property
    def mlip(self) -> bool:
        return self.energy is not None


def model_info(model: HydraModel | Committee, species: Sequence[int] | None = None) -> ModelInfo:
    """Read a :class:`HydraModel` or a committee of them (and its ``manifest`` when loaded from
    an artifact).

    Raises:
        InferenceError: a model the calculator cannot feed.
    """
    if not isinstance(model, (HydraModel, Committee)):
        raise InferenceError(
            f"model_or_artifact: expected a HydraModel, a Committee or an artifact path, found {type(model).__name__}"
        )
    schema = model.schema
    if schema.position is None:
        raise InferenceError("model: expected a model with positions (an input with role 'position'); found none")
    node_in = schema.feature_inputs("node")
    if len(node_in) != 1 or node_in[0].name not in SPECIES_INPUT_NAMES or node_in[0].dim != 1:
        found = [(v.name, v.dim) for v in node_in]
        raise InferenceError(
            f"model: expected exactly one node input, the atomic number (one of {sorted(SPECIES_INPUT_NAMES)}, dim 1); found {found}"
        )
    if schema.feature_inputs("edge"):
        raise InferenceError("model: edge inputs are not supported by the calculator (it builds the edges itself)")
    graph_inputs = _graph_input_roles(schema.feature_inputs("graph"))
    manifest: Mapping[str, Any] = getattr(model, "manifest", None) or {}
    listed = manifest.get("species") if manifest.get("species") is not None else species
    if listed is not None and (
        isinstance(listed, (str, bytes, Mapping))
        or any(isinstance(z, bool) or not isinstance(z, numbers.Integral) or not 0 < int(z) < 119 for z in listed)
    ):
        raise InferenceError(
            f"model: 'species' must be a list of atomic numbers in 1..118, found {str(listed)[:200]} (a damaged or "
            "hand-edited artifact)"
        )
    num_species = getattr(model.dims, "num_species", 0)
    special = dict(model.special) if model.mlip else {}
    if model.mlip and model.config.mlip.compute_grad_energy:
        special.setdefault("forces", model.config.mlip.forces_name)
    taken = set(special.values())
    normalizer = _normalizer(manifest.get("normalization"), special)
    return ModelInfo(
        cutoff=float(model.cutoff),
        max_neighbours=model.config.max_neighbours,
        species=frozenset(int(z) for z in listed) if listed is not None else None,
        max_species=int(num_species) if num_species else None,
        graph_inputs=graph_inputs,
        energy=special.get("energy"),
        forces=special.get("forces"),
        stress=special.get(
            "stress", model.config.mlip.stress_name if model.mlip and model.config.mlip.compute_grad_energy else None
        ),
        atomic_energy=special.get("atomic_energy"),
        node_outputs=tuple(v.name for v in schema.outputs_at("node") if v.name not in taken),
        graph_outputs=tuple(v.name for v in schema.outputs_at("graph") if v.name not in taken),
        normalizer=normalizer,
    )


def _graph_input_roles(graph_in: Sequence[Any]) -> tuple[str, ...]:
    """The role of every graph input (schema order); anything else is refused."""
    roles: list[str] = []
    for var in graph_in:
        role = next((r for r, names in GRAPH_INPUT_ROLES.items() if var.name in names), None)
        if role is None or var.dim != 1 or role in roles:
            found = [(v.name, v.dim) for v in graph_in]
            accepted = {r: sorted(n) for r, n in GRAPH_INPUT_ROLES.items()}
            raise InferenceError(
                f"model: the calculator fills graph inputs for at most one total charge and one spin (dim 1 each, "
                f"names {accepted}); found {found}"
            )
        roles.append(role)
    return tuple(roles)


def _normalizer(stats: Any, special: Mapping[str, str]) -> Normalizer | None:
    if not stats:
        return None
    try:
        normalizer = Normalizer.from_dict(stats)
    except Exception as exc:  # hydra-data raises DataError; report it as ours
        raise InferenceError(f"model: the artifact's normalization statistics are unreadable: {exc}") from exc
    for role in ("forces", "stress", "atomic_energy"):
        name = special.get(role)
        if name is not None and name in normalizer:
            raise InferenceError(
                f"model: the artifact normalizes {role} ({name!r}) separately from the energy; forces, stress and "
                "per-atom energies must be derivatives / parts of the energy (normalize the energy only)"
            )
    return normalizer


def energy_scale(info: ModelInfo, counts: torch.Tensor) -> torch.Tensor | None:
    """``[B]`` factor from model energy units to eV (``None``: identity)."""
    if info.normalizer is None or info.energy not in info.normalizer:
        return None
    st = info.normalizer.stats[info.energy]
    scale = torch.full(counts.shape, float(st.scale[0]), dtype=torch.float64, device=counts.device)
    return scale * counts.to(torch.float64) if st.per_atom else scale


def model_fingerprint(model: torch.nn.Module) -> tuple:
    """Cheap identity of the weights: every parameter / buffer's id, storage and version counter.

    ``load_state_dict`` and in-place updates (``optimizer.step``, ``p.add_`` under ``no_grad``) bump
    the version counters; replacing a tensor changes its id. Writes through ``p.data`` are not
    seen: call ``clear_cuda_graphs()`` after those.
    """
    return tuple((id(t), t.data_ptr(), t._version) for t in (*model.parameters(), *model.buffers()))

"""An ``Architecture`` section checked against the dataset ``Schema`` (errors name the key).

Used by :class:`~hydragnn.models.model.HydraModel` when it is built: which outputs play the
MLIP roles, the conditioning rules, the species-embedding size and the task weights.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import cast

from hydragnn.data import Schema
from hydragnn.data.validation import SPECIES_INPUT_NAMES

from .config import ROLE_WEIGHTS, ModelConfig
from .errors import ModelConfigError

ROOT = "NeuralNetwork.Architecture"


def mlip_roles(c: ModelConfig, s: Schema) -> dict[str, str]:
    """``{role: output name}`` of an interatomic potential (energy, forces, stress, atomic_energy)."""
    where = f"{ROOT}.enable_interatomic_potential"
    if s.position is None:
        raise ModelConfigError(f"{where}: an interatomic potential needs a 'pos' input with role 'position'")
    expect: dict[str, tuple[str, str, tuple[int, ...]]] = {"energy": (c.mlip.energy_name, "graph", (1,))}
    if c.mlip.compute_grad_energy:
        expect["forces"] = (c.mlip.forces_name, "node", (3,))
        expect["stress"] = (c.mlip.stress_name, "graph", (6, 9))
    expect["atomic_energy"] = (c.mlip.atomic_energy_name, "node", (1,))
    special: dict[str, str] = {}
    for role, (name, level, dims) in expect.items():
        if name not in s or s[name] not in s.outputs:
            if role == "energy":
                raise ModelConfigError(
                    f"{where}: the schema needs a graph output {name!r} (dim 1) for the energy "
                    f"(set {ROOT}.energy_name to use another name)"
                )
            continue
        var = s[name]
        if var.level != level or var.dim not in dims:
            raise ModelConfigError(
                f"{where}: output {name!r} is the {role}; expected level {level!r} and dim in {list(dims)}, "
                f"found level {var.level!r} dim {var.dim}"
            )
        special[role] = name
    return special


def check_conditioning(c: ModelConfig, s: Schema, graph_in: int, special: Mapping[str, str]) -> None:
    """Graph-attribute conditioning needs graph inputs; ``fuse_pool`` needs a (non-MLIP) graph head."""
    where = f"{ROOT}.use_graph_attr_conditioning"
    if not c.conditioning.enabled:
        return
    if not graph_in:
        raise ModelConfigError(
            f"{where}: conditioning needs graph inputs (a 'graph' level input variable, e.g. total "
            "charge and spin) in the schema; it has none"
        )
    takes_graph = [v.name for v in s.outputs_at("graph") if v.name not in special.values()]
    if c.conditioning.mode == "fuse_pool" and not takes_graph:
        raise ModelConfigError(
            f"{ROOT}.graph_attr_conditioning_mode: fuse_pool conditions the graph heads and this model has "
            "none (an MLIP energy is a sum of atomic energies): use concat_node or film"
        )


def num_species(c: ModelConfig, s: Schema) -> int:
    """``num_species``, or 119 when the first node input is an atomic number, else 0."""
    if c.num_species is not None:
        return c.num_species
    first = s.feature_inputs("node")[0]
    return 119 if first.name in SPECIES_INPUT_NAMES and first.dim == 1 else 0


def task_weights(c: ModelConfig, s: Schema, special: Mapping[str, str] | None = None) -> dict[str, float]:
    """``{output: weight}`` from ``task_weights`` (a list in schema order or a mapping; default 1)
    and, for an interatomic potential, ``energy_weight`` / ``forces_weight`` / ``stress_weight``
    on the outputs playing those roles (``special``: role -> output name)."""
    names = [v.name for v in s.outputs]
    tw = c.loss.task_weights
    where = f"{ROOT}.task_weights"
    if tw is None:
        weights = {n: 1.0 for n in names}
        given: set[str] = set()
    elif tw and isinstance(tw[0], tuple):
        mapping = dict(cast("tuple[tuple[str, float], ...]", tw))  # pairs throughout (one form per config)
        unknown = sorted(set(mapping) - set(names))
        if unknown:
            raise ModelConfigError(f"{where}: unknown output(s) {unknown}; outputs are {names}")
        weights = {n: float(mapping.get(n, 1.0)) for n in names}
        given = set(mapping)
    else:
        if len(tw) != len(names):
            raise ModelConfigError(f"{where}: expected {len(names)} weights (one per output: {names}), found {len(tw)}")
        weights = {n: float(w) for n, w in zip(names, cast("tuple[float, ...]", tw))}
        given = set(names)
    for key, role in ROLE_WEIGHTS.items():
        value = getattr(c.loss, key)
        if value is None:
            continue
        name = (special or {}).get(role)
        if name is None:
            raise ModelConfigError(f"{ROOT}.{key}: the schema has no {role} output to weigh")
        if name in given:
            raise ModelConfigError(
                f"{ROOT}.{key}: output {name!r} is also weighted by {where}; give its weight in one place"
            )
        weights[name] = float(value)
    return weights

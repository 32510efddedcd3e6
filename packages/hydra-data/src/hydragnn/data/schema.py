"""The ``Variables`` schema: which sample attributes are inputs and outputs, at what level.

A schema comes from the JSON ``Variables`` section::

    {"inputs":  [{"name": "atomic_number", "level": "node", "dim": 1},
                 {"name": "pos", "level": "node", "dim": 3, "role": "position"}],
     "outputs": [{"name": "energy", "level": "graph", "dim": 1},
                 {"name": "forces", "level": "node", "dim": 3}]}

Rules (each raises :class:`SchemaError` naming the variable):

* every variable has ``name`` (non-empty str), ``level`` (``node``, ``edge`` or ``graph``) and
  ``dim`` (int > 0); ``role`` is optional: ``"feature"`` (the default, same as no role) or
  ``"position"``;
* ``role: "position"`` is allowed only on an input named ``pos`` at node level with dim 3, and an
  input named ``pos`` must carry that role;
* outputs cannot have a role (an explicit ``"feature"`` is the default and allowed);
* at least one ordinary (non-position) node input is required;
* outputs are optional (``"outputs"`` absent or ``[]``): such a schema prepares samples for
  prediction only, and building a model from it is refused by ``hydragnn.models``;
* the derived names in :data:`RESERVED_NAMES` cannot be used; names are unique across inputs and
  outputs; unknown keys and levels are rejected.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from .errors import SchemaError, did_you_mean

Level = Literal["node", "edge", "graph"]
LEVELS: tuple[str, ...] = ("node", "edge", "graph")
ROLES: tuple[str, ...] = ("feature", "position")
"""Known roles; ``"feature"`` is the default and is stored as ``role=None``."""
RESERVED_NAMES: frozenset[str] = frozenset(
    {"x", "edge_attr", "graph_attr", "y", "y_loc", "node_output", "edge_output", "graph_output"}
)
"""Names of the tensors that :func:`hydragnn.data.prepare` derives; never variable names."""

_VARIABLE_KEYS = frozenset({"name", "level", "dim", "role"})
_SCHEMA_KEYS = frozenset({"inputs", "outputs"})


@dataclass(frozen=True)
class Variable:
    """One input or output variable.

    Attributes:
        name: attribute name of the source tensor on a sample.
        level: ``"node"`` (shape ``[N, dim]``), ``"edge"`` (``[E, dim]``) or ``"graph"``
            (``[1, dim]``).
        dim: number of feature columns (> 0).
        role: ``"position"`` for the ``pos`` input, otherwise ``None`` (an ordinary feature;
            ``role="feature"`` is accepted and normalised to ``None``, so both spellings give
            equal variables and the same JSON form).
    """

    name: str
    level: Level
    dim: int
    role: str | None = None

    def __post_init__(self) -> None:
        if self.role == "feature":
            object.__setattr__(self, "role", None)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "level": self.level, "dim": self.dim}
        if self.role is not None:
            out["role"] = self.role
        return out

    @property
    def is_position(self) -> bool:
        return self.role == "position"


def _parse_variable(entry: Any, where: str) -> Variable:
    if not isinstance(entry, Mapping):
        raise SchemaError(f"{where}: expected an object with name, level, dim; found {type(entry).__name__}")
    name = entry.get("name")
    label = f"{where} ({name!r})" if isinstance(name, str) else where
    unknown = sorted(set(entry) - _VARIABLE_KEYS)
    if unknown:
        raise SchemaError(
            f"{label}: unknown key(s) {unknown}{did_you_mean(unknown, _VARIABLE_KEYS)}; "
            f"allowed keys are {sorted(_VARIABLE_KEYS)}"
        )
    if not isinstance(name, str) or not name:
        raise SchemaError(f"{label}: 'name' must be a non-empty string, found {name!r}")
    if "level" not in entry:
        raise SchemaError(f"{label}: missing 'level' (one of {list(LEVELS)})")
    level = entry["level"]
    if level not in LEVELS:
        raise SchemaError(f"{label}: unknown level {level!r}; expected one of {list(LEVELS)}")
    if "dim" not in entry:
        raise SchemaError(f"{label}: missing 'dim' (an integer > 0)")
    dim = entry["dim"]
    if isinstance(dim, bool) or not isinstance(dim, int) or dim <= 0:
        raise SchemaError(f"{label}: 'dim' must be an integer > 0, found {dim!r}")
    role = entry.get("role")
    if role is not None and role not in ROLES:
        raise SchemaError(
            f"{label}: unknown role {role!r}; expected one of {list(ROLES)} or no role (same as 'feature')"
        )
    return Variable(name=name, level=level, dim=dim, role=role)


@dataclass(frozen=True)
class Schema:
    """Validated inputs and outputs of a dataset, in JSON order.

    Build it with :meth:`from_dict`; the constructor validates too.
    """

    inputs: tuple[Variable, ...]
    outputs: tuple[Variable, ...]
    _by_name: dict[str, Variable] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "inputs", tuple(self.inputs))
        object.__setattr__(self, "outputs", tuple(self.outputs))
        seen: dict[str, str] = {}
        for kind, variables in (("inputs", self.inputs), ("outputs", self.outputs)):
            for i, var in enumerate(variables):
                where = f"Variables.{kind}[{i}] ({var.name!r})"
                if var.name in RESERVED_NAMES:
                    raise SchemaError(
                        f"{where}: {var.name!r} is reserved for derived tensors "
                        f"({sorted(RESERVED_NAMES)}); name the source attribute differently"
                    )
                if var.name in seen:
                    raise SchemaError(f"{where}: duplicate name, already declared in Variables.{seen[var.name]}")
                seen[var.name] = kind
                if kind == "outputs" and var.role is not None:  # "feature" is already None
                    raise SchemaError(f"{where}: outputs cannot have a role, found role {var.role!r}")
                if var.role == "position":
                    if kind != "inputs" or var.name != "pos" or var.level != "node" or var.dim != 3:
                        raise SchemaError(
                            f"{where}: role 'position' is only for the input named 'pos' with "
                            f"level 'node' and dim 3; found name={var.name!r}, level={var.level!r}, dim={var.dim}"
                        )
                elif var.name == "pos" and kind == "inputs":
                    raise SchemaError(
                        f"{where}: an input named 'pos' must declare role 'position' "
                        "(level 'node', dim 3); positions never enter x"
                    )
        if not any(v.level == "node" and v.role is None for v in self.inputs):
            raise SchemaError(
                "Variables.inputs: at least one ordinary node input (level 'node', no role) is required to build x"
            )
        object.__setattr__(self, "_by_name", {v.name: v for v in (*self.inputs, *self.outputs)})

    @classmethod
    def from_dict(cls, variables: Mapping[str, Any]) -> Schema:
        """Parse the JSON ``Variables`` section.

        Args:
            variables: ``{"inputs": [...], "outputs": [...]}``; ``"outputs"`` may be absent or
                empty (a schema for prediction only, see :attr:`has_outputs`).

        Raises:
            SchemaError: on any rule violation; the message names the variable.
        """
        if not isinstance(variables, Mapping):
            raise SchemaError(
                f"Variables: expected an object with 'inputs' and 'outputs', found {type(variables).__name__}"
            )
        unknown = sorted(set(variables) - _SCHEMA_KEYS)
        if unknown:
            raise SchemaError(
                f"Variables: unknown key(s) {unknown}{did_you_mean(unknown, _SCHEMA_KEYS)}; "
                f"allowed keys are {sorted(_SCHEMA_KEYS)}"
            )
        parsed: dict[str, list[Variable]] = {}
        for kind in ("inputs", "outputs"):
            entries = variables.get(kind, [] if kind == "outputs" else None)
            if not isinstance(entries, list):
                raise SchemaError(f"Variables.{kind}: expected a list of variables, found {type(entries).__name__}")
            parsed[kind] = [_parse_variable(e, f"Variables.{kind}[{i}]") for i, e in enumerate(entries)]
        return cls(inputs=tuple(parsed["inputs"]), outputs=tuple(parsed["outputs"]))

    def to_dict(self) -> dict[str, list[dict[str, Any]]]:
        """The JSON form; ``Schema.from_dict(s.to_dict()) == s``."""
        return {"inputs": [v.to_dict() for v in self.inputs], "outputs": [v.to_dict() for v in self.outputs]}

    def __getitem__(self, name: str) -> Variable:
        try:
            return self._by_name[name]
        except KeyError:
            raise KeyError(f"no variable named {name!r} in the schema; known: {sorted(self._by_name)}") from None

    def __contains__(self, name: object) -> bool:
        return name in self._by_name

    @property
    def has_outputs(self) -> bool:
        """Whether any output is declared; without one, samples can be prepared but not trained on."""
        return bool(self.outputs)

    @property
    def position(self) -> Variable | None:
        """The ``pos`` input, or ``None`` when the data has no geometry."""
        return next((v for v in self.inputs if v.is_position), None)

    def feature_inputs(self, level: str) -> tuple[Variable, ...]:
        """Ordinary inputs of ``level`` in JSON order (the columns of x / edge_attr / graph_attr)."""
        return tuple(v for v in self.inputs if v.level == level and v.role is None)

    def outputs_at(self, level: str) -> tuple[Variable, ...]:
        """Outputs of ``level`` in JSON order."""
        return tuple(v for v in self.outputs if v.level == level)

    @property
    def source_names(self) -> tuple[str, ...]:
        """Every attribute name a raw sample must carry."""
        return tuple(v.name for v in (*self.inputs, *self.outputs))

    def input_dim(self, level: str) -> int:
        """Width of x (``node``), edge_attr (``edge``) or graph_attr (``graph``)."""
        return sum(v.dim for v in self.feature_inputs(level))

    def output_slices(self) -> dict[str, slice]:
        """For each output, its columns inside node_output / edge_output / graph_output."""
        out: dict[str, slice] = {}
        for level in LEVELS:
            start = 0
            for v in self.outputs_at(level):
                out[v.name] = slice(start, start + v.dim)
                start += v.dim
        return out

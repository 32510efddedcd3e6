"""``Training.Batching``: the cost-aware batching section, parsed and validated without torch.

``{"mode": "node_budget", "max_nodes": 4096, "max_graphs": 64, "oversized_sample": "error",
"seed": 0, "drop_last": false}``; the samplers that use it are in :mod:`hydragnn.data.batching`.
Invariant: a constructed :class:`BatchingConfig` is valid (``__post_init__`` checks every field).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Literal, get_args

from . import config_parse as cp
from .errors import DataError

Mode = Literal["node_budget", "edge_budget"]
OversizedPolicy = Literal["error", "single", "skip"]
MODES: dict[str, str] = {"node_budget": "max_nodes", "edge_budget": "max_edges"}
"""Batching mode -> the config key holding its budget."""
OVERSIZED_POLICIES: tuple[str, ...] = get_args(OversizedPolicy)
_WHERE = "Training.Batching"
_POSITIVE = {"gt": 0, "noun": "an integer"}


@dataclass(frozen=True)
class BatchingConfig:
    """Validated ``Training.Batching`` section (parsed by :mod:`hydragnn.data.config_parse`,
    like every config section of the project, plus the rules between the mode and its budget).

    Attributes:
        mode: ``"node_budget"`` (cost of a graph = its node count) or ``"edge_budget"``
            (cost = its edge count, ``edge_index.shape[1]``).
        max_nodes: node budget per batch; required by, and only allowed with, ``node_budget``.
        max_edges: edge budget per batch; required by, and only allowed with, ``edge_budget``.
        max_graphs: cap on graphs per batch, or ``None`` for no cap.
            :func:`hydragnn.data.loaders.create_dataloaders` fills it with ``batch_size`` when
            the section does not set it.
        oversized_sample: what to do with a graph costlier than the budget: ``"error"``,
            ``"single"`` (a batch of its own) or ``"skip"`` (left out).
        seed: base seed of the shuffle; epoch ``e`` uses ``seed + e``.
        drop_last: drop the last ``B mod R`` batches so ranks need no splitting.

    Raises:
        DataError: on construction with invalid values, naming ``Training.Batching.<key>``.
    """

    mode: Mode
    max_nodes: int | None = field(default=None, metadata=_POSITIVE)
    max_edges: int | None = field(default=None, metadata=_POSITIVE)
    max_graphs: int | None = field(default=None, metadata=_POSITIVE)
    oversized_sample: OversizedPolicy = "error"
    seed: int = field(default=0, metadata={"min": 0, "noun": "an integer"})
    drop_last: bool = False

    def __post_init__(self) -> None:
        # a constructed config is valid: the field values pass the parser (types, ranges), then
        # the rules between keys
        cp.parse_fields(type(self), asdict(self), _WHERE, DataError)
        budget_key = MODES[self.mode]
        if getattr(self, budget_key) is None:
            raise DataError(f"{_WHERE}.{budget_key}: required by mode {self.mode!r} (an integer > 0); missing")
        for mode, key in MODES.items():
            if mode != self.mode and getattr(self, key) is not None:
                raise DataError(
                    f"{_WHERE}.{key}: only allowed with mode {mode!r}; mode is {self.mode!r}, whose budget is "
                    f"{budget_key!r}"
                )

    @classmethod
    def from_dict(cls, section: BatchingConfig | Mapping[str, Any]) -> BatchingConfig:
        """Parse the JSON ``Training.Batching`` section.

        Args:
            section: ``{"mode": ..., "max_nodes" | "max_edges": ..., ...}``; a ``BatchingConfig`` is
                returned as is.

        Raises:
            DataError: on unknown keys, a missing mode or budget, wrong types or non-positive
                values; the message names ``Training.Batching.<key>`` and what was expected.
        """
        if isinstance(section, BatchingConfig):
            return section
        values = cp.check_keys(section, _WHERE, cp.section_keys(cls), DataError)
        if "mode" not in values:
            raise DataError(f"{_WHERE}.mode: missing; expected one of {list(MODES)}")
        return cp.parse_dataclass(cls, values, _WHERE, DataError)

    def to_dict(self) -> dict[str, Any]:
        """The JSON form, without unset budgets; ``from_dict(c.to_dict()) == c``."""
        return {k: v for k, v in asdict(self).items() if v is not None}

    @property
    def budget(self) -> int:
        """The per-batch cost budget of the mode (``max_nodes`` or ``max_edges``)."""
        return int(getattr(self, MODES[self.mode]))

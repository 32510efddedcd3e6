"""``Training.Batching``: the cost-aware batching section, parsed and validated without torch.

``{"mode": "node_budget", "max_nodes": 4096, "max_graphs": 64, "oversized_sample": "error",
"seed": 0, "drop_last": false}``; the samplers that use it are in :mod:`hydragnn.data.batching`.
Invariant: a constructed :class:`BatchingConfig` is valid (``__post_init__`` checks every field).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from .errors import DataError, did_you_mean

MODES: dict[str, str] = {"node_budget": "max_nodes", "edge_budget": "max_edges"}
"""Batching mode -> the config key holding its budget."""
OVERSIZED_POLICIES: tuple[str, ...] = ("error", "single", "skip")
_KEYS = ("mode", "max_nodes", "max_edges", "max_graphs", "oversized_sample", "seed", "drop_last")
_WHERE = "Training.Batching"


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True)
class BatchingConfig:
    """Validated ``Training.Batching`` section.

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

    mode: str
    max_nodes: int | None = None
    max_edges: int | None = None
    max_graphs: int | None = None
    oversized_sample: str = "error"
    seed: int = 0
    drop_last: bool = False

    def __post_init__(self) -> None:
        w = _WHERE
        if not isinstance(self.mode, str) or self.mode not in MODES:
            raise DataError(f"{w}.mode: expected one of {list(MODES)}, found {self.mode!r}")
        budget_key = MODES[self.mode]
        for key in ("max_nodes", "max_edges", "max_graphs"):
            value = getattr(self, key)
            if value is not None and (not _is_int(value) or value <= 0):
                raise DataError(f"{w}.{key}: expected an integer > 0, found {value!r}")
        if getattr(self, budget_key) is None:
            raise DataError(f"{w}.{budget_key}: required by mode {self.mode!r} (an integer > 0); missing")
        for mode, key in MODES.items():
            if mode != self.mode and getattr(self, key) is not None:
                raise DataError(
                    f"{w}.{key}: only allowed with mode {mode!r}; mode is {self.mode!r}, whose budget is {budget_key!r}"
                )
        if not isinstance(self.oversized_sample, str) or self.oversized_sample not in OVERSIZED_POLICIES:
            raise DataError(
                f"{w}.oversized_sample: expected one of {list(OVERSIZED_POLICIES)}, found {self.oversized_sample!r}"
            )
        if not _is_int(self.seed) or self.seed < 0:
            raise DataError(f"{w}.seed: expected an integer >= 0, found {self.seed!r}")
        if not isinstance(self.drop_last, bool):
            raise DataError(f"{w}.drop_last: expected true or false, found {self.drop_last!r}")

    @classmethod
    def from_dict(cls, section: Mapping[str, Any]) -> BatchingConfig:
        """Parse the JSON ``Training.Batching`` section.

        Args:
            section: ``{"mode": ..., "max_nodes" | "max_edges": ..., ...}``.

        Raises:
            DataError: on unknown keys, a missing mode or budget, wrong types or non-positive
                values; the message names ``Training.Batching.<key>`` and what was expected.
        """
        if isinstance(section, BatchingConfig):
            return section
        if not isinstance(section, Mapping):
            raise DataError(f"{_WHERE}: expected an object with keys {list(_KEYS)}, found {type(section).__name__}")
        unknown = sorted(set(section) - set(_KEYS))
        if unknown:
            hint = did_you_mean(unknown[:1], _KEYS)
            raise DataError(f"{_WHERE}.{unknown[0]}: unknown key{hint}; allowed keys are {list(_KEYS)}")
        if "mode" not in section:
            raise DataError(f"{_WHERE}.mode: missing; expected one of {list(MODES)}")
        return cls(**dict(section))

    def to_dict(self) -> dict[str, Any]:
        """The JSON form, without unset budgets; ``from_dict(c.to_dict()) == c``."""
        return {k: v for k, v in asdict(self).items() if v is not None}

    @property
    def budget(self) -> int:
        """The per-batch cost budget of the mode (``max_nodes`` or ``max_edges``)."""
        return int(getattr(self, MODES[self.mode]))

"""A limit on a committee's uncertainty during MD: stop the run, or flag the step, when the model
extrapolates.

A committee calculator (``HydraCalculator(..., uncertainty=True)``) returns ``forces_uncertainty
[N]``: per atom, the root mean square deviation of the members' force vectors from their mean
(eV/Å). Its largest value in a structure is the usual extrapolation signal of committee and
active-learning MD (DP-GEN's "max force deviation"): where the members disagree, the mean is
not to be trusted. :class:`UncertaintyLimit` holds the threshold on it and what to do above it;
the ASE and torch-sim adapters and the LAMMPS calculator potential apply it on every call, after
the finite check (:mod:`.finite`). ``"stop"`` raises :class:`ExtrapolationError` naming where
(the calculation, call or step), the largest value and the atoms above the threshold, before the
engine uses the forces; ``"flag"`` lets the run go on and records the call in
:attr:`UncertaintyLimit.flagged` (the first one also warns).

``pair_style mliap unified`` (:class:`~.mliap.HydraMLIAP`) hands each rank only its pair forces,
so no rank has a whole force per member; it limits the members' spread of each atom's energy
instead (``quantity="atomic_energy"``, eV), the quantity metatomic's LAMMPS threshold reads too.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .errors import HydraInferWarning, InferenceError

__all__ = ["ACTIONS", "QUANTITIES", "ExtrapolationError", "UncertaintyLimit"]

ACTIONS = ("stop", "flag")
QUANTITIES = {"forces": ("force uncertainty", "eV/Å"), "atomic_energy": ("per-atom energy uncertainty", "eV")}
"""What a limit reads: ``forces_uncertainty [N]`` (every engine that has the whole force on each
atom) or ``atomic_energy_uncertainty [N]`` (``pair_style mliap unified``, whose ranks see only
their pair forces; metatomic's LAMMPS threshold reads the same quantity). Name and unit."""
SHOWN = 10


class ExtrapolationError(InferenceError):
    """A committee's uncertainty passed the limit of an MD run. Attributes: ``value`` (the
    largest per-atom uncertainty, in the limit's unit), ``atoms`` (the atoms above the threshold)."""

    def __init__(self, message: str, value: float, atoms: Sequence[int]) -> None:
        super().__init__(message)
        self.value = value
        self.atoms = list(atoms)


@dataclass
class UncertaintyLimit:
    """Stop or flag an MD step whose largest per-atom uncertainty exceeds ``threshold``.

    Args:
        threshold: > 0, in the quantity's unit (forces: eV/Å, e.g. 0.2-0.5 for small molecules;
            calibrate it on structures whose errors you know, see docs).
        action: ``"stop"`` (raise :class:`ExtrapolationError`) or ``"flag"`` (record and go on).
        quantity: ``"forces"`` (default) or ``"atomic_energy"`` (:data:`QUANTITIES`); an engine
            refuses a limit on a quantity it does not serve.

    Attributes:
        flagged: ``(where, largest value)`` of every call above the threshold (``"flag"``).
        largest: the largest per-atom uncertainty of the last call checked.
    """

    threshold: float
    action: str = "stop"
    quantity: str = "forces"
    flagged: list[tuple[str, float]] = field(default_factory=list, repr=False)
    largest: float | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        t = self.threshold
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t <= 0:
            raise InferenceError(f"uncertainty threshold: expected a number > 0, found {t!r}")
        if self.action not in ACTIONS:
            raise InferenceError(f"uncertainty action: expected one of {list(ACTIONS)}, found {self.action!r}")
        if self.quantity not in QUANTITIES:
            raise InferenceError(f"uncertainty quantity: expected one of {list(QUANTITIES)}, found {self.quantity!r}")

    @property
    def label(self) -> str:
        """``"force uncertainty"`` or ``"per-atom energy uncertainty"``."""
        return QUANTITIES[self.quantity][0]

    @property
    def unit(self) -> str:
        """``"eV/Å"`` or ``"eV"``."""
        return QUANTITIES[self.quantity][1]

    def check(
        self, where: str, forces_uncertainty: Any, *, atom_ids: Any = None, symbols: Sequence[str] | None = None
    ) -> bool:
        """Apply the limit to one call's per-atom uncertainty ``[N]`` (``forces_uncertainty`` or
        ``atomic_energy_uncertainty``, as :attr:`quantity` says); ``True`` when it was exceeded (``"flag"``).

        Raises:
            ExtrapolationError: exceeded under ``"stop"``.
        """
        if hasattr(forces_uncertainty, "detach"):
            forces_uncertainty = forces_uncertainty.detach().cpu().numpy()
        values = np.asarray(forces_uncertainty, dtype=np.float64).reshape(-1)
        self.largest = float(values.max()) if values.size else 0.0
        if self.largest <= self.threshold:
            return False
        if self.action == "flag":
            if not self.flagged:
                warnings.warn(
                    f"{where}: the committee's {self.label} reached {self.largest:.3g} {self.unit}, above the threshold "
                    f"{self.threshold:g}: the model is extrapolating (this run goes on; every such call is recorded "
                    "in the limit's .flagged)",
                    HydraInferWarning,
                    stacklevel=3,
                )
            self.flagged.append((where, self.largest))
            return True
        rows = np.flatnonzero(values > self.threshold)
        order = rows[np.argsort(-values[rows])]
        ids = np.arange(len(values)) if atom_ids is None else np.asarray(atom_ids).reshape(-1)
        named = ", ".join(
            f"{int(ids[i])}" + (f" ({symbols[i]})" if symbols is not None else "") + f": {values[i]:.3g}"
            for i in order[:SHOWN]
        )
        more = f", ... and {len(rows) - SHOWN} more" if len(rows) > SHOWN else ""
        raise ExtrapolationError(
            f"{where}: the committee's {self.label} reached {self.largest:.3g} {self.unit}, above the threshold "
            f"{self.threshold:g}, on {len(rows)} atoms ({named}{more} {self.unit}): the model is extrapolating, so the run "
            "is stopped before it uses these forces (add such structures to the training data, or raise the threshold)",
            self.largest,
            [int(ids[i]) for i in order],
        )


def as_limit(
    limit: UncertaintyLimit | float | None, quantity: str = "forces", engine: str = "this engine"
) -> UncertaintyLimit | None:
    """An adapter's ``uncertainty_limit`` argument: a number is a ``"stop"`` threshold on ``quantity``.

    Raises:
        InferenceError: a limit on another quantity than the engine serves.
    """
    if limit is None:
        return None
    if not isinstance(limit, UncertaintyLimit):
        return UncertaintyLimit(limit, quantity=quantity)
    if limit.quantity != quantity:
        raise InferenceError(
            f"uncertainty_limit: {engine} checks the {QUANTITIES[quantity][0]} ({QUANTITIES[quantity][1]}); "
            f"the limit is on the {limit.label}: give UncertaintyLimit(..., quantity={quantity!r})"
        )
    return limit


def check_across_ranks(
    limit: UncertaintyLimit, where: str, values: np.ndarray, comm: Any, atom_ids: Any = None
) -> None:
    """Apply ``limit`` to this rank's per-atom values ``[n]`` with the largest value of all ranks
    (one ``allgather`` of a float on the mpi4py ``comm``), so that every rank stops (or flags) at
    the same call; the error names this rank's own atoms above the threshold (``atom_ids``: their IDs)."""
    largest = max(comm.allgather(float(values.max()) if values.size else 0.0))
    if values.size and values.max() > limit.threshold:
        limit.check(where, values, atom_ids=atom_ids)  # raises under "stop"
    elif largest > limit.threshold:  # another rank's atoms: stop (or flag) here too
        if limit.action == "stop":
            raise ExtrapolationError(
                f"{where}: the committee's {limit.label} reached {largest:.3g} {limit.unit} on another rank's atoms, "
                f"above the threshold {limit.threshold:g}: the model is extrapolating, so the run is stopped "
                "on every rank",
                largest,
                [],
            )
        limit.flagged.append((where, largest))
    limit.largest = largest


def md_uncertainty(
    calc_or_path: Any, limit: UncertaintyLimit | float | None, kwargs: dict[str, Any]
) -> UncertaintyLimit | None:
    """The limit of an MD adapter, with ``uncertainty=True`` added to ``kwargs`` (the calculator an
    adapter builds) when there is one.

    Raises:
        InferenceError: a limit for a calculator built without ``uncertainty=True``.
    """
    from .calculator import HydraCalculator

    resolved = as_limit(limit)
    if resolved is not None:
        if isinstance(calc_or_path, HydraCalculator):
            if not calc_or_path.uncertainty:
                raise InferenceError(
                    "uncertainty_limit: the calculator serves no uncertainty; build it with "
                    "HydraCalculator(..., uncertainty=True) (a committee model)"
                )
        else:
            kwargs["uncertainty"] = True
    return resolved

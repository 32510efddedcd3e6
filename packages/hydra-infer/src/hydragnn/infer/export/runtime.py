"""Load and run an exported AOTInductor (``.pt2``) or TorchScript file.

:class:`ExportedModel` needs torch only (the neighbour list comes from ASE, so the class works
where hydragnn's own search is absent too); it is what the export check, the LAMMPS driver and
the benchmarks call. A user without hydragnn writes the same few lines (README: "Exported models").
"""

from __future__ import annotations

import json
import logging
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .formats import METADATA_KEY
from .graph import ExportError


def file_format(path: str | Path) -> str:
    """``"aoti"``, ``"torchscript"`` or ``"metatomic"``, from the archive's members.

    Raises:
        ExportError: not a file hydragnn-export writes.
    """
    try:
        with zipfile.ZipFile(path) as archive:
            names = archive.namelist()
    except (OSError, zipfile.BadZipFile) as exc:
        raise ExportError(f"{path}: not an exported model ({exc})") from None
    if any("/aotinductor/" in n for n in names):
        return "aoti"
    if any(n.endswith(f"/extra/{METADATA_KEY}.json") for n in names):
        return "torchscript"
    if any(n.endswith("/extra/metadata") or "metatomic" in n for n in names):
        return "metatomic"
    raise ExportError(f"{path}: a zip archive, but not a model hydragnn-export wrote")


def load_aoti(path: Path) -> Any:
    """``torch._inductor.aoti_load_package`` without its warning that a CPU build made for no
    vector ISA (the scalar build :func:`.formats.write_aoti` makes on CPU) differs from this CPU's."""
    logger = logging.getLogger("torch.export.pt2_archive._package")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        return torch._inductor.aoti_load_package(str(path))
    finally:
        logger.setLevel(level)


class ExportedModel:
    """An exported ``.pt2`` / TorchScript file as a function of one structure.

    Args:
        path: the file.

    Attributes:
        metadata: what the export recorded (cutoff, species, dtype, device, outputs, ...).
        format: ``"aoti"`` or ``"torchscript"``.

    Raises:
        ExportError: a metatomic file (load it with metatomic) or not an exported model.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.format = file_format(self.path)
        if self.format == "aoti":
            self._fn = load_aoti(self.path)
            self.metadata = json.loads(self._fn.get_metadata()[METADATA_KEY])
        elif self.format == "torchscript":
            extra = {f"{METADATA_KEY}.json": ""}
            self._fn = torch.jit.load(str(self.path), _extra_files=extra)
            self.metadata = json.loads(extra[f"{METADATA_KEY}.json"])
        else:
            raise ExportError(
                f"{self.path}: a metatomic model; run it with metatomic (metatomic_ase.MetatomicCalculator, i-PI, LAMMPS)"
            )
        self.dtype = getattr(torch, self.metadata["dtype"])
        self.device = torch.device(self.metadata["device"])
        self.cutoff = float(self.metadata["cutoff"])

    def run(self, *inputs: torch.Tensor) -> dict[str, torch.Tensor]:
        """The exported function on its six inputs (see :mod:`.graph`)."""
        return dict(self._fn(*inputs))

    def __call__(self, positions: Any, numbers: Any, cell: Any = None, pbc: Any = None) -> dict[str, torch.Tensor]:
        """One structure: positions ``[N, 3]`` Å, numbers ``[N]``, cell ``[3, 3]`` rows (default none), pbc ``[3]``.

        The neighbour list is ASE's ``neighbor_list("ijS")`` (full, within the cutoff).
        """
        from ase import Atoms

        cell = np.zeros((3, 3)) if cell is None else np.asarray(cell, dtype=float)
        pbc = np.zeros(3, dtype=bool) if pbc is None else np.broadcast_to(np.asarray(pbc, dtype=bool), (3,))
        atoms = Atoms(numbers=np.asarray(numbers), positions=np.asarray(positions, dtype=float), cell=cell, pbc=pbc)
        return self.run(*structure_inputs(atoms, self.cutoff, self.dtype, self.device))


def structure_inputs(atoms: Any, cutoff: float, dtype: torch.dtype, device: torch.device) -> tuple[torch.Tensor, ...]:
    """The exported function's six inputs for an ASE ``Atoms``, with ASE's neighbour list."""
    from ase.neighborlist import neighbor_list

    i, j, shifts = neighbor_list("ijS", atoms, cutoff)
    return (
        torch.tensor(atoms.positions, dtype=dtype, device=device),
        torch.tensor(atoms.numbers, dtype=torch.long, device=device),
        torch.tensor(atoms.cell.array, dtype=dtype, device=device),
        torch.tensor(atoms.pbc, dtype=torch.bool, device=device),
        torch.tensor(np.stack([i, j]), dtype=torch.long, device=device),
        torch.tensor(shifts, dtype=dtype, device=device),
    )

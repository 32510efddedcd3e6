"""Load and run an exported AOTInductor (``.pt2``) or TorchScript file.

:class:`ExportedModel` is what the LAMMPS driver and the benchmarks call: validated inputs
(:func:`~hydragnn.infer.inputs.check_call`) and hydra-data's neighbour search, kept with a Verlet
skin (:class:`~hydragnn.infer.neighbors.NeighborCache`), converted to the file's inputs.
:func:`structure_inputs` builds the same inputs with ASE's ``neighbor_list`` instead, an
independent search the export check uses; a user without hydragnn writes those few lines
(``docs/export.md``). ASE's search costs more than the model on CPU (18 ms at 108 atoms, 90 ms
at 1008 for ``tools/bench/engines.py``'s model, whose TorchScript file takes 13 and 68 ms).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import zipfile
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch

from hydragnn.data.pyg_compat import torchscript_quietly

from ..model_info import ModelInfo
from .formats import METADATA_KEY
from .graph import ExportError, check_species, fcc_lattice

ARTIFACT_SUFFIX = ".hydra"
ARTIFACT_MAGIC = b"HYDRAGNN"


def file_sha256(path: str | os.PathLike) -> str:
    """The SHA-256 of a file, hex."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def check_exported(path: str | os.PathLike, sha256: str | None = None) -> None:
    """The trust rule of exported files, applied before anything in one is loaded.

    An exported file is code (TorchScript, a compiled library), unlike a ``.hydra`` artifact: a
    ``.hydra`` name or an artifact's magic bytes are never loaded as an exported model, and with
    ``sha256`` (what ``hydragnn-export`` printed for the file it wrote) the file must match it.

    Raises:
        ExportError: naming the file and the rule it breaks.
    """
    path = Path(path)
    if path.suffix == ARTIFACT_SUFFIX:
        raise ExportError(
            f"{path}: a .hydra file is a model artifact, never loaded as an exported model (exported files "
            "run code: they keep their own .pt / .pt2 names)"
        )
    try:
        with open(path, "rb") as fh:
            head = fh.read(len(ARTIFACT_MAGIC))
    except OSError as exc:
        raise ExportError(f"{path}: cannot read it: {exc.strerror or exc}") from None
    if head == ARTIFACT_MAGIC:
        raise ExportError(f"{path}: a HydraGNN model artifact, not an exported model; load it with load_artifact")
    if sha256 is not None:
        found = file_sha256(path)
        if found != sha256.lower():
            raise ExportError(
                f"{path}: SHA-256 {found} is not the {sha256} you expect: not the file you exported (or changed "
                "since); refused before loading, since an exported file runs code"
            )


def file_format(path: str | os.PathLike) -> str:
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


def describe(path: str | os.PathLike) -> dict[str, Any]:
    """The metadata of an exported file (any format), as a dict, read from the archive without
    loading its code (TorchScript's extra file, AOTInductor's metadata JSON, metatomic's reader).

    Raises:
        ExportError: not an exported file (a ``.hydra`` artifact included), or no metadata in it.
    """
    check_exported(path)
    fmt = file_format(path)
    if fmt == "metatomic":
        from .metatomic import metatomic_torch

        mta = metatomic_torch()
        return json.loads(mta.read_model_metadata(str(path)).extra["hydragnn"])
    with zipfile.ZipFile(path) as archive:
        for info in archive.infolist():
            name = info.filename
            wanted = (
                name.endswith(f"/extra/{METADATA_KEY}.json")
                if fmt == "torchscript"
                else name.endswith("_metadata.json")
            )
            if not wanted or info.file_size > 1 << 20:
                continue
            try:
                data = json.loads(archive.read(info))
                return data if fmt == "torchscript" else json.loads(data[METADATA_KEY])
            except (ValueError, KeyError, TypeError):
                continue
    raise ExportError(f"{path}: an exported {fmt} file without HydraGNN's metadata")


class ExportedModel:
    """An exported ``.pt2`` / TorchScript file as a function of one structure.

    Args:
        path: the file.
        skin: Verlet skin (Å) of the neighbour list kept between calls (0: a search per call;
            same edges either way, see :mod:`hydragnn.infer.neighbors`).
        sha256: the file's expected SHA-256 (``hydragnn-export`` prints it): refuse any other file
            before loading it (:func:`check_exported`). An exported file runs code when loaded:
            load only files you exported, or pin them this way.

    Attributes:
        metadata: what the export recorded (cutoff, species, dtype, device, outputs, ...).
        format: ``"aoti"`` or ``"torchscript"``.

    Raises:
        ExportError: a metatomic file (load it with metatomic), not an exported model, a ``.hydra``
            name or artifact, or a SHA-256 other than ``sha256``.
    """

    def __init__(self, path: str | os.PathLike, *, skin: float = 0.0, sha256: str | None = None) -> None:
        from ..neighbors import NeighborCache, check_skin

        self._neighbors = NeighborCache(check_skin(skin))
        self.path = Path(path)
        check_exported(self.path, sha256)
        self.format = file_format(self.path)
        if self.format == "aoti":
            self._fn = load_aoti(self.path)
            self.metadata = json.loads(self._fn.get_metadata()[METADATA_KEY])
        elif self.format == "torchscript":
            extra = {f"{METADATA_KEY}.json": ""}
            with torchscript_quietly():  # the format's own loader, deprecated by torch >= 2.14
                self._fn = torch.jit.load(str(self.path), _extra_files=extra)
            self.metadata = json.loads(extra[f"{METADATA_KEY}.json"])
        else:
            raise ExportError(
                f"{self.path}: a metatomic model; run it with metatomic (metatomic_ase.MetatomicCalculator, i-PI, LAMMPS)"
            )
        self.dtype = getattr(torch, self.metadata["dtype"])
        self.device = torch.device(self.metadata["device"])
        self.cutoff = float(self.metadata["cutoff"])

    @property
    def neighbor_stats(self) -> dict[str, int]:
        """``{"builds": int, "reuses": int}``: neighbour lists searched and reused by :meth:`__call__`."""
        return self._neighbors.stats()

    def run(self, *inputs: torch.Tensor) -> dict[str, torch.Tensor]:
        """The exported function on its six inputs (see :mod:`.graph`)."""
        return dict(self._fn(*inputs))

    def __call__(self, positions: Any, numbers: Any, cell: Any = None, pbc: Any = None) -> dict[str, torch.Tensor]:
        """One structure: positions ``[N, 3]`` Å, numbers ``[N]``, cell ``[3, 3]`` rows and pbc ``[3]``
        (default: none; a cell without pbc is periodic everywhere, as for the calculator).

        Raises:
            InferenceError: invalid input (shapes, species outside the file's, a cell too small).
        """
        from ..inputs import DEFAULT_MAX_CELL_IMAGES, check_call

        periodic = cell is not None and (pbc is None or bool(np.any(np.asarray(pbc))))
        species = self.metadata.get("species")
        call = check_call(
            positions,
            numbers,
            charge=None,
            cell=cell if periodic else None,
            pbc=pbc if periodic else None,
            mol_idx=None,
            cutoff=self.cutoff,
            max_cell_images=DEFAULT_MAX_CELL_IMAGES,
            species=frozenset(species) if species else None,
            max_species=None,
            dtype=self.dtype,
            device=self.device,
        )
        edge_index, edge_shift = self._neighbors.edges(call, self.cutoff, None)
        if call.cell is None:
            cell_t = torch.zeros(3, 3, dtype=self.dtype, device=self.device)
            pbc_t = torch.zeros(3, dtype=torch.bool, device=self.device)
            shifts = torch.zeros(edge_shift.shape, dtype=self.dtype, device=self.device)
        else:
            cell_t, pbc_t = call.cell[0], cast(torch.Tensor, call.pbc)[0]  # pbc comes with the cell
            # Cartesian image offsets -> integer multiples of the lattice vectors (pinv: a
            # non-periodic direction may have a zero row, and never carries an offset)
            shifts = (edge_shift.double() @ torch.linalg.pinv(cell_t.double())).round().to(self.dtype)
        # hydra-data's (source j, target i) -> the file's (i, j)
        return self.run(call.pos, call.numbers, cell_t, pbc_t, edge_index.flip(0).contiguous(), shifts)


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


def example_inputs(info: ModelInfo, dtype: torch.dtype, device: torch.device) -> tuple[torch.Tensor, ...]:
    """A 32-atom periodic structure to trace with (sizes above 1, so nothing specialises on them)."""
    from ase.build import bulk

    atoms = bulk("Cu", "fcc", a=fcc_lattice(info.cutoff), cubic=True) * (2, 2, 2)
    atoms.rattle(0.05, seed=0)
    atoms.numbers[:] = check_species(info)[0]
    return structure_inputs(atoms, info.cutoff, dtype, device)

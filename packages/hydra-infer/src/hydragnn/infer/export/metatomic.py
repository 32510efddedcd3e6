"""The metatomic format: the scripted energy graph inside a metatomic ``AtomisticModel``.

One file for every engine metatomic serves (ASE through ``metatomic_ase``, i-PI's
``-m metatomic`` driver, LAMMPS's ``pair_style metatomic``, torch-sim). The engine passes a full
neighbour list (``requested_neighbor_lists``) with integer cell shifts, exactly the exported
graph's inputs, and computes forces and stress itself by autograd through the energy (engines
strain positions and cell, so the graph computes the pair shifts from the cell). Output:
``energy`` per structure and, for a model with per-atom energies, per atom (``sample_kind``
``"atom"``, also what ``selected_atoms`` needs) and, for a committee exported with uncertainty,
``energy_uncertainty`` (the members' spread, per atom when the energy is: what metatomic's ASE
calculator and LAMMPS pair style compare with ``uncertainty_threshold``). The model's other
heads are not offered here (metatomic has no standard names for them); the AOTInductor and
TorchScript files carry them.

PyG replaces ``torch.index_select`` at import with a Python function that TorchScript cannot
compile, and metatensor scripts functions calling it when ``metatomic.torch`` is imported and
when a model is saved; :func:`pyg_index_select_restored` puts torch's own back for that time.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any, BinaryIO

import torch

from .formats import METADATA_KEY, scriptable
from .pyg_patch import pyg_index_select_restored


def metatomic_torch() -> Any:
    """``metatomic.torch`` (imported with :func:`pyg_index_select_restored`), or an ImportError saying how to get it."""
    try:
        with pyg_index_select_restored():
            import metatomic.torch as mta
    except ImportError as exc:
        raise ImportError(
            f'the metatomic format needs metatomic-torch ({exc}); pip install "hydra-infer[metatomic]"'
        ) from exc
    return mta


def write_metatomic(gm: torch.fx.GraphModule, path: Path | BinaryIO, meta: dict[str, Any]) -> None:
    """The metatomic file (a path or a binary file object) of an energy-only graph (``gradients=False``) and its metadata.

    ``meta`` must hold ``cutoff``, ``species``, ``dtype``, ``device``, ``interaction_range`` and
    ``per_atom_energy`` (see :func:`hydragnn.infer.export.export_model`).
    """
    mta = metatomic_torch()
    per_atom = bool(meta["per_atom_energy"])
    with pyg_index_select_restored():
        from .metatomic_module import HydraGNNMetatomic

        uncertainty = bool(meta.get("uncertainty"))
        module = HydraGNNMetatomic(scriptable(gm), float(meta["cutoff"]), per_atom, uncertainty).eval()
        kind = "atom" if per_atom else "system"
        outputs = {"energy": mta.ModelOutput(unit="eV", sample_kind=kind)}
        if uncertainty:
            outputs["energy_uncertainty"] = mta.ModelOutput(unit="eV", sample_kind=kind)
        capabilities = mta.ModelCapabilities(
            outputs=outputs,
            atomic_types=[int(z) for z in meta["species"]],
            interaction_range=float(meta["interaction_range"]),
            length_unit="angstrom",
            supported_devices=[meta["device"]],
            dtype=meta["dtype"],
        )
        info = mta.ModelMetadata(
            name=str(meta.get("name") or "HydraGNN potential"),
            description="exported by hydragnn-export",
            extra={METADATA_KEY: json.dumps(meta)},
        )
        model = mta.AtomisticModel(module, info, capabilities)
        if isinstance(path, Path):
            model.save(str(path))
            return
        # metatomic writes a path only (a file object comes back empty): the system's temporary
        # folder, then the bytes to ``path``
        with tempfile.TemporaryDirectory(prefix="hydragnn-export-") as folder:
            file = Path(folder) / "model.pt"
            model.save(str(file))
            path.write(file.read_bytes())

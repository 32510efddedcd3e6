"""hydra-data: the data layer of HydraGNN.

Schema and sample preparation (Contract 1 of DESIGN.md), dataset containers, neighbor lists,
loaders with cost-aware batching, normalization, ASE conversion (any file ASE reads, converted
once into a cached prepared container), per-species reference energies, reference data from
EMT, a checksum-verified download cache, and the published LSMS data sets upstream HydraGNN names
(``CuAu_32atoms``, ``FePt_32atoms``, ``FeSi_1024atoms``: downloaded once, parsed, prepared and cached).

Every public name is imported on first use (PEP 562), so ``from hydragnn.data import Schema``
loads neither torch nor torch_geometric, and each layer pays only for what it touches; ``adios2``
(the ``hydra-data[adios]`` extra) and nvalchemi-toolkit-ops (first neighbor-list call) load later
still. Importing it changes nothing process-wide, and nothing in it tunes the process: threads, the
OpenMP wait policy and malloc defaults are execution choices (:mod:`hydragnn.models.execution`).
"""

import sys as _sys
import types
from typing import Any

from .__about__ import __version__
from .lazy import lazy_names

# public name -> submodule defining it
_LAZY: dict[str, str] = {
    "atoms_to_sample": "io.ase_io",
    "sample_to_atoms": "io.ase_io",
    "AseSource": "io.ase_source",
    "BatchingConfig": "batching_config",
    "CostAwareBatchSampler": "batching",
    "FixedBatchSampler": "batching",
    "sample_costs": "batching",
    "FORMATS": "containers",
    "AdiosDataset": "containers",
    "ContainerDataset": "containers",
    "PickleDataset": "containers",
    "PtDirectoryDataset": "containers",
    "open_dataset": "containers",
    "write_dataset": "containers",
    "ConvertedSource": "io.conversion",
    "convert_source": "io.conversion",
    "DownloadCache": "io.download",
    "download": "io.download",
    "ArchiveError": "errors",
    "ChecksumError": "errors",
    "CoincidentAtomsWarning": "errors",
    "ContainerError": "errors",
    "DataError": "errors",
    "DataWarning": "errors",
    "DownloadError": "errors",
    "DuplicateKeyWarning": "errors",
    "NeighborListError": "errors",
    "SchemaError": "errors",
    "create_dataloaders": "loaders",
    "format_lsms": "named.lsms",
    "iter_lsms": "named.lsms",
    "parse_lsms": "named.lsms",
    "LSMS_VARIABLES": "named.datasets",
    "NAMED_DATASETS": "named.datasets",
    "NamedDataset": "named.datasets",
    "fetch_raw": "named.fetch",
    "prepare_named_dataset": "named.prepare",
    "set_epoch": "loaders",
    "add_edges": "neighbors.search",
    "brute_force_radius_graph": "neighbors.brute_force",
    "radius_graph": "neighbors.search",
    "Normalizer": "normalize",
    "add_positional_encodings": "positional",
    "prepare": "prepare",
    "prepare_all": "prepare",
    "CUAU_VARIABLES": "emt",
    "generate_bulk": "emt",
    "generate_cuau": "emt",
    "LEVELS": "schema",
    "RESERVED_NAMES": "schema",
    "Schema": "schema",
    "Variable": "schema",
}

__all__ = ["__version__", *sorted(_LAZY)]


_MOVED = {
    name: "hydragnn.models.execution (hydra-models), the execution layer"
    for name in ("configure_threads", "compile_kwargs", "prefer_passive_waiting", "set_intra_op_threads")
}
"""Process tuning that left the data layer in 0.3 (it is an execution choice)."""

__getattr__, __dir__ = lazy_names(__name__, _LAZY, globals(), _MOVED)


class _Package(types.ModuleType):
    """Keeps a public function whose name is also its submodule's (``prepare``).

    Importing a submodule sets it as an attribute of the package; for such a name the
    function, not the module, stays the package attribute (``hydragnn.data.prepare(...)``),
    as with eager imports. The submodule stays importable by its dotted name.
    """

    def __setattr__(self, name: str, value: Any) -> None:
        if isinstance(value, types.ModuleType) and _LAZY.get(name) == name:
            return  # the function is looked up by __getattr__
        super().__setattr__(name, value)


_sys.modules[__name__].__class__ = _Package

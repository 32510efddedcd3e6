"""hydra-data: the data layer of HydraGNN.

Schema and sample preparation (Contract 1 of DESIGN.md), dataset containers, neighbor lists,
loaders with cost-aware batching, normalization, ASE conversion (any file ASE reads, converted
once into a cached prepared container), per-species reference energies, reference data from
EMT, and a checksum-verified download cache. Heavy optional parts import lazily: ``adios2`` (the
``hydra-data[adios]`` extra) and nvalchemi-toolkit-ops (first neighbor-list call). Importing it
sets ``OMP_WAIT_POLICY=PASSIVE`` when unset and torch is not loaded yet (:mod:`.threads`).
"""

from . import threads  # noqa: F401  (first: OpenMP's wait policy must be in the environment before torch loads)
from .__about__ import __version__
from .ase_io import atoms_to_sample, sample_to_atoms
from .ase_source import AseSource
from .batching import BatchingConfig, CostAwareBatchSampler, FixedBatchSampler, sample_costs
from .containers import (
    FORMATS,
    AdiosDataset,
    ContainerDataset,
    PickleDataset,
    PtDirectoryDataset,
    open_dataset,
    write_dataset,
)
from .conversion import ConvertedSource, convert_source
from .download import DownloadCache, download
from .errors import ContainerError, DataError, DownloadError, NeighborListError, SchemaError
from .loaders import create_dataloaders, set_epoch
from .neighbors import add_edges, brute_force_radius_graph, radius_graph
from .normalize import Normalizer
from .positional import add_positional_encodings
from .prepare import prepare, prepare_all
from .reference import CUAU_VARIABLES, generate_bulk, generate_cuau
from .schema import LEVELS, RESERVED_NAMES, Schema, Variable

__all__ = [
    "CUAU_VARIABLES",
    "FORMATS",
    "LEVELS",
    "RESERVED_NAMES",
    "AdiosDataset",
    "AseSource",
    "BatchingConfig",
    "ContainerDataset",
    "ContainerError",
    "ConvertedSource",
    "CostAwareBatchSampler",
    "DataError",
    "DownloadCache",
    "DownloadError",
    "FixedBatchSampler",
    "NeighborListError",
    "Normalizer",
    "PickleDataset",
    "PtDirectoryDataset",
    "Schema",
    "SchemaError",
    "Variable",
    "__version__",
    "add_edges",
    "add_positional_encodings",
    "atoms_to_sample",
    "brute_force_radius_graph",
    "convert_source",
    "create_dataloaders",
    "download",
    "generate_bulk",
    "generate_cuau",
    "open_dataset",
    "prepare",
    "prepare_all",
    "radius_graph",
    "sample_costs",
    "sample_to_atoms",
    "set_epoch",
    "write_dataset",
]

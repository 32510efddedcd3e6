"""hydra-data: the data layer of HydraGNN.

Schema and sample preparation (Contract 1 of DESIGN.md), dataset containers, neighbor lists,
loaders with cost-aware batching, normalization, ASE conversion, reference data from EMT, and
a checksum-verified download cache.
"""

from .__about__ import __version__
from .errors import ContainerError, DataError, DownloadError, NeighborListError, SchemaError
from .prepare import prepare, prepare_all
from .schema import LEVELS, RESERVED_NAMES, Schema, Variable

__all__ = [
    "__version__",
    "ContainerError",
    "DataError",
    "DownloadError",
    "LEVELS",
    "NeighborListError",
    "RESERVED_NAMES",
    "Schema",
    "SchemaError",
    "Variable",
    "prepare",
    "prepare_all",
]

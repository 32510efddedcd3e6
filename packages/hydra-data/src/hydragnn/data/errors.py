"""The exception hierarchy of hydra-data.

Every error raised on purpose by this package derives from :class:`DataError`, so callers can
catch one type. Messages say what was expected, what was found, and where.
"""

from __future__ import annotations


class DataError(Exception):
    """Base class of every error raised by hydra-data."""


class SchemaError(DataError, ValueError):
    """A ``Variables`` section, or a sample checked against it, breaks the schema rules."""


class ContainerError(DataError, OSError):
    """A dataset container is missing, truncated, corrupted, or written by an unknown format."""


class NeighborListError(DataError, ValueError):
    """Bad input to a neighbor-list construction (shapes, cells, cutoffs)."""


class DownloadError(DataError, OSError):
    """A download failed or its content did not match the expected checksum."""

"""The exception hierarchy of hydra-data.

Every error raised on purpose by this package derives from :class:`DataError`, so callers can
catch one type; every warning about data it accepts derives from :class:`DataWarning`. Messages say what was expected, what was found, and where; an unknown key also
gets the nearest allowed one (:func:`did_you_mean`, shared by every layer's config sections).
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable


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


class ChecksumError(DownloadError):
    """Content whose SHA-256 differs from the one pinned for it (the message names both)."""


class ArchiveError(DataError, ValueError):
    """An archive (tar, zip) that is not one, is damaged, or holds what is refused: a member
    outside the archive's folder, a link, a device, a member or a total over the size bounds."""


class DataWarning(UserWarning):
    """Base class of the warnings hydra-data gives about data it accepts but you should check."""


class DuplicateKeyWarning(DataWarning):
    """A key appears more than once in an extxyz comment line; ASE keeps its last value."""


class CoincidentAtomsWarning(DataWarning):
    """Two atoms of a structure (or an atom and a periodic image of another) nearly coincide."""


QUOTE_CHARS = 200
"""Most characters of file content an error or warning message quotes (:func:`clip`)."""


def clip(text: object, limit: int = QUOTE_CHARS) -> str:
    """``str(text)``, cut to ``limit`` characters with the full length noted when longer, so a
    message that quotes file content stays readable whatever the file holds."""
    text = str(text)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


CLOSE = 0.65
"""Least :class:`difflib.SequenceMatcher` ratio of a suggestion (``epochs`` -> ``num_epoch`` is 0.67;
``num_filters`` -> ``num_conv_layers``, a different key, 0.62)."""


def did_you_mean(unknown: Iterable[object], allowed: Iterable[object]) -> str:
    """`` (did you mean 'lr'?)``: the allowed key closest to each unknown one, compared without
    case (:func:`difflib.get_close_matches`), or ``""`` when none is close. Every unknown-key
    message of the config sections appends it.

    With several unknown keys each suggestion names its key: `` (did you mean 'lr' for 'LR'?)``.
    """
    unknown = [str(k) for k in unknown]
    by_lower: dict[str, str] = {}
    for key in sorted(str(k) for k in allowed):
        by_lower.setdefault(key.lower(), key)
    hints = []
    for key in unknown:
        close = difflib.get_close_matches(key.lower(), list(by_lower), n=1, cutoff=CLOSE)
        if close:
            hints.append(f"{by_lower[close[0]]!r}" + (f" for {key!r}" if len(unknown) > 1 else ""))
    return f" (did you mean {', '.join(hints)}?)" if hints else ""

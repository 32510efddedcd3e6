"""The published data sets a run can name: ``Dataset.name`` ``CuAu_32atoms``, ``FePt_32atoms``, ``FeSi_1024atoms``.

These are the names upstream HydraGNN's README gives for ``["Dataset"]["name"]``: LSMS (locally
self-consistent multiple scattering) DFT output on binary alloys, one text file per structure,
which upstream's first loaders read from ``dataset/<name>/output_files/`` with one reader for all
three (:mod:`hydragnn.data.named.lsms` describes the format). Each :class:`NamedDataset` says where
the raw data comes from, what is confirmed about it, how the download is verified, and the
``Variables`` that upstream's example config (``examples/lsms/lsms.json``) trains on.

What is confirmed (from upstream's repository, its README, its issue tracker and its papers):
the data are DFT output published on the OLCF Constellation (``https://doi.ccs.ornl.gov/``, the
README's "Datasets" section), upstream's wiki page "Datasets" has the instructions, the FePt
set circulates as ``FePt.zip`` (upstream issue #246) and the files hold total energies in
Rydberg (upstream's ``compute_enthalpy.py``). What is not: no direct download URL, DOI number
or checksum of any of the three appears in a source stored for this project, so
:attr:`NamedDataset.url` and :attr:`NamedDataset.sha256` are ``None`` and none is invented.

Hence three ways in, all through the download cache (:mod:`hydragnn.data.named.fetch`):
``HYDRAGNN_DATASET_URL`` (a mirror serving ``<base>/<archive>``, e.g. on an HPC file system or a
web server), ``Dataset.url`` (the archive's own URL or path), or the files placed by hand
where the error message says. Without a published checksum the first download is trusted on
first use: bounded in size, checked by format and content (an archive of LSMS files of the
expected atom count and elements), its SHA-256 recorded and printed, and every later use
verified against that record; ``Dataset.sha256`` pins a checksum you trust instead.

This module imports nothing heavy (no torch): the run config validates the names before torch loads.
"""

from __future__ import annotations

import copy
import os
from dataclasses import dataclass
from typing import Any

__all__ = [
    "ENV_OFFLINE",
    "ENV_URL",
    "LSMS_VARIABLES",
    "NAMED_DATASETS",
    "NamedDataset",
    "named_dataset",
    "offline",
    "resolve_url",
]

ENV_URL = "HYDRAGNN_DATASET_URL"
"""Base URL (``http(s)://``, ``file://``) or folder of a mirror serving ``<base>/<archive>`` for every name."""
ENV_OFFLINE = "HYDRAGNN_OFFLINE"
"""Set to ``1`` (``true``, ``yes``) to forbid any download: only the cache and files placed by hand are used."""

CONSTELLATION = "https://doi.ccs.ornl.gov/"
"""The OLCF Constellation DOI portal, upstream README's source of these data sets."""
WIKI = "https://github.com/ORNL/HydraGNN/wiki/Datasets"
"""Upstream's instructions for the data sets, linked from its README."""

LSMS_VARIABLES: dict[str, list[dict[str, Any]]] = {
    "inputs": [
        {"name": "num_of_protons", "level": "node", "dim": 1},
        {"name": "pos", "level": "node", "dim": 3, "role": "position"},
    ],
    "outputs": [
        {"name": "free_energy_scaled_num_nodes", "level": "graph", "dim": 1},
        {"name": "charge_density", "level": "node", "dim": 1},
        {"name": "magnetic_moment", "level": "node", "dim": 1},
    ],
}
"""Upstream's ``examples/lsms/lsms.json`` as a ``Variables`` section: the atomic number (column 0)
as input; the total energy over the atom count (first line, column 0), the charge density
(column 5 minus the atomic number) and the magnetic moment (column 6) as targets (copy it before
editing: :meth:`NamedDataset.variables` does)."""


@dataclass(frozen=True)
class NamedDataset:
    """One published data set.

    Attributes:
        name: the ``Dataset.name`` that selects it.
        title: what it holds, in words.
        archive: file name of the raw archive: the name asked of a mirror
            (``$HYDRAGNN_DATASET_URL/<archive>``), kept in the download cache and expected when
            placed by hand. Any tar (plain, gz, bz2, xz) or zip is read whatever its name says.
        url: the archive's direct download URL; ``None`` when none is confirmed.
        sha256: its published SHA-256; ``None`` when none is published (trust on first use).
        max_bytes: the largest download accepted.
        n_atoms: atoms in every structure (each file is checked).
        elements: the atomic numbers a structure may hold (each file is checked).
        landing: pages that describe the data set, for fetching it by hand.
        provenance: what is confirmed about the source and how, and what is not.
        format: the raw format (``"lsms"``).
    """

    name: str
    title: str
    archive: str
    url: str | None
    sha256: str | None
    max_bytes: int
    n_atoms: int
    elements: tuple[int, ...]
    landing: tuple[str, ...]
    provenance: str
    format: str = "lsms"

    def variables(self) -> dict[str, list[dict[str, Any]]]:
        """The default ``Variables`` (a fresh copy)."""
        return copy.deepcopy(LSMS_VARIABLES)


_UNCONFIRMED = (
    "Upstream HydraGNN's README lists this name for Dataset.name and says the data are DFT output on the OLCF "
    "Constellation (https://doi.ccs.ornl.gov/), with instructions on its wiki; its first loaders read "
    "dataset/{name}/output_files/ with the LSMS reader. No direct URL, DOI number or checksum of the archive was "
    "found in the sources stored for this project: url and sha256 are unknown (None)."
)


def _lsms_set(
    name: str,
    title: str,
    n_atoms: int,
    elements: tuple[int, int],
    max_gib: int,
    landing: tuple[str, ...] = (),
    note: str = "",
) -> NamedDataset:
    """One of upstream's LSMS sets: archive ``<name>.tar.gz``, no confirmed URL or checksum yet."""
    return NamedDataset(
        name=name,
        title=title,
        archive=f"{name}.tar.gz",
        url=None,
        sha256=None,
        max_bytes=max_gib << 30,
        n_atoms=n_atoms,
        elements=elements,
        landing=(CONSTELLATION, WIKI, *landing),
        provenance=_UNCONFIRMED.format(name=name) + note,
    )


_PROPERTIES = "LSMS DFT (total energy, charges, magnetic moments)"
NAMED_DATASETS: dict[str, NamedDataset] = {
    d.name: d
    for d in (
        _lsms_set("CuAu_32atoms", f"Cu-Au binary alloy, 32-atom cells, {_PROPERTIES}", 32, (29, 79), 16),
        _lsms_set(
            "FePt_32atoms",
            f"Fe-Pt binary alloy, 32-atom BCT cells, {_PROPERTIES}",
            32,
            (26, 78),
            16,
            landing=("https://github.com/ORNL/HydraGNN/issues/246",),
            note=" Upstream issue #246 calls the archive FePt.zip and points to examples/lsms (config lsms.json, "
            "Variables as here); examples/lsms/compute_enthalpy.py reads out_<k> files with the total energy in "
            "Rydberg on the first line (out_0 pure Pt, out_32017 pure Fe). The MLST 2022 paper (doi "
            "10.1088/2632-2153/ac6a51) describes the set: fixed BCT lattice and volume, the whole composition range.",
        ),
        _lsms_set("FeSi_1024atoms", f"Fe-Si binary alloy, 1024-atom cells, {_PROPERTIES}", 1024, (14, 26), 64),
    )
}
"""The registry, by name."""


def named_dataset(name: str) -> NamedDataset | None:
    """The registry entry of ``name`` (exact spelling), or ``None``."""
    return NAMED_DATASETS.get(name) if isinstance(name, str) else None


def resolve_url(entry: NamedDataset, url: str | None = None) -> tuple[str | None, str]:
    """Where to download ``entry``'s archive from, and which setting said so.

    ``url`` (``Dataset.url``) wins, then ``$HYDRAGNN_DATASET_URL/<archive>`` (a mirror), then the
    registry's URL. Returns ``(None, "no URL")`` when none is known.
    """
    if url:
        return url, "Dataset.url"
    base = os.environ.get(ENV_URL, "").strip()
    if base:
        return f"{base.rstrip('/')}/{entry.archive}", f"${ENV_URL}"
    if entry.url:
        return entry.url, "the registry"
    return None, "no URL"


def offline() -> bool:
    """Whether ``$HYDRAGNN_OFFLINE`` forbids downloads."""
    return os.environ.get(ENV_OFFLINE, "").strip().lower() in ("1", "true", "yes", "on")

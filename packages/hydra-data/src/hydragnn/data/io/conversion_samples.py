"""The samples of one file: selected frames parsed, labelled, prepared against the schema and
connected at the cutoff, written to a container (:func:`write_samples`, for
:func:`~hydragnn.data.io.conversion.convert_source`).

Frames are taken :data:`EDGE_CHUNK` at a time and packed column by column, each run of frames
with the same attributes into one :class:`~hydragnn.data.containers.PackedChunk` with one
neighbour search (:mod:`.conversion_packed`); a run that cannot be packed is prepared frame by
frame and searched with :func:`~hydragnn.data.neighbors.search.search_many`, and a structure the
search refuses is named by its file and frame. Atoms closer than :data:`COINCIDENT_ANGSTROM`
(the shortest edge of each structure, from the search's squared lengths) are reported once per
file.
"""

from __future__ import annotations

import itertools
import shutil
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import cast

import hydragnn.data.pyg_import  # noqa: F401 (PyG as HydraGNN needs it)

import numpy as np
import torch
from torch_geometric.data import Data

from ..containers import PackedChunk, write_dataset
from ..errors import CoincidentAtomsWarning, DataError, SchemaError
from ..neighbors import add_edges
from ..neighbors.search import search_many
from ..prepare import prepare
from ..schema import Schema
from .ase_io import arrays_sample
from .ase_labels import FrameLabels, frame_arrays, resolve_outputs
from .ase_source import AseSource, Frame, iter_frames
from .conversion_packed import pack_frames

__all__ = ["COINCIDENT_ANGSTROM", "EDGE_CHUNK", "write_samples"]

COINCIDENT_ANGSTROM = 1e-3
"""Atoms closer than this (Å), periodic images included, are reported as coincident."""
EDGE_CHUNK = 256
"""Frames packed, and searched, together: per-frame tensor operations and the per-call overhead
of the search dominate small structures."""
_EXAMPLES = 3


class _Progress:
    """Frames converted: a tqdm bar on a terminal, a line every ``every_s`` seconds otherwise."""

    def __init__(self, desc: str, log: Callable[[str], None] | None, every_s: float = 30.0) -> None:
        self.log, self.every_s, self.count = log, every_s, 0
        self.t0 = self.last = time.perf_counter()
        self.bar = None
        if log is not None and sys.stderr.isatty():
            from tqdm import tqdm

            self.bar = tqdm(desc=desc, unit="frame", leave=False, dynamic_ncols=True)
        self.desc = desc

    def step(self) -> None:
        self.count += 1
        if self.bar is not None:
            self.bar.update(1)
        elif self.log is not None and time.perf_counter() - self.last >= self.every_s:
            self.last = time.perf_counter()
            rate = self.count / max(self.last - self.t0, 1e-9)
            self.log(f"{self.desc}: {self.count} frames ({rate:.0f}/s)")

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def write_samples(
    source: AseSource,
    schema: Schema | None,
    cutoff: float,
    container_format: str,
    data_path: Path,
    digest: str,
    log: Callable[[str], None] | None,
) -> tuple[Schema, list[tuple[int, float]], dict[str, int], dict[str, int]]:
    """Parse, label, prepare and connect every selected frame of ``source`` and write them to
    ``data_path`` (in a private folder the caller removes on failure: removed here too).

    Returns:
        The resolved schema, the isolated-atom energies ``(Z, eV)``, the frame and sample counts
        and the frames skipped per config type.
    """
    path = source.path
    isolated: list[tuple[int, float]] = []
    skipped: dict[str, int] = {}
    counts = {"frames": 0, "samples": 0}
    coincident = _CoincidentAtoms(path)
    frames = iter_frames(source, skipped)
    progress = _Progress(f"converting {path.name}", log)

    def samples_of(first: Frame | None, resolved: Schema, outputs) -> Iterator[Data | PackedChunk]:
        frame, chunk = first, []
        while frame is not None:
            chunk.append((frame.where, counts["samples"], frame_arrays(frame.atoms, outputs, frame.where)))
            counts["samples"] += 1
            progress.step()
            frame = _next_sample(frames, source, isolated, counts)
            if len(chunk) == EDGE_CHUNK or frame is None:
                yield from _chunk_samples(chunk, resolved, cutoff, coincident)
                chunk = []

    try:
        first = _next_sample(frames, source, isolated, counts)
        if first is None:
            raise DataError(
                f"{path}: no frame selected (index {source.index!r}, config_types {source.config_types}, "
                f"skipped by config type: {skipped or 'none'}, isolated atoms: {len(isolated)})"
            )
        resolved, outputs = resolve_outputs(source, first.atoms, schema, first.where)
        write_dataset(
            data_path,
            samples_of(first, resolved, outputs),
            container_format,
            schema=resolved,
            metadata={"source": str(path), "digest": digest},
        )
    except BaseException:
        shutil.rmtree(data_path.parent, ignore_errors=True)
        raise
    finally:
        progress.close()
    coincident.warn()
    return resolved, isolated, counts, skipped


def _chunk_samples(
    chunk: list[tuple[str, int, dict[str, np.ndarray]]], schema: Schema, cutoff: float, coincident: _CoincidentAtoms
) -> list[Data | PackedChunk]:
    """The prepared samples of ``chunk`` (``(where, sample index, frame arrays)``) with their
    edges: a packed chunk (:func:`~.conversion_packed.pack_frames`) per run of frames with the
    same attributes (periodic cells and molecules mixed make several runs) or, for a run that
    cannot be packed, one sample per frame (any error names the frame)."""
    out: list[Data | PackedChunk] = []
    for _, run in itertools.groupby(chunk, key=lambda item: list(item[2])):
        run = list(run)
        packed = pack_frames([arrays for _, _, arrays in run], schema, cutoff)
        if packed is None:
            out.extend(_each_frame(run, schema, cutoff, coincident))
            continue
        samples, shortest = packed
        near = (shortest < COINCIDENT_ANGSTROM).nonzero().flatten().tolist()
        if near:
            each = list(samples.samples())
            for j in near:
                coincident.check(each[j], run[j][0])
        out.append(samples)
    return out


def _each_frame(
    run: list[tuple[str, int, dict[str, np.ndarray]]], schema: Schema, cutoff: float, coincident: _CoincidentAtoms
) -> list[Data]:
    """The frames of ``run`` prepared one by one, with their edges (:func:`_edges_of`)."""
    prepared = []
    for where, index, arrays in run:
        try:
            prepared.append((where, prepare(arrays_sample(arrays), schema, index=index)))
        except SchemaError as exc:
            raise SchemaError(f"{where}: {exc}") from None
    return _edges_of(prepared, cutoff, coincident)


def _edges_of(chunk: list[tuple[str, Data]], cutoff: float, coincident: _CoincidentAtoms) -> list[Data]:
    """The samples of ``chunk`` (``(where, sample)`` pairs) with their edges, from one neighbour
    search, checked for coincident atoms; a structure the search refuses is named by its file
    and frame."""
    try:
        many = search_many([sample for _, sample in chunk], cutoff)
    except DataError:
        pass
    else:
        shortest = many.shortest().tolist()
        samples = many.split()
        for (where, _), sample, length in zip(chunk, samples, shortest):
            if length < COINCIDENT_ANGSTROM:
                coincident.check(sample, where)
        return samples
    out = []
    for where, sample in chunk:  # one by one, to name the frame at fault
        try:
            out.append(add_edges(sample, cutoff))
        except DataError as exc:
            raise type(exc)(f"{where}: {exc}") from None
        coincident.check(out[-1], where)
    return out


def _next_sample(
    frames: Iterator[Frame], source: AseSource, isolated: list[tuple[int, float]], counts: dict[str, int]
) -> Frame | None:
    """The next frame that is a sample; isolated-atom frames on the way go to ``isolated``."""
    for frame in frames:
        counts["frames"] += 1
        if len(frame.atoms) == 0:  # no energy per atom, no graph: a damaged or truncated file
            raise SchemaError(
                f"{frame.where}: a frame with no atoms; remove it from the file or leave it out with the "
                "Dataset 'index' selection"
            )
        if not frame.isolated:
            return frame
        atoms = frame.atoms
        if len(atoms) != 1:
            raise SchemaError(f"{frame.where}: an IsolatedAtom frame must hold one atom, found {len(atoms)}")
        key = source.energy_key
        if key is None:
            continue
        labels = FrameLabels.of(atoms)
        if key not in labels.values:
            raise SchemaError(
                f"{frame.where}: no label {key!r} for the energy of this IsolatedAtom frame; it has {labels.describe()}"
            )
        try:
            energy = float(np.asarray(labels.values[key][1], dtype=np.float64).reshape(()))
        except (TypeError, ValueError):
            raise SchemaError(f"{frame.where}: label {key!r} of an IsolatedAtom frame is not one number") from None
        isolated.append((int(atoms.numbers[0]), energy))
    return None


class _CoincidentAtoms:
    """Counts the frames of one file with atoms closer than ``COINCIDENT_ANGSTROM`` (from the
    edges the conversion builds) and warns once for the file, naming the first ``_EXAMPLES``."""

    def __init__(self, path: Path) -> None:
        self.path, self.frames, self.examples = path, 0, []

    def check(self, data: Data, where: str) -> None:
        pair = _coincident_pair(data)
        if pair is None:
            return
        self.frames += 1
        if len(self.examples) < _EXAMPLES:
            where = where.removeprefix(f"{self.path}: ")
            self.examples.append(f"{where}: atoms {pair[0]} and {pair[1]}, {pair[2]:.2g} Å apart")

    def warn(self) -> None:
        if not self.frames:
            return
        n, shown = self.frames, self.examples
        warnings.warn(
            f"{self.path}: {n} frame{'s' if n != 1 else ''} with atoms closer than {COINCIDENT_ANGSTROM} Å "
            f"({'; '.join(shown)}{'; ...' if n > len(shown) else ''}); they are converted as given: check the file",
            CoincidentAtomsWarning,
            stacklevel=3,
        )


def _coincident_pair(data: Data) -> tuple[int, int, float] | None:
    """``(i, j, distance)``, ``i < j``, of the closest edge shorter than :data:`COINCIDENT_ANGSTROM`
    (edges cover periodic images), or ``None``: one pass over the edges already built."""
    src, dst = cast(torch.Tensor, data.edge_index)  # a prepared sample with its edges built
    if src.numel() == 0:
        return None
    pos = cast(torch.Tensor, data.pos)
    vec = pos[src] - pos[dst]
    shift = getattr(data, "edge_shift", None)
    if shift is not None:
        vec = vec + shift.to(vec.dtype)
    dist = torch.linalg.vector_norm(vec, dim=1)
    k = int(torch.argmin(dist))
    if not dist[k] < COINCIDENT_ANGSTROM:
        return None
    i, j = sorted((int(src[k]), int(dst[k])))
    return i, j, float(dist[k])

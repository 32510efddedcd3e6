"""The data of a run: the ``Dataset`` section turned into prepared train / validation / test splits.

* A ``generator`` (EMT reference set) is generated and prepared against the schema.
* A ``path`` to a prepared container is used as stored: a container with a schema whose samples
  are prepared is authoritative (nothing is re-prepared; only missing edges are built), and a
  ``Variables`` section that disagrees with the stored schema is an error. A container of raw
  samples is prepared against ``Variables`` (or its stored schema).
* A ``path`` or ``train_file`` / ``valid_file`` / ``test_file`` that ASE reads is converted once
  into a cached prepared container (:func:`hydragnn.data.convert_source`); the validation and
  test files are read with the training file's schema. Under torchrun rank 0 converts first, the
  other ranks then read the cache.
* A ``name`` alone of a published data set (``FePt_32atoms``, ...) is downloaded once, parsed
  and prepared into a cached container (:func:`hydragnn.data.prepare_named_dataset`; rank 0
  first, as for conversions), then split like a ``path``.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import hydragnn.data.pyg_import  # noqa: F401 (PyG as HydraGNN needs it)

import torch
from torch_geometric.data import Data

from hydragnn.data import (
    AseSource,
    DataError,
    Schema,
    add_edges,
    add_positional_encodings,
    convert_source,
    open_dataset,
    prepare_named_dataset,
)
from hydragnn.data.containers.api import detect_format
from hydragnn.data.emt import CUAU_VARIABLES
from hydragnn.data.prepare import prepare

from .config import RunConfig
from .config_dataset import DatasetConfig
from .errors import ConfigError
from .split import composition, split_indices

if TYPE_CHECKING:
    from hydragnn.data.io.conversion import ConvertedSource

__all__ = [
    "RunData",
    "container_samples",
    "cuau_samples",
    "evaluation_samples",
    "load_run_data",
    "prepare_samples",
]

_DERIVED = ("x", "y", "y_loc")


@dataclass
class RunData:
    """Prepared splits of a run.

    Attributes:
        schema: the schema of every sample (the config's, the container's or the one inferred).
        train, val, test: prepared samples with edges (``val`` / ``test`` ``None`` when empty).
        isolated_atoms: ``(Z, energy)`` of the training file's ``IsolatedAtom`` frames.
        files: one dict per converted file: ``path``, ``samples``, ``cached``, ``seconds``, ``entry``,
            ``sha256`` (of the file's content).
        heads, head_weights, parts: for ``Dataset.sources``, the source names (one energy head
            each), their loss weights and each source's own :class:`RunData` (its samples carry
            ``head``, the index of their source); empty for one source.
    """

    schema: Schema
    train: list[Data]
    val: list[Data] | None
    test: list[Data] | None
    isolated_atoms: tuple[tuple[int, float], ...] = ()
    files: list[dict[str, Any]] = field(default_factory=list)
    heads: list[str] = field(default_factory=list)
    head_weights: list[float] = field(default_factory=list)
    parts: list[RunData] = field(default_factory=list)

    @property
    def species(self) -> list[int] | None:
        """Sorted atomic numbers of every split (``None`` without atomic numbers)."""
        parts = [s for split in (self.train, self.val, self.test) if split for s in split]
        if not parts or getattr(parts[0], "atomic_number", None) is None:
            return None
        return sorted({int(v) for s in parts for v in s.atomic_number.reshape(-1).tolist()})


def cuau_samples(n_structures: int, seed: int) -> list:
    """The EMT ``CuAu_32atoms`` reference set, with derived graph targets added:
    ``au_fraction [1, 1]`` (fraction of Au atoms), ``volume_per_atom [1, 1]`` (Å³) and
    ``pressure [1, 1]`` (``-trace(stress) / 3`` in eV/Å³)."""
    from hydragnn.data.emt import generate_cuau

    samples = generate_cuau(n_structures=n_structures, seed=seed)
    for s in samples:
        n = int(s.atomic_number.shape[0])
        dtype = cast(torch.Tensor, s.pos).dtype  # generated structures have positions
        s.au_fraction = (s.atomic_number == 79).sum().reshape(1, 1).to(dtype) / n
        s.volume_per_atom = torch.linalg.det(s.cell.reshape(3, 3).double()).abs().reshape(1, 1).to(dtype) / n
        s.pressure = -s.stress.reshape(-1)[:3].mean().reshape(1, 1)
    return samples


def _has_pe(data, pe_dim: int) -> bool:
    lap, rw = getattr(data, "lap_pe", None), getattr(data, "rw_pe", None)
    n = data.num_nodes
    return all(t is not None and tuple(t.shape) == (n, pe_dim) for t in (lap, rw))


def _complete(data: Data, cutoff: float, pe_dim: int) -> Data:
    """Edges where missing, positional encodings where the model needs them and they are missing."""
    if getattr(data, "edge_index", None) is None:
        data = add_edges(data, cutoff)
    if pe_dim > 0 and not _has_pe(data, pe_dim):
        data = add_positional_encodings(data, pe_dim)
    return data


def prepare_samples(raw: Sequence, schema: Schema, cutoff: float, pe_dim: int = 0) -> list:
    """Prepare raw samples against ``schema`` and build edges at ``cutoff`` where a sample has none.

    With ``pe_dim > 0`` (``Architecture.pe_dim``, GPS) every sample also gets the positional
    encodings ``lap_pe`` / ``rw_pe [N, pe_dim]`` of its edges
    (:func:`hydragnn.data.add_positional_encodings`), unless it already carries them with that width.
    """
    return [_complete(prepare(sample, schema, index=i), cutoff, pe_dim) for i, sample in enumerate(raw)]


def _categories(ds: Any, samples: Sequence[Data]) -> list[tuple[tuple[int, int], ...]] | None:
    return [composition(s, i) for i, s in enumerate(samples)] if ds.compositional_stratified_splitting else None


def _is_prepared(sample: Data) -> bool:
    return all(getattr(sample, key, None) is not None for key in _DERIVED)


def container_samples(path: Path, schema: Schema | None, cutoff: float, pe_dim: int) -> tuple[Schema, list[Data]]:
    """Samples of a dataset container: used as stored when prepared with a stored schema (only
    missing edges and positional encodings are added), else prepared against ``schema`` (or the
    stored one).

    Raises:
        ConfigError: a ``schema`` other than the stored one of a prepared container, or raw
            samples without any schema.
    """
    container = open_dataset(path, validate=True)  # stored prepared samples skip prepare(): check them on reading
    raw = [container[i] for i in range(len(container))]
    stored = container.schema
    if stored is not None and raw and _is_prepared(raw[0]):
        if schema is not None and schema != stored:
            raise ConfigError(
                f"Variables: differ from the schema stored with the prepared dataset {path} (stored: "
                f"{stored.to_dict()}); a prepared dataset is used as stored: leave Variables out or re-prepare it"
            )
        return stored, [_complete(s, cutoff, pe_dim) for s in raw]
    schema = schema or stored
    if schema is None:
        raise ConfigError(f"Variables: required: {path} holds raw samples without a stored schema")
    return schema, prepare_samples(raw, schema, cutoff, pe_dim)


def _container(ds: DatasetConfig, schema: Schema | None, pe_dim: int) -> tuple[Schema, list[Data]]:
    """``Dataset.path`` naming a container (label options are refused: they are for ASE files)."""
    path = Path(cast(str, ds.path))  # a container path: the caller's detect_format() found one
    given = sorted(ds.explicit_keys) or [k for k, d in (("index", ":"), ("config_types", None)) if getattr(ds, k) != d]
    if given:
        raise ConfigError(
            f"Dataset: {path} is a prepared dataset container; label keys, index and config_types are "
            f"for files ASE reads (found {given})"
        )
    if ds.format is not None and detect_format(path) != ds.format:
        raise ConfigError(f"Dataset.format: {path} is a {detect_format(path)!r} container, not {ds.format!r}")
    return container_samples(path, schema, _cutoff(ds), pe_dim)


def evaluation_samples(
    path: str | os.PathLike[str],
    schema: Schema,
    cutoff: float,
    pe_dim: int = 0,
    labels: dict[str, Any] | None = None,
    log: Callable[[str], None] | None = None,
) -> list[Data]:
    """The samples of a dataset container or of a file ASE reads, prepared against a model's schema.

    Args:
        path: a container, or a file ASE reads (converted once and cached, as for training).
        schema: the model's schema (a file must carry a label for every output).
        cutoff: the model's cutoff.
        pe_dim: the model's positional-encoding width.
        labels: :class:`~hydragnn.data.AseSource` keyword arguments for a file (``energy_key``,
            ``forces_key``, ``stress_key``, ``extra_keys``, ``index``, ``config_type_key``).
    """
    path = Path(path)
    if detect_format(path) is not None:
        return container_samples(path, schema, cutoff, pe_dim)[1]
    converted = convert_source(AseSource(path, **(labels or {})), cutoff=cutoff, schema=schema, log=log)
    return [_complete(converted.dataset[i], cutoff, pe_dim) for i in range(len(converted.dataset))]


def _cutoff(ds: DatasetConfig) -> float:
    """``Dataset.cutoff`` as a float (the run config fills it from the model radius when left out)."""
    return float(cast(float, ds.cutoff))


def _source(ds: DatasetConfig, file: str) -> AseSource:
    return AseSource(
        Path(file),
        energy_key=ds.energy_key,
        forces_key=ds.forces_key,
        stress_key=ds.stress_key,
        extra_keys=ds.keys,
        explicit=ds.explicit_keys,
        index=ds.index,
        config_types=ds.config_types,
        config_type_key=ds.config_type_key,
        format=ds.file_format,
    )


def load_run_data(
    cfg: RunConfig,
    *,
    is_main: bool = True,
    barrier: Callable[[], None] = lambda: None,
    log: Callable[[str], None] | None = None,
) -> RunData:
    """The prepared splits of ``cfg.dataset`` (see the module docstring).

    Args:
        cfg: the run config.
        is_main: this process converts files first (rank 0).
        barrier: waits for every rank (called around conversions).
        log: receives progress lines (conversions, cache hits).

    Raises:
        ConfigError: a dataset that contradicts the config (keys for a container, a schema
            mismatch, ...). hydra-data's errors (unreadable files, missing labels naming the
            file and frame) pass through.
    """
    ds = cfg.dataset
    if ds.sources:
        return _load_sources(cfg, is_main, barrier, log)
    cutoff = _cutoff(ds)
    pe_dim = cfg.model_config.attention.pe_dim
    files: list[dict[str, Any]] = []

    def convert(file: str, schema: Schema | None) -> tuple[ConvertedSource, list[Data]]:
        def run(logged: bool) -> ConvertedSource:
            return convert_source(
                _source(ds, file),
                cutoff=cutoff,
                schema=schema,
                cache_dir=ds.cache_dir,
                container_format=ds.cache_format,
                verify=ds.cache_verify,
                log=log if logged else None,
            )

        result = run(logged=True) if is_main else None  # rank 0 converts; the others then open its cache
        barrier()
        if result is None:
            result = run(logged=False)
        files.append(
            {
                "path": file,
                "samples": len(result.dataset),
                "cached": result.cached,
                "seconds": result.seconds,
                "entry": str(result.entry),
                "sha256": result.record["fingerprint"]["file"]["sha256"],
            }
        )
        samples = [_complete(result.dataset[i], cutoff, pe_dim) for i in range(len(result.dataset))]
        return result, samples

    isolated: tuple[tuple[int, float], ...] = ()
    if ds.train_file is not None:
        train_result, train = convert(ds.train_file, cfg.schema)
        schema, isolated = train_result.schema, train_result.isolated_atoms
        val = convert(ds.valid_file, schema)[1] if ds.valid_file is not None else None
        test = convert(ds.test_file, schema)[1] if ds.test_file is not None else None
        if val is None and ds.valid_fraction > 0:
            fractions = (1.0 - ds.valid_fraction, ds.valid_fraction, 0.0)
            keep, held, _ = split_indices(len(train), fractions, ds.seed, _categories(ds, train))
            train, val = [train[i] for i in keep], [train[i] for i in held]
        return RunData(schema, train, val or None, test or None, isolated, files)

    if ds.named:
        schema, samples = _named_samples(cfg, is_main, barrier, log, files)
    elif ds.generator is not None:
        schema = cfg.schema or Schema.from_dict(CUAU_VARIABLES)
        samples = prepare_samples(cuau_samples(ds.generator.n_structures, ds.generator.seed), schema, cutoff, pe_dim)
    elif detect_format(Path(cast(str, ds.path))) is not None:  # else ``path`` is given (DatasetConfig.from_dict)
        schema, samples = _container(ds, cfg.schema, pe_dim)
    else:
        result, samples = convert(cast(str, ds.path), cfg.schema)
        schema, isolated = result.schema, result.isolated_atoms
    try:
        train_idx, val_idx, test_idx = split_indices(len(samples), ds.split, ds.seed, _categories(ds, samples))
    except ValueError as exc:
        raise DataError(str(exc)) from None
    pick = lambda idx: [samples[i] for i in idx] or None  # noqa: E731
    train = cast("list[Data]", pick(train_idx))  # split_indices leaves at least one training sample
    return RunData(schema, train, pick(val_idx), pick(test_idx), isolated, files)


def _named_samples(
    cfg: RunConfig, is_main: bool, barrier: Callable[[], None], log, files: list[dict[str, Any]]
) -> tuple[Schema, list[Data]]:
    """The published data set ``Dataset.name``, prepared and cached by hydra-data (rank 0 first,
    then the other ranks open the cache); its raw archive joins ``files`` (the run's fingerprint)."""
    ds, pe_dim = cfg.dataset, cfg.model_config.attention.pe_dim
    cutoff = _cutoff(ds)
    named = dict(cutoff=cutoff, schema=cfg.schema, cache_dir=ds.cache_dir, container_format=ds.cache_format,
                 url=ds.url, sha256=ds.sha256, verify=ds.cache_verify)  # fmt: skip
    result = prepare_named_dataset(ds.name, log=log, **named) if is_main else None
    barrier()
    if result is None:
        result = prepare_named_dataset(ds.name, **named)
    files.append(
        {"path": (result.record.get("raw") or {}).get("path", ds.name), "samples": len(result.dataset),
         "cached": result.cached, "seconds": result.seconds, "entry": str(result.entry),
         "sha256": result.record["fingerprint"]["file"].get("sha256")}
    )  # fmt: skip
    return result.schema, [_complete(result.dataset[i], cutoff, pe_dim) for i in range(len(result.dataset))]


def _load_sources(cfg: RunConfig, is_main: bool, barrier: Callable[[], None], log) -> RunData:
    """Every source of ``Dataset.sources`` loaded as a dataset of its own, its samples tagged with
    ``head`` (the source's index), then merged split by split."""
    parts = []
    for k, source in enumerate(cfg.dataset.sources):
        part = load_run_data(dataclasses.replace(cfg, dataset=source), is_main=is_main, barrier=barrier, log=log)
        for split in (part.train, part.val, part.test):
            for sample in split or ():
                sample.head = torch.tensor([k], dtype=torch.long)
        if parts and part.schema != parts[0].schema:
            raise ConfigError(
                f"Dataset.sources[{k}] ({source.name!r}): its outputs {[v.name for v in part.schema.outputs]} differ "
                f"from those of {cfg.dataset.sources[0].name!r} {[v.name for v in parts[0].schema.outputs]}; every "
                "source must label the same outputs (set the keys so they do)"
            )
        parts.append(part)

    def merged(name: str) -> list[Data] | None:
        out = [s for part in parts for s in (getattr(part, name) or ())]
        return out or None

    return RunData(
        schema=parts[0].schema,
        train=cast("list[Data]", merged("train")),  # every source has training samples
        val=merged("val"),
        test=merged("test"),
        files=[f for part in parts for f in part.files],
        heads=[s.name for s in cfg.dataset.sources],
        head_weights=[s.weight for s in cfg.dataset.sources],
        parts=parts,
    )

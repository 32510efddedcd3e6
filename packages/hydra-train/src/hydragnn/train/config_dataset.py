"""The ``Dataset`` section: where the structures come from and how their labels are read.

Exactly one source:

* ``path``: a prepared container (pickle / ``.pt`` / ADIOS2, used as stored) or any file ASE
  reads, split by ``split`` [0.8, 0.1, 0.1];
* ``train_file`` (+ ``valid_file``, ``test_file``): files ASE reads; without ``valid_file``,
  ``valid_fraction`` [0.1] of the training file validates;
* ``generator``: the EMT reference sets (``{"name": "cuau", "n_structures": 200, "seed": 0}``);
* none of these, and a ``name`` of a published data set upstream HydraGNN names
  (``CuAu_32atoms``, ``FePt_32atoms``, ``FeSi_1024atoms``; :mod:`hydragnn.data.named.datasets`):
  its LSMS archive is fetched once (``url`` [none] or ``$HYDRAGNN_DATASET_URL/<archive>``,
  ``sha256`` [none] a checksum you trust), prepared against ``Variables`` (default: upstream's
  ``examples/lsms/lsms.json``), cached under ``cache_dir`` [``$HYDRAGNN_CACHE`` or
  ``~/.cache/hydragnn``] and split by ``split``; with another source ``name`` only names the run;
* ``sources``: a list of the above, each with a ``name`` and a loss ``weight`` [1.0]: one
  interatomic potential with one energy head per source (``Architecture.energy_heads``), e.g.
  your own data next to a replayed slice of the data a model was first trained on. Sources take
  ``cutoff``, ``seed``, ``cache_dir``, ``cache_format`` and ``cache_verify`` from the top level
  unless they set them; ``compositional_stratified_splitting`` [false] keeps each composition's
  share in every split (:mod:`hydragnn.train.split`).

For files ASE reads: ``energy_key`` ["energy"], ``forces_key`` ["forces"], ``stress_key`` ["stress"]
name those labels (null: not trained on), ``keys`` any other head; ``index`` [":"] slices the frames, ``config_types`` keeps only those config types (``config_type_key`` ["config_type"]),
``file_format`` names an ``ase.io`` format the extension does not reveal. Each file is converted
once into a prepared container (``cache_format`` ["pt"] or ``"adios"``) under ``cache_dir``
[``<file's folder>/.hydragnn_cache``] and reused until the file, the keys, the schema or the
cutoff change (a file under 64 MiB is known by its sha256, a larger one by path, size and mtime
unless ``cache_verify`` is ``"hash"``). Relative paths are relative to the config file's folder
(the working folder for a dict); the completed config stores them absolute.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hydragnn.data import config_parse as cp
from hydragnn.data.errors import did_you_mean
from hydragnn.data.named.datasets import NAMED_DATASETS, named_dataset

from .errors import ConfigError

__all__ = ["DatasetConfig", "GeneratorConfig"]

CONTAINER_FORMATS = ("pickle", "pt", "adios")
CACHE_FORMATS = ("pt", "adios")
GENERATORS = ("cuau",)
LABEL_KEYS = ("energy_key", "forces_key", "stress_key")
_FILES = ("path", "train_file", "valid_file", "test_file")
_NAMED_ONLY = ("url", "sha256")
_ASE_ONLY = (*LABEL_KEYS, "keys", "index", "config_types", "config_type_key", "file_format", "cache_verify")
_NOT_JSON = {"explicit_keys"}
"""Fields that are no JSON key."""


def _split(split: Any, where: str, error: cp.Error) -> tuple[float, float, float]:
    if not isinstance(split, list) or len(split) != 3:
        raise error(f"{where}: expected [train, val, test] fractions, found {split!r}")
    fr = tuple(cp.parse_value(s, float, f"{where}[{i}]", error) for i, s in enumerate(split))
    if any(f < 0 for f in fr) or fr[0] <= 0 or abs(sum(fr) - 1.0) > 1e-6:
        raise error(f"{where}: expected fractions >= 0 (train > 0) summing to 1, found {split!r}")
    return fr  # type: ignore[return-value]


def _keys(values: Any, where: str, error: cp.Error) -> tuple[tuple[str, str], ...]:
    if values is None:
        return ()
    if not isinstance(values, Mapping):
        raise error(f"{where}: expected an object {{output name: file label}}, found {type(values).__name__}")
    out = []
    for name, label in values.items():
        if name in ("energy", "forces", "stress"):
            raise error(f"{where}.{name}: give the label of {name!r} with '{name}_key'")
        out.append((name, cp.parse_value(label, str, f"{where}.{name}", error)))
    return tuple(out)


def _index(index: Any, where: str, error: cp.Error) -> str:
    from ase.utils import string2index

    if isinstance(index, int) and not isinstance(index, bool):
        index = str(index)
    index = cp.parse_value(index, str, where, error)
    try:
        string2index(index)
    except ValueError as exc:
        raise error(
            f"{where}: expected an ase.io index such as ':', '10:', '::2' or '-5:', found {index!r} ({exc})"
        ) from None
    return index


def _sha256(value: Any, where: str, error: cp.Error) -> str | None:
    if value is None:
        return None
    text = cp.parse_value(value, str, where, error).strip().lower()
    if len(text) != 64 or any(c not in "0123456789abcdef" for c in text):
        raise error(f"{where}: expected the archive's SHA-256 as 64 hexadecimal characters, found {value!r}")
    return text


def _config_types(types: Any, where: str, error: cp.Error) -> tuple[str, ...] | None:
    if types is None:
        return None
    types = [types] if isinstance(types, str) else types
    if not isinstance(types, list) or not types:
        raise error(f"{where}: expected a config type or a non-empty list of them, found {types!r}")
    return tuple(cp.parse_value(t, str, f"{where}[{i}]", error) for i, t in enumerate(types))


@dataclass(frozen=True)
class GeneratorConfig:
    """``Dataset.generator``: name ["cuau"], n_structures [200], seed [0]."""

    name: str = field(default="cuau", metadata={"choices": GENERATORS})
    n_structures: int = field(default=200, metadata={"min": 1})
    seed: int = field(default=0, metadata={"min": 0})


@dataclass(frozen=True)
class DatasetConfig:
    """A validated ``Dataset`` section (see the module docstring for the keys).

    Field annotations and metadata are the keys' types and ranges (parsed by
    :mod:`hydragnn.data.config_parse`); :meth:`from_dict` adds the rules between keys and
    resolves paths. ``explicit_keys`` (not a JSON key) holds the outputs whose label key the
    user gave: those labels must exist; a default key only adds its output when the file
    carries the label.
    """

    name: str = "dataset"
    path: str | None = None
    format: str | None = field(default=None, metadata={"choices": CONTAINER_FORMATS})
    generator: GeneratorConfig | None = None
    train_file: str | None = None
    valid_file: str | None = None
    test_file: str | None = None
    split: tuple[float, float, float] = field(default=(0.8, 0.1, 0.1), metadata={"parse": _split})
    valid_fraction: float = field(default=0.1, metadata={"min": 0, "lt": 1})
    compositional_stratified_splitting: bool = False
    seed: int = field(default=0, metadata={"min": 0})
    cutoff: float | None = field(default=None, metadata={"gt": 0.0})
    energy_key: str | None = "energy"
    forces_key: str | None = "forces"
    stress_key: str | None = "stress"
    keys: tuple[tuple[str, str], ...] = field(default=(), metadata={"parse": _keys})
    explicit_keys: frozenset[str] = frozenset()
    index: str = field(default=":", metadata={"parse": _index})
    config_types: tuple[str, ...] | None = field(default=None, metadata={"parse": _config_types})
    config_type_key: str = "config_type"
    file_format: str | None = None
    cache_dir: str | None = None
    cache_format: str = field(default="pt", metadata={"choices": CACHE_FORMATS})
    cache_verify: str = field(default="auto", metadata={"choices": ("auto", "hash")})
    url: str | None = None
    sha256: str | None = field(default=None, metadata={"parse": _sha256})
    sources: tuple[DatasetConfig, ...] = ()
    weight: float = field(default=1.0, metadata={"min": 0.0})

    @property
    def named(self) -> bool:
        """Whether the data is the published data set ``name`` (no other source given)."""
        return not self.sources and self.path is None and self.train_file is None and self.generator is None

    @property
    def files(self) -> dict[str, str]:
        """``{"train"|"valid"|"test": path}`` of a ``train_file`` dataset (empty otherwise)."""
        out = {"train": self.train_file, "valid": self.valid_file, "test": self.test_file}
        return {k: v for k, v in out.items() if v is not None}

    def missing_files(self, where: str = "Dataset") -> list[str]:
        """``"<where>.<key>: <path>"`` for every ``train_file`` / ``valid_file`` / ``test_file`` /
        ``path`` (of each source too) that does not exist: what the command line checks before
        loading torch."""
        if self.sources:
            return [m for i, src in enumerate(self.sources) for m in src.missing_files(f"{where}.sources[{i}]")]
        given = {f"{kind}_file": path for kind, path in self.files.items()}
        if self.path is not None:
            given["path"] = self.path
        return [f"{where}.{key}: {path}" for key, path in given.items() if not Path(path).exists()]

    @classmethod
    def from_dict(cls, values: Any, where: str = "Dataset", base: Path | None = None) -> DatasetConfig:
        """Parse a ``Dataset`` section; relative paths are resolved against ``base`` (default: cwd).

        Raises:
            ConfigError: naming ``Dataset.<key>``.
        """
        allowed = cp.section_keys(cls) - _NOT_JSON
        in_source = ".sources[" in where
        v = cp.check_keys(values, where, allowed - {"sources"} if in_source else allowed, ConfigError)
        if v.get("sources") is not None:
            return cls._with_sources(v, where, base)
        if "weight" in v and not in_source:
            raise ConfigError(f"{where}.weight: only for an entry of Dataset.sources")
        kw = cp.parse_fields(cls, v, where, ConfigError, skip={"sources", *_NOT_JSON})
        for key in (*_FILES, "cache_dir"):
            if kw.get(key):
                kw[key] = str((base or Path.cwd()) / Path(kw[key]).expanduser())
        if kw.get("url") and "://" not in kw["url"]:  # a path, relative to the config's folder
            kw["url"] = str((base or Path.cwd()) / Path(kw["url"]).expanduser())
        sources = [k for k in ("path", "generator", "train_file") if kw.get(k) is not None]
        name = kw.get("name", cls.name)
        if len(sources) > 1 or (not sources and named_dataset(name) is None):
            hint = did_you_mean([name], NAMED_DATASETS) if not sources else ""
            raise ConfigError(
                f"{where}: give exactly one of 'path' (a dataset container or a file ASE reads), 'train_file' "
                f"(with optional 'valid_file' / 'test_file') or 'generator', or as 'name' alone a published data set "
                f"({', '.join(NAMED_DATASETS)}); found {sources or f'none, and name {name!r}{hint}'}"
            )
        given = sorted(k for k in _NAMED_ONLY if kw.get(k) is not None)
        if given and sources:
            raise ConfigError(f"{where}.{given[0]}: only for a published data set selected by 'name' alone")
        if not sources:
            ase_only = sorted(k for k in (*_ASE_ONLY, "format") if k in v and k != "cache_verify")
            if ase_only:
                raise ConfigError(
                    f"{where}.{ase_only[0]}: not for the published data set {name!r} (LSMS files, read as published)"
                )
        for key in ("valid_file", "test_file"):
            if kw.get(key) is not None and kw.get("train_file") is None:
                raise ConfigError(f"{where}.{key}: only together with 'train_file'")
        train_file = kw.get("train_file") is not None
        if "split" in v and train_file:
            raise ConfigError(
                f"{where}.split: a 'train_file' dataset takes 'valid_file' / 'test_file' or 'valid_fraction', not 'split'"
            )
        if "valid_fraction" in v and (not train_file or kw.get("valid_file") is not None):
            raise ConfigError(f"{where}.valid_fraction: only for a 'train_file' dataset without 'valid_file'")
        if kw.get("generator") is not None:
            given = sorted(k for k in _ASE_ONLY if k in v)
            if given:
                raise ConfigError(f"{where}.{given[0]}: only for files ASE reads, not for a 'generator' dataset")
        explicit = {key.removesuffix("_key") for key in LABEL_KEYS if key in v and kw[key] is not None}
        kw["explicit_keys"] = frozenset(explicit | {name for name, _ in kw.get("keys", ())})
        return cls(**kw)

    @classmethod
    def _with_sources(cls, v: dict[str, Any], where: str, base: Path | None) -> DatasetConfig:
        """A section of ``sources`` (see the module docstring)."""
        mixed = sorted(set(v) - {"name", "seed", "cutoff", "cache_dir", "cache_format", "cache_verify", "sources"})
        if mixed:
            raise ConfigError(f"{where}.{mixed[0]}: give it inside each entry of {where}.sources, not next to it")
        if not isinstance(v["sources"], list) or not v["sources"]:
            raise ConfigError(f"{where}.sources: expected a non-empty list of data sources, found {v['sources']!r}")
        verify = v.get("cache_verify")
        top = cls.from_dict(
            {k: v[k] for k in v if k not in ("sources", "cache_verify")} | {"generator": {}}, where, base
        )
        if verify is not None:
            top = dataclasses.replace(
                top, cache_verify=cp.parse_fields(cls, {"cache_verify": verify}, where, ConfigError)["cache_verify"]
            )
        inherited = {
            "seed": top.seed,
            "cutoff": top.cutoff,
            "cache_dir": top.cache_dir,
            "cache_format": top.cache_format,
            "cache_verify": top.cache_verify,
        }
        sources = []
        for i, entry in enumerate(v["sources"]):
            at = f"{where}.sources[{i}]"
            if not isinstance(entry, Mapping) or not isinstance(entry.get("name"), str) or not entry.get("name"):
                raise ConfigError(f"{at}: expected an object with a 'name' (the name of its energy head)")
            src = cls.from_dict(entry, at, base)
            given = {k for k in inherited if k in entry}
            sources.append(dataclasses.replace(src, **{k: val for k, val in inherited.items() if k not in given}))
        names = [s.name for s in sources]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ConfigError(
                f"{where}.sources: names must be unique (they name the energy heads), found {twice} twice"
            )
        return dataclasses.replace(top, generator=None, sources=tuple(sources))

    def to_dict(self) -> dict[str, Any]:
        """The completed section (JSON; :meth:`from_dict` reads it back equal)."""
        if self.sources:
            out = {"name": self.name, "seed": self.seed, "cutoff": self.cutoff, "cache_format": self.cache_format}
            if self.cache_dir is not None:
                out["cache_dir"] = self.cache_dir
            if self.cache_verify != "auto":
                out["cache_verify"] = self.cache_verify
            out["sources"] = [s.to_dict() for s in self.sources]
            return out
        out: dict[str, Any] = {"name": self.name, "seed": self.seed, "cutoff": self.cutoff}
        if self.weight != 1.0:
            out["weight"] = self.weight
        if self.compositional_stratified_splitting:
            out["compositional_stratified_splitting"] = True
        if self.named:
            out["split"] = list(self.split)
            out.update({k: getattr(self, k) for k in (*_NAMED_ONLY, "cache_dir") if getattr(self, k) is not None})
            out.update(cache_format=self.cache_format, cache_verify=self.cache_verify)
            return out
        if self.generator is not None:
            out["generator"] = dataclasses.asdict(self.generator)
        for key in _FILES:
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        if self.path is not None and self.format is not None:
            out["format"] = self.format
        if self.train_file is None:
            out["split"] = list(self.split)
        elif self.valid_file is None:
            out["valid_fraction"] = self.valid_fraction
        if self.generator is None:
            for key in LABEL_KEYS:
                if key.removesuffix("_key") in self.explicit_keys or getattr(self, key) is None:
                    out[key] = getattr(self, key)
            if self.keys:
                out["keys"] = dict(self.keys)
            out.update(
                index=self.index,
                config_type_key=self.config_type_key,
                cache_format=self.cache_format,
                cache_verify=self.cache_verify,
            )
            for key in ("config_types", "file_format", "cache_dir"):
                value = getattr(self, key)
                if value is not None:
                    out[key] = list(value) if isinstance(value, tuple) else value
        return out

"""The ``Dataset`` section: where the structures come from and how their labels are read.

Exactly one of three sources:

* ``path``: a prepared container (pickle / ``.pt`` / ADIOS2, used as stored) or any file ASE
  reads, split by ``split`` [0.8, 0.1, 0.1];
* ``train_file`` (+ ``valid_file``, ``test_file``): files ASE reads; without ``valid_file``,
  ``valid_fraction`` [0.1] of the training file validates;
* ``generator``: the EMT reference sets (``{"name": "cuau", "n_structures": 200, "seed": 0}``);
* ``sources``: a list of the above, each with a ``name`` and a loss ``weight`` [1.0]: one
  interatomic potential with one energy head per source (``Architecture.energy_heads``), e.g.
  your own data next to a replayed slice of the data a model was first trained on. Sources take
  ``cutoff``, ``seed``, ``cache_dir`` and ``cache_format`` from the top level unless they set them.

For files ASE reads: ``energy_key`` ["energy"], ``forces_key`` ["forces"], ``stress_key``
["stress"] name the file labels of those outputs (null: not trained on), ``keys``
(``{output: label}``) any other head; ``index`` [":"] slices the frames (``ase.io.read``'s
syntax), ``config_types`` keeps only those config types (``config_type_key`` ["config_type"]),
``file_format`` names an ``ase.io`` format the extension does not reveal. Each file is converted
once into a prepared container (``cache_format`` ["pt"] or ``"adios"``) under ``cache_dir``
[``<file's folder>/.hydragnn_cache``] and reused until the file, the keys, the schema or the
cutoff change. Relative paths are relative to the config file's folder (to the working folder
for a config given as a dict); the completed config stores them absolute.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .config_sections import at_least, choice, section, typed
from .errors import ConfigError

__all__ = ["DatasetConfig", "GeneratorConfig"]

CONTAINER_FORMATS = ("pickle", "pt", "adios")
CACHE_FORMATS = ("pt", "adios")
GENERATORS = ("cuau",)
LABEL_KEYS = ("energy_key", "forces_key", "stress_key")
_FILES = ("path", "train_file", "valid_file", "test_file")
_ASE_ONLY = (*LABEL_KEYS, "keys", "index", "config_types", "config_type_key", "file_format")


@dataclass(frozen=True)
class GeneratorConfig:
    """``Dataset.generator``: name ["cuau"], n_structures [200], seed [0]."""

    name: str = "cuau"
    n_structures: int = 200
    seed: int = 0


@dataclass(frozen=True)
class DatasetConfig:
    """A validated ``Dataset`` section (see the module docstring for the keys).

    ``explicit_keys`` (not a JSON key) holds the outputs whose label key the user gave: those
    labels must exist; a default key only adds its output when the file carries the label.
    """

    name: str = "dataset"
    path: str | None = None
    format: str | None = None
    generator: GeneratorConfig | None = None
    train_file: str | None = None
    valid_file: str | None = None
    test_file: str | None = None
    split: tuple[float, float, float] = (0.8, 0.1, 0.1)
    valid_fraction: float = 0.1
    seed: int = 0
    cutoff: float | None = None
    energy_key: str | None = "energy"
    forces_key: str | None = "forces"
    stress_key: str | None = "stress"
    keys: tuple[tuple[str, str], ...] = ()
    explicit_keys: frozenset[str] = frozenset()
    index: str = ":"
    config_types: tuple[str, ...] | None = None
    config_type_key: str = "config_type"
    file_format: str | None = None
    cache_dir: str | None = None
    cache_format: str = "pt"
    sources: tuple[DatasetConfig, ...] = ()
    weight: float = 1.0

    @property
    def files(self) -> dict[str, str]:
        """``{"train"|"valid"|"test": path}`` of a ``train_file`` dataset (empty otherwise)."""
        out = {"train": self.train_file, "valid": self.valid_file, "test": self.test_file}
        return {k: v for k, v in out.items() if v is not None}

    @classmethod
    def from_dict(cls, values: Any, where: str = "Dataset", base: Path | None = None) -> DatasetConfig:
        """Parse a ``Dataset`` section; relative paths are resolved against ``base`` (default: cwd).

        Raises:
            ConfigError: naming ``Dataset.<key>``.
        """
        allowed = {f.name for f in dataclasses.fields(cls)} - {"explicit_keys"}
        in_source = ".sources[" in where
        v = section(values, where, allowed - {"sources"} if in_source else allowed)
        if v.get("sources") is not None:
            return cls._with_sources(v, where, base)
        if "weight" in v and not in_source:
            raise ConfigError(f"{where}.weight: only for an entry of Dataset.sources")
        kw: dict[str, Any] = {}
        for key in ("name", "config_type_key"):
            if key in v:
                kw[key] = typed(v[key], "str", f"{where}.{key}")
        for key in (*_FILES, "cache_dir"):
            if v.get(key) is not None:
                text = typed(v[key], "str", f"{where}.{key}")
                kw[key] = str((base or Path.cwd()) / Path(text).expanduser()) if text else text
        if v.get("format") is not None:
            kw["format"] = choice(v["format"], CONTAINER_FORMATS, f"{where}.format")
        if "cache_format" in v:
            kw["cache_format"] = choice(v["cache_format"], CACHE_FORMATS, f"{where}.cache_format")
        if v.get("file_format") is not None:
            kw["file_format"] = typed(v["file_format"], "str", f"{where}.file_format")
        if v.get("generator") is not None:
            kw["generator"] = _generator(v["generator"], f"{where}.generator")
        sources = [k for k in ("path", "generator", "train_file") if k in kw]
        if len(sources) != 1:
            raise ConfigError(
                f"{where}: give exactly one of 'path' (a dataset container or a file ASE reads), 'train_file' "
                f"(with optional 'valid_file' / 'test_file') or 'generator'; found {sources or 'none'}"
            )
        for key in ("valid_file", "test_file"):
            if key in kw and "train_file" not in kw:
                raise ConfigError(f"{where}.{key}: only together with 'train_file'")
        if "split" in v:
            if "train_file" in kw:
                raise ConfigError(
                    f"{where}.split: a 'train_file' dataset takes 'valid_file' / 'test_file' or 'valid_fraction', not 'split'"
                )
            kw["split"] = _split(v["split"], f"{where}.split")
        if "valid_fraction" in v:
            if "train_file" not in kw or "valid_file" in kw:
                raise ConfigError(f"{where}.valid_fraction: only for a 'train_file' dataset without 'valid_file'")
            kw["valid_fraction"] = typed(v["valid_fraction"], "float", f"{where}.valid_fraction")
            if not 0.0 <= kw["valid_fraction"] < 1.0:
                raise ConfigError(f"{where}.valid_fraction: expected a value in [0, 1), found {kw['valid_fraction']!r}")
        if "seed" in v:
            kw["seed"] = typed(v["seed"], "int", f"{where}.seed")
            at_least(kw["seed"], 0, f"{where}.seed")
        if v.get("cutoff") is not None:
            kw["cutoff"] = typed(v["cutoff"], "float", f"{where}.cutoff")
            at_least(kw["cutoff"], 0.0, f"{where}.cutoff", strict=True)
        if "generator" in kw:
            given = sorted(k for k in _ASE_ONLY if k in v)
            if given:
                raise ConfigError(f"{where}.{given[0]}: only for files ASE reads, not for a 'generator' dataset")
        explicit = set()
        for key in LABEL_KEYS:
            if key in v:
                kw[key] = typed(v[key], "str", f"{where}.{key}", optional=True)
                if kw[key] is not None:
                    explicit.add(key.removesuffix("_key"))
        if v.get("keys") is not None:
            kw["keys"] = _keys(v["keys"], f"{where}.keys")
            explicit.update(name for name, _ in kw["keys"])
        kw["explicit_keys"] = frozenset(explicit)
        if "weight" in v:
            kw["weight"] = typed(v["weight"], "float", f"{where}.weight")
            at_least(kw["weight"], 0.0, f"{where}.weight")
        if "index" in v:
            index = v["index"]
            if isinstance(index, int) and not isinstance(index, bool):
                index = str(index)
            kw["index"] = typed(index, "str", f"{where}.index")
            _check_index(kw["index"], f"{where}.index")
        if v.get("config_types") is not None:
            types = v["config_types"]
            types = [types] if isinstance(types, str) else types
            if not isinstance(types, list) or not types:
                raise ConfigError(f"{where}.config_types: expected a config type or a non-empty list of them, found {types!r}")
            kw["config_types"] = tuple(typed(t, "str", f"{where}.config_types[{i}]") for i, t in enumerate(types))
        return cls(**kw)

    @classmethod
    def _with_sources(cls, v: dict[str, Any], where: str, base: Path | None) -> DatasetConfig:
        """A section of ``sources`` (see the module docstring)."""
        mixed = sorted(set(v) - {"name", "seed", "cutoff", "cache_dir", "cache_format", "sources"})
        if mixed:
            raise ConfigError(f"{where}.{mixed[0]}: give it inside each entry of {where}.sources, not next to it")
        if not isinstance(v["sources"], list) or not v["sources"]:
            raise ConfigError(f"{where}.sources: expected a non-empty list of data sources, found {v['sources']!r}")
        top = cls.from_dict({k: v[k] for k in v if k != "sources"} | {"generator": {}}, where, base)
        inherited = {"seed": top.seed, "cutoff": top.cutoff, "cache_dir": top.cache_dir, "cache_format": top.cache_format}
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
            raise ConfigError(f"{where}.sources: names must be unique (they name the energy heads), found {twice} twice")
        return dataclasses.replace(top, generator=None, sources=tuple(sources))

    def to_dict(self) -> dict[str, Any]:
        """The completed section (JSON; :meth:`from_dict` reads it back equal)."""
        if self.sources:
            out = {"name": self.name, "seed": self.seed, "cutoff": self.cutoff, "cache_format": self.cache_format}
            if self.cache_dir is not None:
                out["cache_dir"] = self.cache_dir
            out["sources"] = [s.to_dict() for s in self.sources]
            return out
        out: dict[str, Any] = {"name": self.name, "seed": self.seed, "cutoff": self.cutoff}
        if self.weight != 1.0:
            out["weight"] = self.weight
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
            out.update(index=self.index, config_type_key=self.config_type_key, cache_format=self.cache_format)
            for key in ("config_types", "file_format", "cache_dir"):
                value = getattr(self, key)
                if value is not None:
                    out[key] = list(value) if isinstance(value, tuple) else value
        return out


def _generator(values: Any, where: str) -> GeneratorConfig:
    g = section(values, where, {"name", "n_structures", "seed"})
    kw: dict[str, Any] = {}
    if "name" in g:
        kw["name"] = choice(g["name"], GENERATORS, f"{where}.name")
    for key in ("n_structures", "seed"):
        if key in g:
            kw[key] = typed(g[key], "int", f"{where}.{key}")
            at_least(kw[key], 1 if key == "n_structures" else 0, f"{where}.{key}")
    return GeneratorConfig(**kw)


def _split(split: Any, where: str) -> tuple[float, float, float]:
    if not isinstance(split, list) or len(split) != 3:
        raise ConfigError(f"{where}: expected [train, val, test] fractions, found {split!r}")
    fr = tuple(typed(s, "float", f"{where}[{i}]") for i, s in enumerate(split))
    if any(f < 0 for f in fr) or fr[0] <= 0 or abs(sum(fr) - 1.0) > 1e-6:
        raise ConfigError(f"{where}: expected fractions >= 0 (train > 0) summing to 1, found {split!r}")
    return fr  # type: ignore[return-value]


def _keys(values: Any, where: str) -> tuple[tuple[str, str], ...]:
    if not isinstance(values, Mapping):
        raise ConfigError(f"{where}: expected an object {{output name: file label}}, found {type(values).__name__}")
    out = []
    for name, label in values.items():
        if name in ("energy", "forces", "stress"):
            raise ConfigError(f"{where}.{name}: give the label of {name!r} with '{name}_key'")
        out.append((name, typed(label, "str", f"{where}.{name}")))
    return tuple(out)


def _check_index(index: str, where: str) -> None:
    from ase.io.formats import string2index

    try:
        string2index(index)
    except ValueError as exc:
        raise ConfigError(f"{where}: expected an ase.io index such as ':', '10:', '::2' or '-5:', found {index!r} ({exc})") from None


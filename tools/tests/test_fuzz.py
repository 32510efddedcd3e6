"""Property-based fuzzing of every reader: each case ends in the package's own error or a correct
result, never another exception, a crash or a hang (a per-case deadline).

Targets: pickle and ``.pt`` containers (byte flips, truncations), LSMS archives (tar.gz, zip) and
LSMS text (byte flips, truncations), ADIOS2 datasets (garbled
metadata with a recomputed integrity record, through the child-process check), model artifacts
(byte flips; structurally valid manifests with hostile values, checksums recomputed), ``prepare``
and the calculator (random bad inputs). ``HYDRAGNN_FUZZ_EXAMPLES`` sets the examples per target
(CI: 12, the same cases every run); ``nox -s fuzz`` runs 500 new random ones per target
(``HYDRAGNN_FUZZ_RANDOM=1``).
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import io
import json
import os
import shutil
import signal
import tarfile
import time
import warnings
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from torch_geometric.data import Data

from hydragnn.data import DataError, Schema, open_dataset, prepare, write_dataset
from hydragnn.data.emt import CUAU_VARIABLES, generate_cuau, generate_cuau_atoms, write_extxyz
from hydragnn.data.io.ase_source import AseSource, iter_frames
from hydragnn.data.io.conversion import convert_source
from hydragnn.data.named.lsms import iter_lsms, parse_lsms
from hydragnn.data.named.lsms_synthetic import synthetic_alloy
from hydragnn.infer import HydraCalculator, InferenceError
from hydragnn.models import ArtifactError, build_model, load_artifact, save_artifact
from hydragnn.models.artifact import _HEADER, CHECKSUM_BYTES, MAGIC

EXAMPLES = int(os.environ.get("HYDRAGNN_FUZZ_EXAMPLES", "12"))
CASE_DEADLINE_S = 60
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=os.environ.get("HYDRAGNN_FUZZ_RANDOM", "") != "1",  # CI reruns the same cases; nox -s fuzz explores
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large],
)
SCHEMA = Schema.from_dict(CUAU_VARIABLES)
ARCH = {
    "mpnn_type": "SchNet",
    "hidden_dim": 8,
    "num_conv_layers": 1,
    "radius": 4.0,
    "num_radial": 8,
    "enable_interatomic_potential": True,
    "output_heads": {"node": {"num_headlayers": 1}},
    "precision": "fp64",
}


@contextlib.contextmanager
def case_deadline(seconds: float = CASE_DEADLINE_S):
    """Fail a case that runs longer than ``seconds`` (a hang), instead of blocking the suite."""

    def expired(signum, frame):
        raise TimeoutError(f"fuzz case still running after {seconds} s: a hang")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _samples() -> list[Data]:
    return [prepare(s, SCHEMA, index=i) for i, s in enumerate(generate_cuau(3, seed=0, dtype=torch.float64))]


def _equal(a: Data, b: Data) -> bool:
    return set(a.keys()) == set(b.keys()) and all(
        torch.equal(a[k], b[k]) if isinstance(a[k], torch.Tensor) else a[k] == b[k] for k in a.keys()
    )


def _error_or_intact(path: Path, samples: list[Data], deadline_s: float = CASE_DEADLINE_S) -> None:
    """Reading the dataset at ``path`` ends in a DataError, or in exactly ``samples``."""
    with case_deadline(deadline_s):
        try:
            ds = open_dataset(path)
            got = [ds[i] for i in range(len(ds))]
        except DataError:
            return
    assert len(got) == len(samples) and all(_equal(a, b) for a, b in zip(samples, got))


flips = st.lists(st.tuples(st.floats(0, 1, exclude_max=True), st.integers(0, 255)), min_size=1, max_size=4)


def _garble(data: bytes, changes, cut: float | None) -> bytes:
    out = bytearray(data)
    for where, value in changes:
        out[int(where * len(out))] = value
    if cut is not None:
        out = out[: int(cut * len(out))]
    return bytes(out)


@pytest.fixture(scope="module")
def samples():
    return _samples()


@pytest.fixture(scope="module")
def pickle_file(tmp_path_factory, samples):
    return write_dataset(tmp_path_factory.mktemp("fuzz") / "ds.pkl", samples, "pickle", schema=SCHEMA)


@FUZZ
@given(changes=flips, cut=st.none() | st.floats(0, 1))
def test_pickle_container(pickle_file, samples, tmp_path_factory, changes, cut):
    path = tmp_path_factory.mktemp("case") / "ds.pkl"
    path.write_bytes(_garble(pickle_file.read_bytes(), changes, cut))
    _error_or_intact(path, samples)


LSMS = synthetic_alloy(3, seed=0)


def _lsms_archive(kind: str) -> bytes:
    buf = io.BytesIO()
    if kind == "zip":
        with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
            for name, text in LSMS:
                zf.writestr(f"FePt/output_files/{name}", text)
    else:
        with tarfile.open(fileobj=buf, mode="w:gz") as tar:
            for name, text in LSMS:
                info = tarfile.TarInfo(f"FePt/output_files/{name}")
                info.size = len(text.encode())
                tar.addfile(info, io.BytesIO(text.encode()))
    return buf.getvalue()


@FUZZ
@given(kind=st.sampled_from(["tar.gz", "zip"]), changes=flips, cut=st.none() | st.floats(0, 1))
def test_lsms_archives(tmp_path_factory, kind, changes, cut):
    """A damaged archive ends in a DataError (the compressions' and zip's CRCs are checked to the
    end), or reads exactly the original structures."""
    path = tmp_path_factory.mktemp("case") / f"raw.{kind}"
    path.write_bytes(_garble(_lsms_archive(kind), changes, cut))
    with case_deadline():
        try:
            got = [s for _, s in iter_lsms(path, n_atoms=32, elements=(26, 78))]
        except DataError:
            return
    expected = [parse_lsms(text, name) for name, text in LSMS]
    assert len(got) == len(expected) and all(_equal(a, b) for a, b in zip(got, expected))


@FUZZ
@given(changes=flips, cut=st.none() | st.floats(0, 1))
def test_lsms_text(changes, cut):
    """Damaged LSMS text ends in a DataError naming the file, or in a sample of the documented shapes."""
    with case_deadline():
        try:
            d = parse_lsms(_garble(LSMS[1][1].encode(), changes, cut), "out_1")
        except DataError as exc:
            assert "out_1" in str(exc) and len(str(exc)) < 1000
            return
    n = d.atomic_number.shape[0]
    assert d.pos.shape == (n, 3) and d.charge_density.shape == d.magnetic_moment.shape == (n, 1)
    assert all(bool(torch.isfinite(t).all()) for t in (d.pos, d.charge_density, d.magnetic_moment, d.free_energy))


@pytest.fixture(scope="module")
def pt_dir(tmp_path_factory, samples):
    return write_dataset(tmp_path_factory.mktemp("fuzz") / "ds.pt", samples, "pt", schema=SCHEMA)


@FUZZ
@given(target=st.sampled_from(["manifest.json", "sample"]), changes=flips, cut=st.none() | st.floats(0, 1))
def test_pt_directory(pt_dir, samples, tmp_path_factory, target, changes, cut):
    path = tmp_path_factory.mktemp("case") / "ds.pt"
    shutil.copytree(pt_dir, path)
    file = path / "manifest.json" if target == "manifest.json" else open_dataset(path).file_of(1)
    file.write_bytes(_garble(file.read_bytes(), changes, cut))
    _error_or_intact(path, samples)


def _forge_chunk(path: Path, edit) -> None:
    """Chunk 0 of the ``.pt`` dataset at ``path`` loaded, changed by ``edit``, saved back with its
    manifest's size and CRC recomputed (a careful forger)."""
    import zlib

    file = open_dataset(path).file_of(0)
    obj = torch.load(file, weights_only=True)
    edit(obj)
    buf = io.BytesIO()
    torch.save(obj, buf)
    file.write_bytes(buf.getvalue())
    manifest = json.loads((path / "manifest.json").read_text())
    manifest["files"]["sizes"][0] = len(buf.getvalue())
    manifest["files"]["crc32"][0] = zlib.crc32(buf.getvalue())
    (path / "manifest.json").write_text(json.dumps(manifest))


@FUZZ
@given(
    how=st.sampled_from(["expand data", "expand shapes", "widen", "table"]),
    size=st.sampled_from([0, 1, 7, 2**20, 2**31, 2**40]),
    width=st.sampled_from([1, 3, 4096, 2**20]),
    pick=st.integers(0, 100),
)
def test_pt_chunk_declared_sizes(pt_dir, samples, tmp_path_factory, how, size, width, pick):
    """Format-3 chunk fields whose declared sizes say more than the bytes hold: zero-stride data
    or shapes, narrowed integers widened, tables indexed far beyond the file (manifest consistent)."""
    path = tmp_path_factory.mktemp("case") / "ds.pt"
    shutil.copytree(pt_dir, path)

    def edit(obj):
        packed = [k for k, v in obj["fields"].items() if isinstance(v, dict) and "shapes" in v]
        key = packed[pick % len(packed)]
        field, count = obj["fields"][key], obj["n"]
        rows = torch.zeros(1, field["shapes"].shape[1], dtype=torch.int64)
        if how == "expand data":
            field.pop("table", None), field.pop("index", None)
            field["data"] = torch.zeros(1, dtype=torch.float32).expand(size)
        elif how == "expand shapes":
            field["shapes"] = rows.expand(max(size, 1), -1)
        elif how == "widen":
            field.pop("table", None), field.pop("index", None)
            field["data"], field["dtype"] = torch.zeros(size % 2**22, dtype=torch.int8), "int64"
        else:
            field.pop("data", None), field.pop("dtype", None)
            field["table"] = torch.zeros(2, width % 2**16 or 1, dtype=torch.float64)
            field["index"] = torch.zeros(size % 2**20, dtype=torch.int8)
        if how != "expand shapes":  # shapes that cover the data: one sample takes it all
            declared = field["data"].numel() if "data" in field else field["index"].numel() * field["table"].shape[1]
            shapes = torch.zeros(count, 1, dtype=torch.int64)
            shapes[0, 0] = declared
            field["shapes"] = shapes

    _forge_chunk(path, edit)
    with case_deadline(20):  # a forged but consistent chunk may read; whatever it declares, nothing big is built
        try:
            ds = open_dataset(path)
            got = [ds[i] for i in range(len(ds))]
        except DataError:
            return
    assert len(got) == len(samples)
    assert sum(t.numel() * t.element_size() for d in got for t in d.to_dict().values() if torch.is_tensor(t)) < 2**26


@pytest.fixture(scope="module")
def adios_dir(tmp_path_factory, samples):
    pytest.importorskip("adios2")
    return write_dataset(tmp_path_factory.mktemp("fuzz") / "ds.bp", samples, "adios", schema=SCHEMA)


@settings(FUZZ, max_examples=max(2, EXAMPLES // 4))  # each case starts a child process
@given(name=st.sampled_from(["md.0", "md.idx", "mmd.0"]), changes=flips)
def test_adios_through_the_child_process(adios_dir, samples, tmp_path_factory, name, changes):
    from hydragnn.data.containers.adios_format import INTEGRITY, integrity_record

    path = tmp_path_factory.mktemp("case") / "ds.bp"
    shutil.copytree(adios_dir, path)
    if not (path / name).exists():
        return
    (path / name).write_bytes(_garble((path / name).read_bytes(), changes, None))
    (path / INTEGRITY).write_text(json.dumps({"version": 1, "files": integrity_record(path)}))  # a stranger's record
    _error_or_intact(path, samples, deadline_s=180)


@pytest.fixture(scope="module")
def artifact(tmp_path_factory):
    torch.manual_seed(0)
    model = build_model(ARCH, SCHEMA).eval()
    return save_artifact(model, tmp_path_factory.mktemp("fuzz") / "m.hydra", species=[29, 79]), model


@FUZZ
@given(changes=flips, cut=st.none() | st.floats(0, 1))
def test_artifact_bytes(artifact, tmp_path_factory, changes, cut):
    path, model = artifact
    data = path.read_bytes()
    garbled = _garble(data, changes, cut)
    target = tmp_path_factory.mktemp("case") / "m.hydra"
    target.write_bytes(garbled)
    with case_deadline():
        try:
            loaded = load_artifact(target)
        except ArtifactError:
            return
    assert garbled == data and all(torch.equal(v, loaded.state_dict()[k]) for k, v in model.state_dict().items())


hostile = st.one_of(
    st.integers(-(2**40), 2**40),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.booleans(),
    st.none(),
    st.lists(st.integers(-5, 5), max_size=3),
)


@FUZZ
@given(
    key=st.sampled_from(sorted(ARCH) + ["num_species", "max_neighbours", "task_weights", "reference_energies"]),
    value=hostile,
)
def test_artifact_manifest_values(artifact, tmp_path_factory, key, value):
    """Structurally valid artifacts (checksums recomputed) whose architecture holds a hostile value."""
    path, _ = artifact
    data = path.read_bytes()
    _, version, length = _HEADER.unpack_from(data)
    manifest = json.loads(data[_HEADER.size : _HEADER.size + length])
    weights = data[_HEADER.size + length : -CHECKSUM_BYTES]
    manifest = copy.deepcopy(manifest)
    manifest["architecture"][key] = value
    blob = json.dumps(manifest).encode()
    body = _HEADER.pack(MAGIC, version, len(blob)) + blob + weights
    target = tmp_path_factory.mktemp("case") / "m.hydra"
    target.write_bytes(body + hashlib.sha256(body).digest())
    with case_deadline():
        try:
            loaded = load_artifact(target)
        except ArtifactError:
            return
    assert sum(p.numel() for p in loaded.parameters()) > 0  # a model that fits its weights


arrays = st.integers(0, 6).flatmap(
    lambda n: st.tuples(
        st.lists(st.floats(-1e6, 1e6) | st.sampled_from([float("nan"), float("inf")]), min_size=3 * n, max_size=3 * n),
        st.lists(st.integers(-5, 300), min_size=n, max_size=n),
    )
)
cells = st.none() | st.lists(st.floats(-20, 20) | st.just(float("nan")), min_size=9, max_size=9)


@pytest.fixture(scope="module")
def calc(artifact):
    return HydraCalculator(artifact[0])


@FUZZ
@given(data=arrays, cell=cells, forces=st.booleans(), pbc=st.none() | st.lists(st.booleans(), min_size=3, max_size=3))
def test_calculator_inputs(calc, data, cell, forces, pbc):
    coords, numbers = data
    pos = np.array(coords, dtype=np.float64).reshape(-1, 3)
    cell_arr = None if cell is None else np.array(cell).reshape(3, 3)
    with case_deadline(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            out = calc(pos, np.array(numbers, dtype=np.int64), cell=cell_arr, pbc=pbc, forces=forces)
        except InferenceError:
            return
    assert torch.isfinite(out["energy"]).all() and (not forces or torch.isfinite(out["forces"]).all())


@FUZZ
@given(
    data=arrays,
    cell=cells,
    extra=st.dictionaries(st.sampled_from(["energy", "forces", "stress", "x"]), hostile, max_size=2),
)
def test_prepare_inputs(data, cell, extra):
    coords, numbers = data
    n = len(numbers)
    sample = Data(
        pos=torch.tensor(coords, dtype=torch.float64).reshape(n, 3),
        atomic_number=torch.tensor(numbers).reshape(n, 1),
        energy=torch.zeros(1, 1, dtype=torch.float64),
        forces=torch.zeros(n, 3, dtype=torch.float64),
    )
    if cell is not None:
        sample.cell = torch.tensor(cell, dtype=torch.float64).reshape(3, 3)
    for key, value in extra.items():
        with contextlib.suppress(Exception):
            sample[key] = torch.as_tensor(value) if not isinstance(value, str) else value
    with case_deadline():
        try:
            prepared = prepare(sample, SCHEMA, index=0)
        except DataError:
            return
    assert prepared.x.shape[0] == n and torch.isfinite(prepared.pos).all()


# --- hydra-data: declared frame sizes and damaged conversion-cache records -------------------------
# extxyz files whose count lines lie (beyond the file, negative, not a number) and cache records
# garbled or holding hostile values: each case ends in a DataError or the right frames / samples,
# within XYZ_DEADLINE_S (a count ASE would follow line by line for hours is a hang here).

XYZ_DEADLINE_S = 5
XYZ_COMMENT = 'Lattice="6 0 0 0 6 0 0 0 6" Properties=species:S:1:pos:R:3 energy=1.0 pbc="T T T"'
counts = st.one_of(
    st.integers(-(2**40), 2**62).map(str),
    st.sampled_from(["2000000000", "-1", "0", "3", "1e3", "2.5", "0x10", " 7 ", "+2", "1_0"]),
    st.floats(allow_nan=True, allow_infinity=True).map(str),
    st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\r\n"), max_size=12),
)


def _atom_lines(n: int) -> str:
    return "".join(f"Cu {k % 3 * 1.9:.1f} {k // 3 % 3 * 1.9:.1f} {k // 9 * 1.9:.1f}\n" for k in range(n))


@FUZZ
@example(count="2000000000", lines=1, frame=1, tail="")  # the shapes every run must see
@example(count="-3", lines=3, frame=0, tail="")
@example(count="2.5", lines=2, frame=1, tail="\n")
@given(
    count=counts,
    lines=st.integers(0, 5),
    frame=st.sampled_from([0, 1]),
    tail=st.sampled_from(["", "\n", "VEC1 1 0 0\n"]),
)
def test_extxyz_declared_sizes(tmp_path_factory, count, lines, frame, tail):
    good = f"2\n{XYZ_COMMENT}\n{_atom_lines(2)}"
    lie = f"{count}\n{XYZ_COMMENT}\n{_atom_lines(lines)}{tail}"
    path = tmp_path_factory.mktemp("case") / "lies.xyz"
    path.write_text(good + lie if frame else lie + good)
    start = time.monotonic()
    with case_deadline(XYZ_DEADLINE_S), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            frames = list(iter_frames(AseSource(path, format="extxyz")))
        except DataError as exc:  # the reader wraps any exception of ASE's, the deadline's too
            assert time.monotonic() - start < XYZ_DEADLINE_S, f"a hang, reported as {str(exc)[:300]}"
            assert len(str(exc)) < 1000, "an error message must stay short"
            return
    assert all(f.atoms.positions.shape == (len(f.atoms), 3) for f in frames)  # a blank count line ends the file


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    root = tmp_path_factory.mktemp("cache")
    path = write_extxyz(root / "train.xyz", generate_cuau_atoms(2, seed=0))
    out = convert_source(
        AseSource(path, energy_key="REF_energy", forces_key="REF_forces", stress_key="REF_stress"),
        cutoff=3.0,
        cache_dir=root / "cache",
    )
    return path, out


RECORD_KEYS = [
    ("digest",),
    ("fingerprint",),
    ("fingerprint", "file"),
    ("fingerprint", "file", "sha256"),
    ("schema",),
    ("schema", "outputs"),
    ("isolated_atoms",),
    ("path",),
    ("mtime_ns",),
    ("created",),
    ("samples",),
]


@FUZZ
@example(key=("fingerprint", "file"), value="x", changes=[(0.0, 32)], cut=None)
@example(key=("created",), value=None, changes=[(0.0, 32)], cut=None)
@example(key=None, changes=[(0.5, 125)], cut=None, value=None)
@given(key=st.none() | st.sampled_from(RECORD_KEYS), value=hostile, changes=flips, cut=st.none() | st.floats(0, 1))
def test_damaged_cache_records(converted, tmp_path_factory, key, value, changes, cut):
    """A record garbled byte-wise (``key`` None) or holding a hostile value: rebuilt or reused, never a crash."""
    path, first = converted
    cache = tmp_path_factory.mktemp("case") / "cache"
    shutil.copytree(first.entry.parent, cache)
    record_path = cache / first.entry.name / "record.json"
    if key is None:
        record_path.write_bytes(_garble(record_path.read_bytes(), changes, cut))
    else:
        record = json.loads(record_path.read_text())
        tree = record
        for part in key[:-1]:
            tree = tree[part]
        tree[key[-1]] = value
        record_path.write_text(json.dumps(record))
    source = AseSource(path, energy_key="REF_energy", forces_key="REF_forces", stress_key="REF_stress")
    with case_deadline(XYZ_DEADLINE_S):
        try:
            out = convert_source(source, cutoff=3.0, cache_dir=cache)
        except DataError:
            return
    assert len(out.dataset) == len(first.dataset)
    assert all(_equal(out.dataset[i], first.dataset[i]) for i in range(len(first.dataset)))


# --- Artifact manifests: declared sizes ------------------------------------------------------------
# Layer counts, widths and basis sizes a manifest declares, hostile (huge, negative, non-integer,
# nested); the weights stay those of the small ARCH model. Each case ends in an ArtifactError or a
# model that holds the file's weights, within SIZE_DEADLINE_S and without building a giant.

SIZE_DEADLINE_S = 5
SIZE_KEYS = [
    ("hidden_dim",),
    ("num_conv_layers",),
    ("num_radial",),
    ("num_species",),
    ("num_filters",),
    ("num_gaussians",),
    ("global_attn_layers",),
    ("output_heads", "node", "num_headlayers"),
    ("output_heads", "node", "dim_headlayers"),
    ("output_heads", "graph", "num_sharedlayers"),
    ("output_heads", "graph", "dim_sharedlayers"),
]
declared = st.recursive(
    st.one_of(
        st.integers(-(2**70), 2**70),
        st.sampled_from([0, -1, 2, 9, 10**9, 2**31, 2**63, 2**64]),
        st.floats(allow_nan=True, allow_infinity=True),
        st.text(max_size=6),
        st.booleans(),
        st.none(),
    ),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.sampled_from(["graph", "node", "dim", "x"]), inner, max_size=3)
    ),
    max_leaves=12,
)


def _forged(path: Path, target: Path, edit) -> Path:
    """``path``'s artifact with ``edit(manifest)`` applied, checksums recomputed (a careful forger)."""
    data = path.read_bytes()
    _, version, length = _HEADER.unpack_from(data)
    manifest = json.loads(data[_HEADER.size : _HEADER.size + length])
    edit(manifest)
    blob = json.dumps(manifest).encode()
    body = _HEADER.pack(MAGIC, version, len(blob)) + blob + data[_HEADER.size + length : -CHECKSUM_BYTES]
    target.write_bytes(body + hashlib.sha256(body).digest())
    return target


def _loads_or_refuses(target: Path, model) -> None:
    with case_deadline(SIZE_DEADLINE_S):
        try:
            loaded = load_artifact(target)
        except ArtifactError as exc:
            assert len(str(exc)) < 3000, "an error message must stay short"
            return
    state = loaded.state_dict()
    assert state.keys() == model.state_dict().keys() and all(
        torch.equal(v, state[k]) for k, v in model.state_dict().items()
    )


def _put(tree: dict, where: tuple[str, ...], value) -> None:
    for key in where[:-1]:
        tree = tree.setdefault(key, {})
        if not isinstance(tree, dict):  # an earlier change replaced the object with a value
            return
    tree[where[-1]] = value


@FUZZ
@given(changes=st.lists(st.tuples(st.sampled_from(SIZE_KEYS), declared), min_size=1, max_size=3))
def test_artifact_declared_sizes(artifact, tmp_path_factory, changes):
    path, model = artifact

    def edit(manifest):
        for where, value in changes:
            _put(manifest["architecture"], where, copy.deepcopy(value))

    _loads_or_refuses(_forged(path, tmp_path_factory.mktemp("case") / "m.hydra", edit), model)


@FUZZ
@given(output=st.integers(0, 3), value=declared)
def test_artifact_declared_schema_dims(artifact, tmp_path_factory, output, value):
    path, model = artifact

    def edit(manifest):
        outputs = manifest["schema"]["outputs"]
        outputs[output % len(outputs)]["dim"] = value

    _loads_or_refuses(_forged(path, tmp_path_factory.mktemp("case") / "m.hydra", edit), model)

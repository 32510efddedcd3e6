"""Dataset containers: round trips, random access, atomic writes, corruption, malicious files."""

from __future__ import annotations

import io
import json
import os
import pickle
import struct
import sys
import zlib

import pytest
import torch
from torch_geometric.data import Data

from hydragnn.data import ContainerError, Schema, prepare
from hydragnn.data.containers import (
    FORMATS,
    AdiosDataset,
    PickleDataset,
    PtDirectoryDataset,
    open_dataset,
    pt_chunk,
    pt_directory,
    write_dataset,
)
from hydragnn.data.containers import pickle_container as pc
from hydragnn.data.containers.packed_chunk import PackedChunk, Rows

try:
    import adios2  # noqa: F401

    HAS_ADIOS = True
except ImportError:  # the optional extra hydra-data[adios] is not installed
    HAS_ADIOS = False
needs_adios = pytest.mark.skipif(not HAS_ADIOS, reason="adios2 not installed (pip install hydra-data[adios])")
ALL_FORMATS = [pytest.param(f, marks=needs_adios) if f == "adios" else f for f in FORMATS]
CLASSES = {"pickle": PickleDataset, "pt": PtDirectoryDataset, "adios": AdiosDataset}

SCHEMA = Schema.from_dict(
    {
        "inputs": [
            {"name": "atomic_number", "level": "node", "dim": 1},
            {"name": "pos", "level": "node", "dim": 3, "role": "position"},
        ],
        "outputs": [
            {"name": "energy", "level": "graph", "dim": 1},
            {"name": "forces", "level": "node", "dim": 3},
        ],
    }
)
NORMALIZATION = {"energy": {"mean": -3.25, "std": 1.5}, "forces": {"rms": 0.75}}
METADATA = {"source": "synthetic", "n_species": 3, "tags": ["a", "b"]}


def make_raw(i: int, seed: int = 0) -> Data:
    """A random periodic graph; sample 0 has no edges (edge_index [2, 0])."""
    g = torch.Generator().manual_seed(1000 * seed + i)
    n = int(torch.randint(1, 9, (1,), generator=g))
    e = 0 if i == 0 else int(torch.randint(1, 12, (1,), generator=g))
    data = Data(
        atomic_number=torch.randint(1, 80, (n, 1), generator=g),
        pos=torch.randn(n, 3, generator=g, dtype=torch.float64),
        edge_index=torch.randint(0, n, (2, e), generator=g),
        edge_shift=torch.randn(e, 3, generator=g),
        cell=torch.randn(3, 3, generator=g),
        pbc=torch.tensor([True, True, i % 2 == 0]),
        energy=torch.randn(1, 1, generator=g),
        forces=torch.randn(n, 3, generator=g),
    )
    data.mask = torch.rand(n, generator=g) > 0.5
    data.half = torch.randn(n, generator=g).to(torch.float16)
    data.brain = torch.randn(n, 2, generator=g).to(torch.bfloat16)
    data.step = torch.tensor(i, dtype=torch.int32)
    data.label = f"sample-{i}"
    data.temperature = 300.5 + i
    data.tags = {"split": "train", "ids": [i, None, True]}
    return data


def make_samples(n: int = 6, seed: int = 0) -> list[Data]:
    return [prepare(make_raw(i, seed), SCHEMA, i) for i in range(n)]


def assert_same(expected: Data, found: Data) -> None:
    assert isinstance(found, Data)
    assert list(found.keys()) == list(expected.keys())
    for key in expected.keys():
        a, b = expected[key], found[key]
        if isinstance(a, torch.Tensor):
            assert isinstance(b, torch.Tensor), key
            assert (b.dtype, b.shape, b.requires_grad) == (a.dtype, a.shape, False), key
            assert torch.equal(a.detach(), b), key
        else:
            assert type(b) is type(a) and b == a, key


@pytest.fixture(scope="module")
def samples() -> list[Data]:
    return make_samples()


def write(tmp_path, samples, fmt, name="ds", **kw):
    return write_dataset(tmp_path / name, samples, fmt, **kw)


# -- round trips --------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ALL_FORMATS)
def test_round_trip_is_tensor_exact(tmp_path, samples, fmt):
    samples = [s.clone() for s in samples]
    samples[1].forces.requires_grad_(True)
    path = write(tmp_path, samples, fmt, schema=SCHEMA, normalization=NORMALIZATION, metadata=METADATA)
    ds = open_dataset(path)
    assert isinstance(ds, CLASSES[fmt]) and isinstance(ds, torch.utils.data.Dataset)
    assert len(ds) == len(samples)
    assert ds.schema == SCHEMA and ds.normalization == NORMALIZATION and ds.metadata == METADATA
    for i in (3, 0, 5, 1, 2, 4):  # random order
        assert_same(samples[i], ds[i])
    assert ds[0].edge_index.shape == (2, 0) and ds[0].step.dim() == 0
    assert_same(samples[-1], ds[-1])
    assert_same(samples[-6], ds[-6])
    assert_same(samples[2], CLASSES[fmt](path)[2])  # direct constructor
    assert_same(samples[4], ds[torch.tensor(4)])
    for bad in (6, -7, 100):
        with pytest.raises(IndexError):
            ds[bad]
    with pytest.raises(TypeError):
        ds["0"]


@pytest.mark.parametrize("fmt", ALL_FORMATS)
def test_no_schema_and_empty_dataset(tmp_path, samples, fmt):
    ds = open_dataset(write(tmp_path, samples[:2], fmt))
    assert ds.schema is None and ds.normalization is None and ds.metadata is None
    empty = open_dataset(write(tmp_path, iter([]), fmt, name="empty", metadata={"n": 0}))
    assert len(empty) == 0 and empty.metadata == {"n": 0}
    with pytest.raises(IndexError):
        empty[0]


@pytest.mark.parametrize("fmt", ALL_FORMATS)
def test_load_is_authoritative(tmp_path, fmt):
    raw = make_raw(3)
    prepared = prepare(raw, SCHEMA, 3)
    prepared.x = prepared.x * 2 + 1  # differs from what prepare would build
    ds = open_dataset(write(tmp_path, [prepared, raw], fmt if fmt != "adios" else "pickle", schema=SCHEMA))
    assert torch.equal(ds[0].x, prepared.x)
    assert "x" not in ds[1] and "y" not in ds[1]  # an unprepared sample stays unprepared
    if fmt == "adios":
        ds = open_dataset(write(tmp_path, [prepared], fmt, name="a", schema=SCHEMA))
        assert torch.equal(ds[0].x, prepared.x)


@pytest.mark.parametrize("fmt", ["pickle", "pt"])
def test_keys_may_differ_between_samples(tmp_path, samples, fmt):
    mixed = [samples[0].clone(), Data(z=torch.arange(3)), samples[2]]
    del mixed[0].mask
    ds = open_dataset(write(tmp_path, mixed, fmt))
    for a, i in zip(mixed, range(3)):
        assert_same(a, ds[i])


@needs_adios
def test_adios_needs_uniform_keys_and_dtypes(tmp_path, samples):
    other = samples[1].clone()
    del other.mask
    with pytest.raises(ContainerError, match=r"sample 1.*missing \['mask'\]"):
        write(tmp_path, [samples[0], other], "adios")
    other = samples[1].clone()
    other.forces = other.forces.double()
    with pytest.raises(ContainerError, match="sample 1: attribute 'forces' is float64"):
        write(tmp_path, [samples[0], other], "adios")
    assert sorted(os.listdir(tmp_path)) == []


@needs_adios
def test_adios_layout_is_columnar_with_offsets_and_attributes(tmp_path, samples):
    """Read back with plain adios2 (no hydra-data): the schema and statistics are attributes,
    each key is one flat column of every sample's values plus per-sample offsets."""
    import numpy as np

    path = write(tmp_path, samples, "adios", schema=SCHEMA, normalization=NORMALIZATION)
    with adios2.FileReader(str(path)) as reader:
        header = json.loads(reader.read_attribute_string("hydragnn"))
        assert header["schema"] == SCHEMA.to_dict() and header["normalization"] == NORMALIZATION
        j = [k["name"] for k in header["keys"]].index("pos")
        variables = reader.available_variables()
        assert {f"k{j}/data", f"k{j}/offsets", f"k{j}/shapes"} <= set(variables)
        n_values = int(variables[f"k{j}/data"]["Shape"])
        offsets = reader.read(f"k{j}/offsets", [0], [len(samples) + 1])
        column = reader.read(f"k{j}/data", [0], [n_values])
    sizes = [s.pos.numel() for s in samples]
    assert offsets.tolist() == np.cumsum([0, *sizes]).tolist()  # variable-sized graphs
    assert np.array_equal(column, torch.cat([s.pos.reshape(-1) for s in samples]).numpy())


@needs_adios
def test_adios_written_in_many_chunks(tmp_path, samples, monkeypatch):
    from hydragnn.data.containers import adios_format

    monkeypatch.setattr(adios_format, "_CHUNK_BYTES", 300)  # a block of the global arrays per sample or two
    ds = open_dataset(write(tmp_path, samples, "adios"))
    for i in (5, 0, 3, 1, 4, 2):
        assert_same(samples[i], ds[i])


def test_unstorable_attribute_names_sample_and_key(tmp_path, samples):
    import numpy as np

    bad = samples[1].clone()
    bad.extra = np.zeros(3)
    with pytest.raises(ContainerError, match=r"sample 1: attribute 'extra' is a ndarray"):
        write(tmp_path, [samples[0], bad], "pickle")
    with pytest.raises(ContainerError, match="unknown dataset format 'hdf5'"):
        write(tmp_path, samples, "hdf5")
    with pytest.raises(ContainerError, match="normalization must be JSON-serializable"):
        write(tmp_path, samples, "pickle", normalization={"mean": torch.zeros(2)})
    assert os.listdir(tmp_path) == []


# -- atomic writes ------------------------------------------------------------------------------


class Boom(RuntimeError):
    pass


def failing(samples, at):
    for i, s in enumerate(samples):
        if i == at:
            raise Boom("sample source failed")
        yield s


@pytest.mark.parametrize("fmt", ALL_FORMATS)
def test_failed_write_leaves_nothing(tmp_path, samples, fmt):
    with pytest.raises(Boom):
        write(tmp_path, failing(samples, 3), fmt)
    assert os.listdir(tmp_path) == []
    # an existing dataset survives a failed overwrite and is replaced by a successful one
    path = write(tmp_path, samples[:2], fmt)
    with pytest.raises(Boom):
        write(tmp_path, failing(samples, 4), fmt)
    assert os.listdir(tmp_path) == ["ds"] and len(open_dataset(path)) == 2
    write(tmp_path, samples[:3], fmt)
    assert os.listdir(tmp_path) == ["ds"] and len(open_dataset(path)) == 3


def test_write_refuses_to_overwrite_a_non_dataset(tmp_path, samples):
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "a.txt").write_text("keep me")
    torch.save({"w": torch.zeros(2)}, tmp_path / "notes" / "model.pt")  # readable as a foreign .pt dataset
    assert len(open_dataset(tmp_path / "notes")) == 1
    for fmt in FORMATS:  # refused before any format-specific code runs (adios2 not needed)
        with pytest.raises(ContainerError, match="not a dataset written by hydra-data; refusing to overwrite"):
            write(tmp_path, samples, fmt, name="notes")
    assert (tmp_path / "notes" / "a.txt").read_text() == "keep me"
    assert sorted(os.listdir(tmp_path)) == ["notes"]


# -- corruption ---------------------------------------------------------------------------------


def test_missing_and_foreign_paths(tmp_path):
    for opener in (open_dataset, PickleDataset, PtDirectoryDataset):
        with pytest.raises(ContainerError, match="no such file or directory"):
            opener(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    (tmp_path / "junk.bin").write_bytes(b"hello world" * 10)
    for name in ("empty", "junk.bin"):
        with pytest.raises(ContainerError, match="not a HydraGNN dataset"):
            open_dataset(tmp_path / name)
    with pytest.raises(ContainerError, match="missing magic"):
        PickleDataset(tmp_path / "junk.bin")
    with pytest.raises(ContainerError, match="no manifest.json and no"):
        PtDirectoryDataset(tmp_path / "empty")


def flip(path, offset):
    data = bytearray(path.read_bytes())
    data[offset] ^= 0xFF
    path.write_bytes(bytes(data))


def test_pickle_truncated_and_corrupted(tmp_path, samples):
    path = write(tmp_path, samples, "pickle")
    good = path.read_bytes()
    size = len(good)
    for cut in (5, 30, pc.HEADER_SIZE + 10, size // 2, size - 1):
        path.write_bytes(good[:cut])
        what = "missing magic" if cut < 12 else "truncated"
        with pytest.raises(ContainerError, match=rf"{path}: .*{what}"):
            open_dataset(path) if cut > 8 else PickleDataset(path)
    n, index_offset, meta_offset = struct.unpack_from("<QQQ", good, 12)
    for offset, what in (
        (20, "header is corrupted"),
        (index_offset + 9, "index is corrupted"),
        (meta_offset + 3, "JSON is corrupted"),
    ):
        path.write_bytes(good)
        flip(path, offset)
        with pytest.raises(ContainerError, match=what):
            open_dataset(path)
    # a flipped byte inside sample 2 breaks sample 2 only
    path.write_bytes(good)
    ds = open_dataset(path)
    start = ds._offsets[2]
    ds.close()
    flip(path, int(start) + 40)
    ds = open_dataset(path)
    assert_same(samples[1], ds[1])
    with pytest.raises(ContainerError, match=r"sample 2: payload is corrupted"):
        ds[2]


def test_pickle_newer_version_is_refused(tmp_path, samples):
    path = write(tmp_path, samples[:1], "pickle")
    data = bytearray(path.read_bytes())
    struct.pack_into("<I", data, 8, 7)
    fixed = bytes(data[:52])
    struct.pack_into("<I", data, 52, zlib.crc32(fixed))
    path.write_bytes(bytes(data))
    with pytest.raises(ContainerError, match="version 7 is newer.*version 1"):
        open_dataset(path)


@pytest.mark.parametrize("fmt", ALL_FORMATS)
def test_newer_format_version_is_refused(tmp_path, samples, fmt, monkeypatch):
    monkeypatch.setattr(CLASSES[fmt], "VERSION", 5)  # a future writer
    path = write(tmp_path, samples[:2], fmt)
    monkeypatch.undo()
    with pytest.raises(
        ContainerError, match=rf"version 5 is newer than .* version {CLASSES[fmt].VERSION}; upgrade hydra-data"
    ):
        open_dataset(path)


class Evil:
    def __init__(self, target):
        self.target = target

    def __reduce__(self):
        return (os.system, (f"touch {self.target}",))


def _malicious_payloads(target) -> list[bytes]:
    """Pickles that run ``touch target`` when loaded by a plain unpickler."""
    return [
        pickle.dumps({"x": Evil(target)}),  # protocol 5: STACK_GLOBAL inside a valid-looking record
        pickle.dumps(Evil(target), protocol=2),  # GLOBAL opcode at top level
        f"cposix\nsystem\n(S'touch {target}'\ntR.".encode(),  # hand-written protocol 0
        f"cbuiltins\nexec\n(S'open({str(target)!r}, \"w\")'\ntR.".encode(),  # code, not a command
    ]


def test_malicious_pickle_does_not_execute(tmp_path):
    # The payloads really are live: the standard unpickler runs each of them.
    for i in range(len(_malicious_payloads(tmp_path))):
        proof = tmp_path / f"proof{i}"
        pickle.loads(_malicious_payloads(proof)[i])
        assert proof.exists(), f"payload {i} is not live"
    # A crafted container (valid header, index and CRCs) holding them: opening works, reading
    # a sample is refused and nothing runs.
    side_effect = tmp_path / "pwned"
    payloads = _malicious_payloads(side_effect) + [pickle.dumps(torch.zeros(2))]  # torch needs globals too
    header = {"format": "pickle", "version": 1, "n_samples": 0, "schema": None, "normalization": None, "metadata": None}
    path = tmp_path / "evil.pkl"
    pc.write_payloads(path, payloads, header)
    ds = open_dataset(path)
    assert isinstance(ds, PickleDataset) and len(ds) == len(payloads)
    for i in range(len(payloads)):
        with pytest.raises(ContainerError, match=rf"sample {i}: refused to unpickle \(global '.*' is not allowed\)"):
            ds[i]
    assert not side_effect.exists()
    # the worker-process path (a pickled dataset) is just as safe
    clone = pickle.loads(pickle.dumps(ds))
    with pytest.raises(ContainerError, match="refused to unpickle"):
        clone[0]
    assert not side_effect.exists()


def test_pt_missing_truncated_and_newer(tmp_path, samples, monkeypatch):
    """Samples live in chunk files (two per chunk here): a missing, truncated or corrupted chunk
    is named on reading any of its samples; the other chunks still read."""
    monkeypatch.setattr(pt_directory, "CHUNK_SAMPLES", 2)
    path = write(tmp_path, samples, "pt", schema=SCHEMA)
    files = sorted(p.name for p in path.iterdir())
    assert files == ["chunk_000000.pt", "chunk_000001.pt", "chunk_000002.pt", "manifest.json"]
    (path / "chunk_000001.pt").unlink()
    raw = (path / "chunk_000002.pt").read_bytes()
    (path / "chunk_000002.pt").write_bytes(raw[: len(raw) // 2])
    ds = open_dataset(path)
    assert_same(samples[1], ds[1])
    with pytest.raises(ContainerError, match=r"chunk_000001.pt: sample 3: chunk file is missing"):
        ds[3]
    with pytest.raises(ContainerError, match=r"sample 4: .*truncated"):
        ds[-2]
    (path / "chunk_000002.pt").write_bytes(raw)
    flip(path / "chunk_000002.pt", len(raw) // 2)
    with pytest.raises(ContainerError, match=r"sample 5: chunk file is corrupted"):
        ds[5]
    assert_same(samples[0], ds[0])
    manifest = json.loads((path / "manifest.json").read_text())
    (path / "manifest.json").write_text(json.dumps({**manifest, "version": 4}))
    with pytest.raises(ContainerError, match="pt container format version 4 is newer"):
        open_dataset(path)
    files = manifest["files"]
    (path / "manifest.json").write_text(json.dumps({**manifest, "files": {**files, "starts": [0, 4, 2]}}))
    with pytest.raises(ContainerError, match="chunk starts .* do not cover 6 samples in order"):
        open_dataset(path)
    (path / "manifest.json").write_text(json.dumps(manifest)[:-20])
    with pytest.raises(ContainerError, match="not valid JSON"):
        open_dataset(path)


def test_pt_chunks_keep_every_sample_exact(tmp_path, samples, monkeypatch):
    """Chunks of 4 over samples whose attributes differ (one lacks ``forces``, one has them in
    another order, one holds a float64 ``energy``): every sample reads back exact, in order, as its
    own copy (editing one leaves the chunk as written)."""
    monkeypatch.setattr(pt_directory, "CHUNK_SAMPLES", 4)
    mixed = [s.clone() for s in samples]
    del mixed[1].forces
    reordered = Data()
    for key in reversed(list(mixed[2].keys())):
        reordered[key] = mixed[2][key]
    mixed[2] = reordered
    mixed[3].energy = mixed[3].energy.double()
    path = write(tmp_path, mixed, "pt", schema=SCHEMA)
    ds = open_dataset(path)
    assert len(list(path.glob("chunk_*.pt"))) == 2
    for i in (5, 0, 3, 1, 2, 4):  # across chunks, out of order
        assert_same(mixed[i], ds[i])
    ds[0].pos.add_(1.0)
    first = ds[0]
    first.pos.add_(1.0)
    assert_same(mixed[0], ds[0])


def test_pt_integers_stored_narrow_and_rows_tables_read_back_exact(tmp_path):
    """Version 3: integer data in the narrowest integer dtype holding it (read back in its own
    dtype, values beyond int32 kept), a ``Rows`` field as table and index; a damaged table index
    is a ContainerError, not a crash."""
    big = torch.tensor([[-(2**40)], [7]])
    samples = [
        Data(small=torch.arange(5).reshape(5, 1), big=big, i32=torch.tensor([300, -3], dtype=torch.int32)),
        Data(small=torch.arange(3).reshape(3, 1) + 120, big=big + 1, i32=torch.tensor([1, 2], dtype=torch.int32)),
    ]
    table, index = torch.randn(4, 3, dtype=torch.float64), torch.tensor([3, 0, 0, 2, 1])
    shapes = torch.tensor([[2, 3], [3, 3]])
    chunk = PackedChunk(2, {"shift": (Rows(table, index), shapes), "z": (torch.arange(5) * 40, shapes[:, :1])})
    path = write(tmp_path, [*samples, chunk], "pt")
    stored = torch.load(path / "chunk_000000.pt", weights_only=True)["fields"]
    assert stored["small"]["data"].dtype == torch.int8 and stored["i32"]["data"].dtype == torch.int16
    assert stored["big"]["data"].dtype == torch.int64 and "dtype" not in stored["big"]
    ds = open_dataset(path)
    for i, sample in enumerate(samples):
        assert_same(sample, ds[i])
    assert torch.equal(ds[2].shift, table[index[:2]]) and torch.equal(ds[3].shift, table[index[2:]])
    assert ds[3].z.dtype == torch.int64 and torch.equal(ds[3].z, torch.tensor([80, 120, 160]))
    chunk_file = path / "chunk_000001.pt"
    obj = torch.load(chunk_file, weights_only=True)
    obj["fields"]["shift"]["index"][0] = 9  # past the table's 4 rows
    buf = io.BytesIO()
    torch.save(obj, buf)
    chunk_file.write_bytes(buf.getvalue())
    manifest = json.loads((path / "manifest.json").read_text())
    manifest["files"]["sizes"][1], manifest["files"]["crc32"][1] = len(buf.getvalue()), zlib.crc32(buf.getvalue())
    (path / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ContainerError, match="field 'shift' is not a packed field of 2 samples"):
        open_dataset(path)[2]


def test_pt_version_2_directories_still_read(tmp_path, samples, monkeypatch):
    monkeypatch.setattr(pt_directory.PtDirectoryDataset, "VERSION", 2)
    monkeypatch.setattr(pt_chunk, "narrowed", lambda data: {"data": data})
    path = write(tmp_path, samples, "pt", schema=SCHEMA)
    monkeypatch.undo()
    assert torch.load(path / "chunk_000000.pt", weights_only=True)["hydragnn_pt"] == 2
    ds = open_dataset(path)
    for i in range(len(samples)):
        assert_same(samples[i], ds[i])


def test_pt_version_1_directories_still_read(tmp_path, samples):
    """A directory of one ``.pt`` file per sample (format version 1, written before chunks)."""
    from hydragnn.data.containers.base import make_header
    from hydragnn.data.containers.codec import sample_fields

    path = tmp_path / "v1"
    path.mkdir()
    sizes, crcs = [], []
    for i, sample in enumerate(samples):
        buf = io.BytesIO()
        torch.save({"hydragnn_pt": 1, "fields": dict(sample_fields(sample, "test"))}, buf)
        (path / f"{i:06d}.pt").write_bytes(buf.getvalue())
        sizes.append(len(buf.getvalue()))
        crcs.append(zlib.crc32(buf.getvalue()))
    header = make_header("pt", 1, SCHEMA, None, None)
    files = {"digits": 6, "sizes": sizes, "crc32": crcs}
    (path / "manifest.json").write_text(json.dumps({**header, "n_samples": len(samples), "files": files}))
    ds = open_dataset(path)
    assert ds.file_of(2) == path / "000002.pt"
    for i in range(len(samples)):
        assert_same(samples[i], ds[i])
    (path / "000002.pt").unlink()
    with pytest.raises(ContainerError, match=r"000002.pt: sample 2: sample file is missing"):
        ds[2]


def test_pt_reads_third_party_pyg_directory(tmp_path, samples):
    folder = tmp_path / "foreign"
    folder.mkdir()
    for i in (0, 2, 10):  # natural order: 0, 2, 10
        torch.save(samples[i % len(samples)], folder / f"data_{i}.pt")
    torch.save({"z": torch.arange(4)}, folder / "data_11.pt")
    ds = open_dataset(folder)
    assert isinstance(ds, PtDirectoryDataset) and len(ds) == 4 and ds.schema is None
    for j, i in enumerate((0, 2, 10)):
        assert_same(samples[i % len(samples)], ds[j])
    assert torch.equal(ds[3].z, torch.arange(4))
    side_effect = tmp_path / "pwned"
    torch.save(Evil(side_effect), folder / "data_12.pt")
    with pytest.raises(ContainerError, match=r"sample 4: not a readable .pt sample: it holds a Python object"):
        PtDirectoryDataset(folder)[4]
    assert not side_effect.exists()


@needs_adios
def test_adios_truncated_garbled_and_newer(tmp_path, samples):
    path = write(tmp_path, samples, "adios", schema=SCHEMA)
    assert not (path / "profiling.json").exists()
    saved = {p.name: p.read_bytes() for p in path.iterdir()}

    def restore():
        for name, data in saved.items():
            (path / name).write_bytes(data)

    for name in ("md.idx", "md.0", "mmd.0", "data.0"):
        (path / name).write_bytes(saved[name][: len(saved[name]) // 2])
        with pytest.raises(ContainerError, match=rf"{name}' is \d+ bytes, expected"):
            open_dataset(path)
        restore()
        if name != "data.0":  # garbled ADIOS2 metadata would crash ADIOS2 itself: refused before it
            flip(path / name, len(saved[name]) // 2)
            with pytest.raises(ContainerError, match=rf"{name}' is corrupted"):
                open_dataset(path)
            restore()
    # garbled sample data: only that sample fails, naming the attribute
    data = saved["data.0"]
    pos2 = samples[2].pos.numpy().tobytes()
    flip(path / "data.0", data.index(pos2) + 5)
    ds = open_dataset(path)
    assert_same(samples[1], ds[1])
    with pytest.raises(ContainerError, match=r"sample 2: attribute 'pos' is corrupted"):
        ds[2]
    restore()
    (path / "hydragnn-integrity.json").unlink()
    with pytest.raises(ContainerError, match="not a HydraGNN ADIOS2 dataset"):
        open_dataset(path)
    restore()
    integrity = json.loads(saved["hydragnn-integrity.json"])
    (path / "hydragnn-integrity.json").write_text(json.dumps({**integrity, "version": 9}))
    with pytest.raises(ContainerError, match="version 9 is newer"):
        open_dataset(path)


def _bytes_read_by_this_process() -> int:
    """``rchar`` of /proc/self/io: every byte this process got from read()/pread() (all threads)."""
    with open("/proc/self/io") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("rchar:"))


@needs_adios
@pytest.mark.skipif(not os.path.exists("/proc/self/io"), reason="needs Linux /proc/self/io I/O accounting")
def test_adios_reads_one_sample_without_reading_the_file(tmp_path):
    """Measured by the kernel, not by our own bookkeeping: a sample costs its own bytes only."""
    g = torch.Generator().manual_seed(0)
    atoms = 200
    samples = [
        Data(pos=torch.randn(atoms, 3, generator=g, dtype=torch.float64), idx=torch.tensor([i])) for i in range(300)
    ]
    path = write(tmp_path, samples, "adios")
    data_bytes = sum(f.stat().st_size for f in path.glob("data.*"))
    sample_bytes = atoms * 3 * 8 + 8
    assert data_bytes >= len(samples) * sample_bytes
    before = _bytes_read_by_this_process()
    ds = open_dataset(path)
    opened = _bytes_read_by_this_process() - before
    assert opened < data_bytes / 10, f"opening read {opened} of {data_bytes} data bytes"
    for i in (150, 0, 299, 150):
        before = _bytes_read_by_this_process()
        sample = ds[i]
        read = _bytes_read_by_this_process() - before
        assert torch.equal(sample.pos, samples[i].pos) and int(sample.idx) == i
        # at least the sample itself (so the reads are visible to the counter, not mmap'ed) ...
        assert read >= sample_bytes, f"sample {i}: only {read} bytes counted"
        # ... and nowhere near the file: a few times the sample at most
        assert read <= 4 * sample_bytes + 4096, f"sample {i}: read {read} bytes for a {sample_bytes}-byte sample"


def test_adios_reports_missing_package(tmp_path, samples, monkeypatch):
    fake = tmp_path / "ds.bp"
    fake.mkdir()
    (fake / "md.idx").write_bytes(b"\0" * 64)
    if HAS_ADIOS:
        with pytest.raises(ContainerError, match="not a HydraGNN ADIOS2 dataset"):
            open_dataset(fake)
    monkeypatch.setitem(sys.modules, "adios2", None)  # as if not installed
    with pytest.raises(ContainerError, match=r"pip install hydra-data\[adios\]"):
        open_dataset(fake)
    with pytest.raises(ContainerError, match=r"pip install hydra-data\[adios\]"):
        write(tmp_path, samples[:1], "adios", name="other")
    assert sorted(os.listdir(tmp_path)) == ["ds.bp"]


@pytest.mark.parametrize("fmt", ALL_FORMATS)
def test_dataset_pickles_for_worker_processes(tmp_path, samples, fmt):
    ds = open_dataset(write(tmp_path, samples, fmt))
    ds[0]  # open handles, then ship to a "worker"
    clone = pickle.loads(pickle.dumps(ds))
    assert_same(samples[3], clone[3])
    loader = torch.utils.data.DataLoader(ds, batch_size=None, shuffle=True, num_workers=2)
    seen = sorted(int(d.step) for d in loader)  # read in two forked workers
    assert seen == list(range(len(samples)))


def test_pt_samples_that_are_not_bounded_regular_files_are_refused(tmp_path, samples, monkeypatch):
    """A FIFO would block the reader forever, a link to /dev/zero would read until MemoryError,
    an oversized file would be read whole before its size was checked (one sample per chunk
    file here, so that each case has its own file)."""
    monkeypatch.setattr(pt_directory, "CHUNK_SAMPLES", 1)
    path = write(tmp_path, samples, "pt", schema=SCHEMA)
    ds = open_dataset(path)
    fifo = ds.file_of(0)
    fifo.unlink()
    os.mkfifo(fifo)
    with pytest.raises(ContainerError, match=r"sample 0: not a regular file \(a FIFO, device or socket\)"):
        open_dataset(path)[0]
    zero = ds.file_of(1)
    zero.unlink()
    zero.symlink_to("/dev/zero")
    with pytest.raises(ContainerError, match=r"sample 1: not a regular file"):
        open_dataset(path)[1]
    big = ds.file_of(2)
    big.write_bytes(big.read_bytes() + b"\0" * 4096)
    with pytest.raises(
        ContainerError, match=r"sample 2: chunk file is \d+ bytes, more than the \d+ bytes the manifest records"
    ):
        open_dataset(path)[2]

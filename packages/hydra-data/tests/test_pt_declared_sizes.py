"""Declared sizes in format-3 ``.pt`` chunks are bounded by the bytes present and refused by name
before anything is allocated: zero-stride views, tables and widenings that decode to far more than
the file, and manifest numbers that would allocate by themselves."""

from __future__ import annotations

import io
import json
import time
import zlib

import pytest
import torch

from hydragnn.data import ContainerError, Schema, open_dataset, prepare, write_dataset
from hydragnn.data.containers.pt_chunk import DECODE_FACTOR
from hydragnn.data.emt import CUAU_VARIABLES, generate_cuau
from hydragnn.data.neighbors import add_edges

SCHEMA = Schema.from_dict(CUAU_VARIABLES)


def make_samples(n: int, seed: int = 0):
    """Periodic EMT Cu-Au cells with edges (offsets stored as a table, indices narrowed)."""
    return [add_edges(prepare(raw, SCHEMA, i), 4.0) for i, raw in enumerate(generate_cuau(n, seed=seed))]


@pytest.fixture()
def dataset(tmp_path):
    return write_dataset(tmp_path / "ds.pt", make_samples(6), "pt", schema=SCHEMA)


def _rewrite_chunk(path, edit):
    """Load chunk 0, let ``edit`` change its dict, save it back with a manifest that matches (a
    careful forger: sizes and CRCs recomputed)."""
    file = open_dataset(path).file_of(0)
    obj = torch.load(file, weights_only=True)
    edit(obj)
    buf = io.BytesIO()
    torch.save(obj, buf)
    raw = buf.getvalue()
    file.write_bytes(raw)
    manifest = json.loads((path / "manifest.json").read_text())
    manifest["files"]["sizes"][0] = len(raw)
    manifest["files"]["crc32"][0] = zlib.crc32(raw)
    (path / "manifest.json").write_text(json.dumps(manifest))
    return len(raw)


def _refused(path, match):
    start = time.perf_counter()
    with pytest.raises(ContainerError, match=match):
        open_dataset(path)[0]
    assert time.perf_counter() - start < 5  # refused from the declared sizes, nothing decoded


def test_a_zero_stride_view_is_refused(dataset):
    """One stored byte declared as 2**30 int8 values widened to int64 (8 GiB once decoded)."""

    def widen(obj):
        obj["fields"]["atomic_number"] = {
            "data": torch.zeros(1, dtype=torch.int8).expand(2**30),
            "dtype": "int64",
            "shapes": torch.tensor([[2**30 // 6]] * 5 + [[2**30 - 5 * (2**30 // 6)]]),
        }

    _rewrite_chunk(dataset, widen)
    _refused(dataset, r"chunk_0+\.pt: chunk 0 \(samples 0-5\): not a readable \.pt sample: a tensor of shape "
             r"\(1073741824,\) declares 1073741824 bytes over a storage of 1 bytes")  # fmt: skip


def test_a_table_that_decodes_to_far_more_than_its_file_is_refused(dataset):
    """A 2-row table 4096 float64 wide indexed by 50,000 int8: 1.6 GB from about 120 KB."""

    def table(obj):
        rows = 50_000
        obj["fields"]["edge_shift"] = {
            "table": torch.zeros(2, 4096, dtype=torch.float64),
            "index": torch.zeros(rows, dtype=torch.int8),
            "shapes": torch.tensor([[rows * 4096 // 6]] * 5 + [[rows * 4096 - 5 * (rows * 4096 // 6)]]),
        }

    size = _rewrite_chunk(dataset, table)
    _refused(
        dataset,
        rf"field 'edge_shift' would decode to {50_000 * 4096 * 8} bytes from a chunk file of {size} bytes "
        rf"\(more than {DECODE_FACTOR} times its size",
    )


def test_manifest_digits_beyond_a_file_name_are_refused(dataset):
    manifest = json.loads((dataset / "manifest.json").read_text())
    manifest["files"]["digits"] = 2**30
    (dataset / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ContainerError, match=r"manifest 'files.digits' is 1073741824, expected 1-20"):
        open_dataset(dataset)


def test_a_manifest_claiming_millions_of_samples_in_a_small_chunk_is_refused(dataset):
    """33,554,432 samples claimed: the chunk's shapes would need 268 MB that the file does not hold."""
    count = 2**25
    manifest = json.loads((dataset / "manifest.json").read_text())
    manifest["n_samples"] = count
    (dataset / "manifest.json").write_text(json.dumps(manifest))

    def claim(obj):
        obj["n"] = count
        for field in obj["fields"].values():
            if "shapes" in field:
                field["shapes"] = torch.zeros(1, field["shapes"].shape[1], dtype=torch.int64).expand(count, -1)

    _rewrite_chunk(dataset, claim)
    assert len(open_dataset(dataset)) == count  # the manifest alone allocates nothing
    _refused(
        dataset,
        r"chunk 0 \(samples 0-33554431\): not a readable \.pt sample: a tensor of shape \(33554432, \d\) declares",
    )


def test_real_chunks_stay_within_the_bounds(tmp_path):
    """Periodic cells (edge offsets as a table), narrowed integers: every sample reads back."""
    samples = make_samples(40, seed=3)
    path = write_dataset(tmp_path / "big.pt", samples, "pt", schema=SCHEMA)
    ds = open_dataset(path)
    for i in range(len(samples)):
        for key in samples[i].keys():
            value = samples[i][key]
            if isinstance(value, torch.Tensor):
                assert torch.equal(ds[i][key], value), key


def test_adios_variables_declaring_more_than_the_files_hold_are_refused(tmp_path):
    """An ADIOS2 variable may declare a global shape far beyond the blocks written (2**31 values
    over one 10-value block is a 2.6 KB file): every read is bounded by the files' bytes first."""
    pytest.importorskip("adios2")
    path = write_dataset(tmp_path / "ds.bp", make_samples(3), "adios", schema=SCHEMA)
    ds = open_dataset(path)
    ds._check_declared("k0/data", 1000, 8)  # within the files' bytes
    with pytest.raises(ContainerError, match=r"variable 'k0/data' declares 1099511627776 values .* a crafted size"):
        ds._check_declared("k0/data", 2**40, 8)
    assert ds[2] is not None

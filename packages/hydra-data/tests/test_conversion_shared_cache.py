"""The conversion cache shared by runs: concurrent conversions, literal names, shared cache
folders, damaged records and swapped containers (issue 30, items 1 and 2)."""

from __future__ import annotations

import json
import multiprocessing
import shutil

import pytest

from hydragnn.data.ase_source import AseSource
from hydragnn.data.conversion import convert_source
from hydragnn.data.reference import generate_cuau_atoms, write_extxyz


@pytest.fixture(scope="module")
def atoms():
    return generate_cuau_atoms(6, seed=3)


def _source(path):
    return AseSource(
        path, energy_key="REF_energy", forces_key="REF_forces", stress_key="REF_stress", format="extxyz"
    )


def _convert(path: str, cache: str, queue) -> None:
    try:
        out = convert_source(_source(path), cutoff=4.0, cache_dir=cache)
        queue.put(("ok", str(out.entry), len(out.dataset), [float(out.dataset[i].pos.sum()) for i in range(len(out.dataset))]))
    except BaseException as exc:  # reported to the test, which fails on it
        queue.put(("error", repr(exc), 0, []))


def test_two_processes_converting_one_file_at_once_both_succeed(tmp_path, atoms):
    path = write_extxyz(tmp_path / "train.xyz", atoms)
    ctx = multiprocessing.get_context("spawn")
    for attempt in range(2):  # the second round converts again into a cache the first filled
        cache = tmp_path / f"cache{attempt}"
        queue = ctx.Queue()
        procs = [ctx.Process(target=_convert, args=(str(path), str(cache), queue)) for _ in range(2)]
        for p in procs:
            p.start()
        results = [queue.get(timeout=300) for _ in procs]
        for p in procs:
            p.join(timeout=60)
        assert [r[0] for r in results] == ["ok", "ok"], results
        assert results[0][1] == results[1][1] and results[0][2] == results[1][2] == len(atoms)
        assert results[0][3] == results[1][3]
        leftovers = [p.name for p in cache.iterdir() if p.name.startswith(".")]
        assert leftovers == [], leftovers  # no half-built folder left behind


def test_names_are_literal_and_other_files_entries_survive(tmp_path, atoms):
    cache = tmp_path / "cache"
    odd = write_extxyz(tmp_path / "train[1].xyz", atoms)
    assert not convert_source(_source(odd), cutoff=4.0, cache_dir=cache).cached
    assert convert_source(_source(odd), cutoff=4.0, cache_dir=cache).cached

    a = write_extxyz(tmp_path / "a.xyz", atoms[:3])
    old = write_extxyz(tmp_path / "a.xyz.old", atoms[3:])
    old_entry = convert_source(_source(old), cutoff=4.0, cache_dir=cache).entry
    convert_source(_source(a), cutoff=4.0, cache_dir=cache)
    assert old_entry.exists() and convert_source(_source(old), cutoff=4.0, cache_dir=cache).cached

    # two runs, two different files named train.xyz, one cache folder: both stay cached
    run_a = write_extxyz(tmp_path / "runA" / "train.xyz", atoms[:2])
    run_b = write_extxyz(tmp_path / "runB" / "train.xyz", atoms[2:])
    for _ in range(2):
        convert_source(_source(run_a), cutoff=4.0, cache_dir=cache)
        convert_source(_source(run_b), cutoff=4.0, cache_dir=cache)
    assert convert_source(_source(run_a), cutoff=4.0, cache_dir=cache).cached
    assert convert_source(_source(run_b), cutoff=4.0, cache_dir=cache).cached

    # a new content of one file still replaces that file's own older entry
    before = convert_source(_source(run_a), cutoff=4.0, cache_dir=cache).entry
    write_extxyz(run_a, atoms[:4])
    after = convert_source(_source(run_a), cutoff=4.0, cache_dir=cache)
    assert not after.cached and len(after.dataset) == 4 and not before.exists()


@pytest.mark.parametrize("damage", ["not json", "missing key", "bad isolated atoms"])
def test_a_damaged_record_is_rebuilt_with_a_reason(tmp_path, atoms, damage):
    path = write_extxyz(tmp_path / "train.xyz", atoms)
    entry = convert_source(_source(path), cutoff=4.0).entry
    record_path = entry / "record.json"
    record = json.loads(record_path.read_text())
    if damage == "not json":
        record_path.write_text("{garbled")
    elif damage == "missing key":
        del record["schema"]
        record_path.write_text(json.dumps(record))
    else:
        record["isolated_atoms"] = [["Cu", "x"]]
        record_path.write_text(json.dumps(record))
    log: list[str] = []
    out = convert_source(_source(path), cutoff=4.0, log=log.append)
    assert not out.cached and len(out.dataset) == len(atoms) and out.entry == entry
    assert convert_source(_source(path), cutoff=4.0).cached
    assert any("rebuilding" in line or "converting" in line for line in log), log


def test_a_container_swapped_in_from_another_file_is_not_used(tmp_path, atoms):
    one = write_extxyz(tmp_path / "one" / "train.xyz", atoms[:2])
    two = write_extxyz(tmp_path / "two" / "train.xyz", atoms[2:])
    first = convert_source(_source(one), cutoff=4.0)
    second = convert_source(_source(two), cutoff=4.0)
    data = next(p for p in first.entry.iterdir() if p.name.startswith("data."))
    shutil.rmtree(data)
    shutil.copytree(next(p for p in second.entry.iterdir() if p.name.startswith("data.")), data)
    log: list[str] = []
    again = convert_source(_source(one), cutoff=4.0, log=log.append)
    assert not again.cached and len(again.dataset) == 2
    assert any("written for another source" in line for line in log), log

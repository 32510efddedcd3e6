"""The conversion cache shared by runs: concurrent conversions, literal names, shared cache
folders, damaged records and swapped containers (issue 30, items 1 and 2)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from hydragnn.data.emt import generate_cuau_atoms, write_extxyz
from hydragnn.data.io.ase_source import AseSource
from hydragnn.data.io.conversion import convert_source


@pytest.fixture(scope="module")
def atoms():
    return generate_cuau_atoms(6, seed=3)


def _source(path):
    return AseSource(path, energy_key="REF_energy", forces_key="REF_forces", stress_key="REF_stress", format="extxyz")


_CONVERT = """
import json, os, sys, time
from hydragnn.data.io.ase_source import AseSource
from hydragnn.data.io.conversion import convert_source
source = AseSource(sys.argv[1], energy_key="REF_energy", forces_key="REF_forces", stress_key="REF_stress")
print("ready", flush=True)
while not os.path.exists(sys.argv[3]):  # both start converting together, the second sys.argv[4] s later
    time.sleep(0.001)
time.sleep(float(sys.argv[4]))
out = convert_source(source, cutoff=4.0, cache_dir=sys.argv[2])
print(json.dumps([str(out.entry), len(out.dataset), [float(out.dataset[i].pos.sum()) for i in range(len(out.dataset))]]))
"""


def test_two_processes_converting_one_file_at_once_both_succeed(tmp_path):
    atoms = generate_cuau_atoms(150, seed=4)  # a conversion of about a second: the second starts mid-way
    path = write_extxyz(tmp_path / "train.xyz", atoms)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE"}
    for attempt in range(2):  # the second round converts again into a cache the first filled
        cache, go = tmp_path / f"cache{attempt}", tmp_path / f"go{attempt}"
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", _CONVERT, str(path), str(cache), str(go), delay],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=env,
            )
            for delay in ("0", "0.3")
        ]
        for p in procs:
            assert p.stdout.readline().strip() == "ready", p.stderr.read()[-2000:]
        go.touch()
        outs = [p.communicate(timeout=600) for p in procs]
        assert [p.returncode for p in procs] == [0, 0], [err[-2000:] for _, err in outs]
        results = [json.loads(out.strip().splitlines()[-1]) for out, _ in outs]
        assert results[0] == results[1] and results[0][1] == len(atoms)
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

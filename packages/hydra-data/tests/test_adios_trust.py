"""ADIOS2 datasets that are not known-good are read by ADIOS2 in a child process first: a crafted
file that crashes or hangs the library becomes a ContainerError, never a lost process."""

from __future__ import annotations

import json
import random
import subprocess

import pytest
import torch
from torch_geometric.data import Data

from hydragnn.data import ContainerError, open_dataset, write_dataset
from hydragnn.data.containers import adios_trust
from hydragnn.data.containers.adios_format import INTEGRITY, integrity_record

pytest.importorskip("adios2", reason="adios2 not installed (pip install hydra-data[adios])")


def _samples(n: int = 6) -> list[Data]:
    g = torch.Generator().manual_seed(0)
    return [Data(pos=torch.randn(3 + i, 3, generator=g), energy=torch.randn(1, generator=g)) for i in range(n)]


def _reseal_as_a_stranger(path):
    """Recompute the integrity record the way someone without this user's key would: no seal."""
    record = {"version": 1, "files": integrity_record(path)}
    (path / INTEGRITY).write_text(json.dumps(record))


@pytest.fixture()
def probes(monkeypatch):
    calls = []
    real = adios_trust.probe_in_child

    def counting(path, timeout_s=None):
        calls.append(path)
        return real(path, timeout_s)

    monkeypatch.setattr("hydragnn.data.containers.adios_container.probe_in_child", counting)
    return calls


def _same(a: list[Data], b) -> None:
    assert len(b) == len(a)
    for x, i in zip(a, range(len(b))):
        assert torch.equal(x.pos, b[i].pos) and torch.equal(x.energy, b[i].energy)


def test_own_datasets_open_in_process(tmp_path, probes):
    samples = _samples()
    path = write_dataset(tmp_path / "own.bp", samples, "adios")
    assert "seal" in json.loads((path / INTEGRITY).read_text())
    _same(samples, open_dataset(path))
    assert probes == []


def test_foreign_datasets_are_probed_once_then_remembered(tmp_path, probes):
    samples = _samples()
    path = write_dataset(tmp_path / "foreign.bp", samples, "adios")
    _reseal_as_a_stranger(path)
    _same(samples, open_dataset(path))
    _same(samples, open_dataset(path))
    assert probes == [path]  # the second open trusted the verified record
    record = json.loads((path / INTEGRITY).read_text())
    record["seal"] = "0" * 64  # a forged seal is no seal
    (path / INTEGRITY).write_text(json.dumps(record))
    open_dataset(path)
    assert len(probes) == 1  # still the same verified file list


def test_garbled_metadata_never_takes_the_process_down(tmp_path, probes):
    """Byte flips in the ADIOS2 metadata with the integrity record recomputed (the defect: 26 of
    60 such files crashed or hung the process). Each ends in a ContainerError or a correct read."""
    samples = _samples(4)
    clean = write_dataset(tmp_path / "clean.bp", samples, "adios")
    rng = random.Random(0)
    outcomes = {"error": 0, "read": 0}
    for trial in range(5):
        path = tmp_path / f"garbled{trial}.bp"
        subprocess.run(["cp", "-r", str(clean), str(path)], check=True)
        for name in ("md.0", "md.idx"):
            data = bytearray((path / name).read_bytes())
            for _ in range(1 + trial):
                data[rng.randrange(len(data))] = rng.randrange(256)
            (path / name).write_bytes(bytes(data))
        _reseal_as_a_stranger(path)
        try:
            ds = open_dataset(path)
            got = [ds[i] for i in range(len(ds))]
        except ContainerError as exc:
            assert str(path) in str(exc)
            outcomes["error"] += 1
        else:
            _same(samples, got)
            outcomes["read"] += 1
    assert len(probes) == 5 and outcomes["error"] >= 1, outcomes


def test_a_probe_that_hangs_or_crashes_is_an_error(tmp_path, monkeypatch):
    path = write_dataset(tmp_path / "x.bp", _samples(), "adios")
    script = tmp_path / "adios_probe.py"
    monkeypatch.setattr(adios_trust, "__file__", str(tmp_path / "adios_trust.py"))
    script.write_text("import time; time.sleep(60)\n")
    with pytest.raises(ContainerError, match=r"did not finish reading this dataset within 1 s"):
        adios_trust.probe_in_child(path, timeout_s=1.0)
    script.write_text("import os, signal; os.kill(os.getpid(), signal.SIGSEGV)\n")
    with pytest.raises(ContainerError, match=r"x.bp: the ADIOS2 reader crashed \(SIGSEGV\)"):
        adios_trust.probe_in_child(path)

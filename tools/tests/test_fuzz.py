"""Property-based fuzzing of every reader: each case ends in the package's own error or a correct
result, never another exception, a crash or a hang (a per-case deadline).

Targets: pickle and ``.pt`` containers (byte flips, truncations), ADIOS2 datasets (garbled
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
import json
import os
import shutil
import signal
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch_geometric.data import Data

from hydragnn.data import DataError, Schema, open_dataset, prepare, write_dataset
from hydragnn.data.reference import CUAU_VARIABLES, generate_cuau
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
@given(key=st.sampled_from(sorted(ARCH) + ["num_species", "max_neighbours", "task_weights", "reference_energies"]), value=hostile)
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
@given(data=arrays, cell=cells, extra=st.dictionaries(st.sampled_from(["energy", "forces", "stress", "x"]), hostile, max_size=2))
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

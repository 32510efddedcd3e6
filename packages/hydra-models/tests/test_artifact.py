"""Model artifacts: bit-identical round trip, manifest, corruption, newer formats, no pickle."""

from __future__ import annotations

import hashlib
import json
import os
import pickle

import pytest
import torch

from hydragnn.models import FORMAT_VERSION, ArtifactError, load_artifact, read_manifest, save_artifact
from hydragnn.models.artifact import _HEADER, CHECKSUM_BYTES, MAGIC
from hydragnn.models.testing import CUTOFF, build
from hydragnn.models.testing.graphs import collate, periodic_samples


@pytest.fixture()
def model():
    return build("SchNet", seed=1)


@pytest.fixture()
def batch():
    return collate(periodic_samples(CUTOFF)[:3])


def _parts(path):
    data = path.read_bytes()
    _, version, length = _HEADER.unpack_from(data)
    manifest = json.loads(data[_HEADER.size : _HEADER.size + length])
    end = len(data) - (CHECKSUM_BYTES if version >= 2 else 0)
    return version, manifest, data[_HEADER.size + length : end]


def _write(path, manifest, weights, version=None):
    """Write an artifact as a careful forger would: consistent header and, from format 2, checksum."""
    blob = json.dumps(manifest).encode()
    version = manifest["format_version"] if version is None else version
    body = _HEADER.pack(MAGIC, version, len(blob)) + blob + weights
    path.write_bytes(body + (hashlib.sha256(body).digest() if version >= 2 else b""))


def test_round_trip_bit_identical_with_manifest(model, batch, tmp_path):
    norm = {"energy": {"mean": torch.tensor([1.5]), "std": 2.0}}
    path = save_artifact(model, tmp_path / "m.hydra", normalization=norm, species=[29, 79], extra={"epochs": 3})
    assert [p.name for p in tmp_path.iterdir()] == ["m.hydra"]  # no temporary file left behind
    state = torch.random.get_rng_state()
    loaded = load_artifact(path)
    assert torch.equal(torch.random.get_rng_state(), state), "loading must not move the global RNG"
    assert not loaded.training
    ref, out = model(batch), loaded(batch)
    assert sorted(ref) == sorted(out)
    for key in ref:
        assert torch.equal(ref[key], out[key]), key
    m = loaded.manifest
    assert m["format_version"] == FORMAT_VERSION and m["format"] == "hydragnn-model"
    assert set(m["writer"]) == {"hydra-models", "hydra-data", "torch"} and m["writer"]["hydra-models"]
    assert m["architecture"] == model.config.raw and m["schema"] == model.schema.to_dict()
    assert m["normalization"] == {"energy": {"mean": [1.5], "std": 2.0}}
    assert m["species"] == [29, 79] and m["cutoff"] == CUTOFF and m["dtype"] == "float32"
    assert m["extra"] == {"epochs": 3}
    assert read_manifest(path) == m


@pytest.mark.parametrize("precision", ["bf16", "fp64"])
def test_round_trip_other_precisions(precision, batch, tmp_path):
    model = build("SchNet", precision=precision, reference_energies={"29": -0.1, "79": 0.2})
    loaded = load_artifact(save_artifact(model, tmp_path / "m.hydra"))
    assert loaded.manifest["dtype"] == {"bf16": "bfloat16", "fp64": "float64"}[precision]
    dtype = torch.float64 if precision == "fp64" else torch.float32
    b = batch.clone()
    b.pos = b.pos.to(dtype)
    ref, out = model(b), loaded(b)
    for key in ref:
        assert torch.equal(ref[key], out[key]), key
    assert loaded.energy_head.reference.dtype == (torch.float32 if precision == "bf16" else torch.float64)


def test_model_cast_after_build_round_trips(batch, tmp_path):
    model = build("SchNet").double()  # built as fp32, cast by the user
    b = batch.clone()
    b.pos = b.pos.double()
    loaded = load_artifact(save_artifact(model, tmp_path / "m.hydra"))
    assert loaded.manifest["dtype"] == "float64" and loaded.dtype == torch.float64
    ref, out = model(b), loaded(b)
    for key in ref:
        assert torch.equal(ref[key], out[key]), key


def test_overwrite_is_atomic_replace(model, tmp_path):
    path = tmp_path / "m.hydra"
    path.write_bytes(b"old")
    save_artifact(model, path)
    assert path.read_bytes()[:8] == MAGIC
    assert len(list(tmp_path.iterdir())) == 1


def test_missing_file(tmp_path):
    with pytest.raises(ArtifactError, match="cannot read the model artifact"):
        load_artifact(tmp_path / "nope.hydra")


@pytest.mark.parametrize("keep", [0, 5, 8, 19, 40, -100, -1])
def test_truncated(model, tmp_path, keep):
    path = save_artifact(model, tmp_path / "m.hydra")
    data = path.read_bytes()
    path.write_bytes(data[:keep] if keep >= 0 else data[: len(data) + keep])
    with pytest.raises(ArtifactError, match="not a HydraGNN model artifact|truncated|corrupted"):
        load_artifact(path)


def test_corrupted_weight_byte(model, tmp_path):
    path = save_artifact(model, tmp_path / "m.hydra")
    data = bytearray(path.read_bytes())
    data[-10] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(ArtifactError, match="SHA-256"):
        load_artifact(path)


def test_corrupted_manifest(model, tmp_path):
    path = save_artifact(model, tmp_path / "m.hydra")
    version, manifest, weights = _parts(path)
    blob = b"#" + json.dumps(manifest).encode()[1:]
    body = _HEADER.pack(MAGIC, version, len(blob)) + blob + weights
    path.write_bytes(body + hashlib.sha256(body).digest())  # a valid checksum around broken JSON
    with pytest.raises(ArtifactError, match="corrupted artifact manifest"):
        load_artifact(path)


def test_one_flipped_manifest_bit_is_refused(model, tmp_path):
    """radius 4.0 -> 5.0 changes energies by tens of eV: the checksum covers the manifest too."""
    path = save_artifact(model, tmp_path / "m.hydra")
    data = path.read_bytes()
    assert data.count(b'"radius": 4.0') == 1
    path.write_bytes(data.replace(b'"radius": 4.0', b'"radius": 5.0'))
    with pytest.raises(ArtifactError, match="do not match the file's SHA-256 checksum"):
        load_artifact(path)
    with pytest.raises(ArtifactError, match="SHA-256"):
        read_manifest(path)


def _old_writer_model(seed=1):
    """A model as writers before format 3 built it: graph heads without input standardisation."""
    heads = {"graph": {"num_sharedlayers": 1, "num_headlayers": 1, "input_norm": "none"}, "node": {"num_headlayers": 1}}
    return build("SchNet", seed=seed, output_heads=heads)


def _as_written_by(path, version, tmp_path):
    """``path`` rewritten as format ``version`` did: its architecture without ``input_norm``."""
    _, manifest, weights = _parts(path)
    manifest["format_version"] = version
    del manifest["architecture"]["output_heads"]["graph"]["input_norm"]
    old = tmp_path / f"format{version}.hydra"
    _write(old, manifest, weights)
    return old


@pytest.mark.parametrize("version", [1, 2])
def test_older_formats_are_still_read_as_they_were_written(version, batch, tmp_path):
    """Format 1 (no trailing checksum) and 2 files: graph heads without input standardisation."""
    model = _old_writer_model()
    old = _as_written_by(save_artifact(model, tmp_path / "m.hydra"), version, tmp_path)
    if version == 1:
        assert not old.read_bytes().endswith(hashlib.sha256(old.read_bytes()[:-CHECKSUM_BYTES]).digest())
    loaded = load_artifact(old)
    assert loaded.graph_heads is not None and loaded.graph_heads.input_norm is None
    for key, value in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[key], value)
    ref, out = model(batch), loaded(batch)
    for key in ref:
        assert torch.equal(ref[key], out[key]), key
    manifest = read_manifest(old)
    assert manifest["format_version"] == version
    assert manifest["architecture"]["output_heads"]["graph"]["input_norm"] == "none"


def test_a_mace_with_mace_torchs_scales_round_trips(batch, tmp_path):
    """``scales`` and ``residual_first_layer`` travel in the manifest: the loaded model computes
    what the saved one did (the two scale settings compute different functions of one set of
    weights, so a key lost on the way would show)."""
    arch = {"hidden_dim": 8, "num_conv_layers": 2, "max_ell": 1}
    model = build("MACE", seed=1, scales="mace-torch", residual_first_layer=True, **arch)
    loaded = load_artifact(save_artifact(model, tmp_path / "m.hydra"))
    assert loaded.config.raw["scales"] == "mace-torch" and loaded.config.raw["residual_first_layer"] is True
    ref, out = model(batch), loaded(batch)
    for key in ref:
        assert torch.equal(ref[key], out[key]), key
    unit = build("MACE", seed=1, residual_first_layer=True, **arch)
    unit.load_state_dict(model.state_dict())
    energy = next(iter(ref))
    assert not torch.allclose(unit(batch)[energy], ref[energy])


def test_the_current_format_standardises_graph_head_inputs(model, batch, tmp_path):
    """A model built now has the standardisation; its statistics travel in the artifact."""
    assert model.graph_heads is not None and model.graph_heads.input_norm is not None
    model.train()
    model(batch)  # one training forward sets the running statistics
    model.eval()
    loaded = load_artifact(save_artifact(model, tmp_path / "m.hydra"))
    assert loaded.graph_heads is not None and loaded.graph_heads.input_norm is not None
    stats = loaded.graph_heads.input_norm.running_mean
    assert torch.equal(stats, model.graph_heads.input_norm.running_mean) and stats.abs().sum() > 0
    ref, out = model(batch), loaded(batch)
    for key in ref:
        assert torch.equal(ref[key], out[key]), key


def test_weights_holding_nan_are_refused_naming_the_tensor(model, tmp_path):
    """A diverged model would answer NaN energies silently: its artifact is refused at load."""
    with torch.no_grad():
        first = next(model.parameters())
        first.view(-1)[0] = float("nan")
    name = next(k for k, v in model.state_dict().items() if v.is_floating_point() and v.isnan().any())
    path = save_artifact(model, tmp_path / "nan.hydra")
    with pytest.raises(ArtifactError, match=f"nan.hydra: the weights hold NaN or inf values, in \\['{name}'\\]"):
        load_artifact(path)


def test_architecture_too_large_for_its_weights_is_refused_before_allocating(model, tmp_path):
    """A 30000-wide architecture around a tiny model's weights (checksums forged) is refused from the
    declared sizes; sizes each within the bounds (1900-wide filters: about 300 MiB built, under the
    guard's 1 GiB for derived constants such as MACE's) by the weights that do not fit them."""
    path = save_artifact(model, tmp_path / "m.hydra")
    _, manifest, weights = _parts(path)
    manifest["architecture"]["hidden_dim"] = 30000
    _write(path, manifest, weights)
    with pytest.raises(ArtifactError, match="does not fit its weights: architecture.hidden_dim is 30000"):
        load_artifact(path)
    manifest["architecture"].update(hidden_dim=1900, num_radial=1900)  # 14 MiB filters, two per layer
    _write(path, manifest, weights)
    with pytest.raises(ArtifactError, match="the weights do not fit the architecture"):
        load_artifact(path)


def test_allocation_guard_counts_every_allocation_in_all():
    from hydragnn.models.artifact import _AllocationGuard, _TooLarge

    with pytest.raises(_TooLarge, match="allowed in all"), _AllocationGuard((2**20, 3 * 2**20)):
        kept = [torch.zeros(2**18) for _ in range(4)]  # 1 MiB each: the fourth passes 3 MiB in all
    with _AllocationGuard((2**20, 3 * 2**20)):
        kept = [torch.zeros(2**18) for _ in range(3)]
    assert len(kept) == 3


def test_a_mace_at_mace_torchs_shape_loads_after_training(tmp_path):
    """max_ell 3, correlation 3 (mace-torch's defaults): its symmetric-contraction constants are
    derived, not stored (16.5 MiB per tensor, 227 MiB in all while built, for 1.6 MiB of weights);
    the allocation guard refused the trained model before 2026-12-06."""
    model = build("MACE", hidden_dim=32, num_conv_layers=2, max_ell=3, node_max_ell=0, correlation=3)
    loaded = load_artifact(save_artifact(model, tmp_path / "mace.hydra"))
    assert loaded.config.raw["max_ell"] == 3


def test_newer_format_refused_naming_version(model, tmp_path):
    path = save_artifact(model, tmp_path / "m.hydra")
    _, manifest, weights = _parts(path)
    manifest["format_version"] = FORMAT_VERSION + 1
    manifest["something_new"] = {"x": 1}
    _write(path, manifest, weights)
    with pytest.raises(
        ArtifactError, match=f"format version {FORMAT_VERSION + 1} is newer.*reads format version {FORMAT_VERSION + 1}"
    ):
        load_artifact(path)


def test_header_and_manifest_disagree(model, tmp_path):
    path = save_artifact(model, tmp_path / "m.hydra")
    _, manifest, weights = _parts(path)
    manifest["format_version"] = 0
    _write(path, manifest, weights, version=FORMAT_VERSION)
    with pytest.raises(ArtifactError, match="header says format version"):
        load_artifact(path)


def test_weights_not_fitting_architecture(model, tmp_path):
    path = save_artifact(model, tmp_path / "m.hydra")
    _, manifest, weights = _parts(path)
    manifest["architecture"]["hidden_dim"] = 24
    _write(path, manifest, weights)
    with pytest.raises(ArtifactError, match="do not fit the architecture"):
        load_artifact(path)


class _Payload:
    """Unpickling this creates a marker directory: proof that pickle ran."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.mkdir, (self.marker,))


def test_pickle_checkpoint_is_refused(tmp_path):
    marker = str(tmp_path / "pwned")
    path = tmp_path / "model.pt"
    torch.save({"state": _Payload(marker)}, path)
    with pytest.raises(ArtifactError, match="not a HydraGNN model artifact.*never loaded"):
        load_artifact(path)
    assert not os.path.exists(marker)


def test_pickle_in_weights_section_is_refused(model, tmp_path):
    """A well-formed header and manifest around pickle bytes (valid checksum) is still refused."""
    marker = str(tmp_path / "pwned")
    path = save_artifact(model, tmp_path / "m.hydra")
    _, manifest, _ = _parts(path)
    payload = pickle.dumps(_Payload(marker))
    manifest["weights_bytes"] = len(payload)
    manifest["weights_sha256"] = hashlib.sha256(payload).hexdigest()
    _write(path, manifest, payload)
    with pytest.raises(ArtifactError, match="corrupted artifact weights"):
        load_artifact(path)
    assert not os.path.exists(marker)


def test_save_rejects_bad_inputs(model, tmp_path):
    with pytest.raises(ArtifactError, match="expected a HydraModel"):
        save_artifact(torch.nn.Linear(2, 2), tmp_path / "x.hydra")
    with pytest.raises(ArtifactError, match="extra.*not JSON-serialisable"):
        save_artifact(model, tmp_path / "x.hydra", extra={"f": object()})
    assert not list(tmp_path.iterdir())


def test_artifact_permissions_follow_the_umask(model, tmp_path):
    old = os.umask(0o022)
    try:
        path = save_artifact(model, tmp_path / "m.hydra")
    finally:
        os.umask(old)
    assert oct(path.stat().st_mode & 0o777) == oct(0o644)  # readable by the group, as open() would make it


@pytest.mark.parametrize(
    "precision, key, value",
    [
        ("fp64", "radius", 3.402823466385289e38),
        ("fp32", "hidden_dim", -4),
        ("fp32", "mpnn_type", "NoSuchNet"),
        ("fp32", "num_radial", 2**40),
    ],
)
def test_hostile_architecture_values_are_artifact_errors(tmp_path, precision, key, value):
    """Found by the fuzz suite (tools/tests/test_fuzz.py): a huge radius in an fp64 model overflowed
    inside the build with a RuntimeError instead of an ArtifactError."""
    from hydragnn.data import Schema
    from hydragnn.data.emt import CUAU_VARIABLES
    from hydragnn.models import build_model

    arch = {"mpnn_type": "SchNet", "hidden_dim": 8, "num_conv_layers": 1, "radius": 4.0, "num_radial": 8,
            "enable_interatomic_potential": True, "output_heads": {"node": {"num_headlayers": 1}}, "precision": precision}  # fmt: skip
    model = build_model(arch, Schema.from_dict(CUAU_VARIABLES))
    path = save_artifact(model, tmp_path / "m.hydra")
    _, manifest, weights = _parts(path)
    manifest["architecture"][key] = value
    _write(path, manifest, weights)
    with pytest.raises(ArtifactError):
        load_artifact(path)


def test_a_deeply_nested_manifest_is_an_artifact_error(model, tmp_path):
    """100,000 nested brackets made json raise RecursionError; now the package's own error, short."""
    path = save_artifact(model, tmp_path / "m.hydra")
    version, manifest, weights = _parts(path)
    blob = ('{"format": "hydragnn-model", "x": ' + "[" * 100_000 + "]" * 100_000 + "}").encode()
    body = _HEADER.pack(MAGIC, version, len(blob)) + blob + weights
    path.write_bytes(body + hashlib.sha256(body).digest())
    with pytest.raises(ArtifactError, match="corrupted artifact manifest") as info:
        read_manifest(path)
    assert len(str(info.value)) < 600


def test_an_integer_of_thousands_of_digits_is_an_artifact_error(model, tmp_path):
    """json refuses integers over 4300 digits with a plain ValueError; now the package's own error."""
    path = save_artifact(model, tmp_path / "m.hydra")
    version, manifest, weights = _parts(path)
    blob = json.dumps(manifest).replace('"num_radial": 8', '"num_radial": ' + "9" * 5000).encode()
    body = _HEADER.pack(MAGIC, version, len(blob)) + blob + weights
    path.write_bytes(body + hashlib.sha256(body).digest())
    with pytest.raises(ArtifactError, match="corrupted artifact manifest") as info:
        load_artifact(path)
    assert len(str(info.value)) < 600


def _never_built(monkeypatch):
    """Make building a model a test failure: the refusal must come from the manifest and weights alone."""

    def build(*args, **kwargs):
        raise AssertionError("the model was built before the declared sizes were checked")

    monkeypatch.setattr("hydragnn.models.artifact.build_model", build)


@pytest.mark.parametrize(
    "where, value, bound",
    [
        (("num_radial",), 10**9, "values"),
        (("hidden_dim",), 10**6, "values"),
        (("num_conv_layers",), 5000, "layers"),
        (("output_heads", "graph", "num_headlayers"), 10**9, "layers"),
        (("output_heads", "node", "dim_headlayers"), [10**9], "values"),
        (("num_gaussians",), 2**62, "values"),
        (("committee",), 64, "layers"),
    ],
)
def test_declared_sizes_beyond_the_weights_are_refused_before_building(
    model, tmp_path, monkeypatch, where, value, bound
):
    """A manifest declaring more than its weights can hold (``num_radial`` 1e9 used 4.3 GB, 5000 layers
    took minutes) is refused from the sizes alone, naming the field, the value and the bound."""
    import tracemalloc

    path = save_artifact(model, tmp_path / "m.hydra")
    _, manifest, weights = _parts(path)
    node = manifest["architecture"]
    for key in where[:-1]:
        node = node[key]
    node[where[-1]] = value
    _write(path, manifest, weights)
    _never_built(monkeypatch)
    tracemalloc.start()
    try:
        with pytest.raises(ArtifactError, match="does not fit its weights") as info:
            load_artifact(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    message = str(info.value)
    assert (
        f"architecture.{'.'.join(where)}" in message and str(value[0] if isinstance(value, list) else value) in message
    )
    assert bound in message and len(message) < 500
    assert peak < 8 * 2**20  # nothing sized by the declared values was allocated


def test_one_high_layer_index_does_not_make_room_for_that_many_layers(model, tmp_path, monkeypatch):
    """Layers are counted in the weights, not read from an index a forger can choose."""
    from safetensors.torch import save as st_save

    path = save_artifact(model, tmp_path / "m.hydra")
    _, manifest, _ = _parts(path)
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    weights = st_save({**state, "encoder.interactions.4999.lin.weight": torch.zeros(1)})
    manifest.update(weights_bytes=len(weights), weights_sha256=hashlib.sha256(weights).hexdigest())
    manifest["architecture"]["num_conv_layers"] = 5000
    _write(path, manifest, weights)
    _never_built(monkeypatch)
    with pytest.raises(ArtifactError, match="num_conv_layers is 5000, but the weights hold at most 3 layers"):
        load_artifact(path)


def test_declared_schema_dims_beyond_the_weights_are_refused_before_building(model, tmp_path, monkeypatch):
    path = save_artifact(model, tmp_path / "m.hydra")
    _, manifest, weights = _parts(path)
    manifest["schema"]["outputs"][0]["dim"] = 10**9
    _write(path, manifest, weights)
    _never_built(monkeypatch)
    with pytest.raises(ArtifactError, match=r"schema\.outputs\[0\]\.dim is 1000000000"):
        load_artifact(path)


def test_every_registered_encoder_round_trips_under_the_size_bounds(tmp_path):
    """The bounds refuse only lying manifests: every stack's own artifact still loads."""
    from hydragnn.models.testing import REGISTERED_ENCODERS

    for name in REGISTERED_ENCODERS:
        model = build(name, seed=0)
        load_artifact(save_artifact(model, tmp_path / f"{name}.hydra"))


def test_large_integers_that_size_nothing_are_not_bounded(tmp_path):
    """Runtime caps and loss weights written as JSON integers are not sizes: such a model loads."""
    model = build("SchNet", max_neighbours=100_000, energy_weight=5000)
    assert load_artifact(save_artifact(model, tmp_path / "m.hydra")).config.raw["max_neighbours"] == 100_000


@pytest.mark.parametrize(
    "make", [lambda: torch.linspace(0, 1, 10**7), lambda: torch.arange(10**7), lambda: torch.arange(0.0, 1.0, 1e-7), lambda: torch.logspace(0, 1, 10**7), lambda: torch.eye(4000)]
)  # fmt: skip
def test_allocation_guard_sizes_ranges_before_allocating(make):
    """``linspace`` / ``arange`` / ``eye`` are sized from their arguments like ``empty`` (a radial
    basis of 1e9 points was allocated in full before anything refused it)."""
    from hydragnn.models.artifact import _AllocationGuard, _TooLarge

    with pytest.raises(_TooLarge), _AllocationGuard((2**20, 2**20)):
        make()
    with _AllocationGuard((2**20, 2**20)):
        assert torch.linspace(0, 1, 100).numel() == 100 and torch.arange(1, 7, 2).tolist() == [1, 3, 5]


def test_errors_listing_keys_are_capped(model, tmp_path):
    """Weights under other names: the error names the first keys and counts the rest (thousands of
    missing keys made a message of hundreds of KB)."""
    from safetensors.torch import save as st_save

    path = save_artifact(model, tmp_path / "m.hydra")
    _, manifest, _ = _parts(path)
    weights = st_save({f"renamed.{k}": v.contiguous() for k, v in model.state_dict().items()})
    manifest["weights_bytes"] = len(weights)
    manifest["weights_sha256"] = hashlib.sha256(weights).hexdigest()
    _write(path, manifest, weights)
    with pytest.raises(ArtifactError, match="do not fit the architecture") as info:
        load_artifact(path)
    message = str(info.value)
    n = len(model.state_dict())
    assert f"and {n - 10} more" in message and len(message) < 2000

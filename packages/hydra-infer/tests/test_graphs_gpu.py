"""Real CUDA-graph capture (needs a GPU; skipped without CUDA). The policy itself is tested on CPU
through the replay backend in ``test_graphs.py``."""

from __future__ import annotations

import pytest
import torch
from infer_helpers import cluster, tiny_model

from hydragnn.infer import HydraCalculator
from hydragnn.infer.graphs import CudaGraphBackend

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


@pytest.fixture(scope="module")
def model32():
    return tiny_model(precision="fp32").cuda()


def test_cuda_capture_replay_matches_regular(model32):
    calc = HydraCalculator(model32, device="cuda", cuda_graph=True)
    assert isinstance(calc.graph_engine.backend, CudaGraphBackend)
    ref = HydraCalculator(model32, device="cuda")
    pos, z = cluster(12, seed=1)
    for _ in range(2):
        calc(pos, z, forces=True)
    stats = calc.memory_stats()
    assert stats["admitted"] == 1 and stats["graph_pool_bytes"] > 0 and stats["static_buffer_bytes"] > 0
    for shift in (0.0, 0.03, -0.02):
        got = calc(pos + shift, z, forces=True)
        want = ref(pos + shift, z, forces=True)
        torch.testing.assert_close(got["energy"], want["energy"], rtol=0, atol=5e-6 * len(z))
        torch.testing.assert_close(got["forces"], want["forces"], rtol=1e-5, atol=1e-4)
    assert calc.memory_stats()["replays"] == 3
    calc.clear_cuda_graphs()
    stats = calc.memory_stats()
    assert stats["engines"] == 0 and stats["graph_pool_bytes"] == 0 and stats["static_buffer_bytes"] == 0


def test_cuda_sparse_overflow_rebuild(model32):
    calc = HydraCalculator(model32, device="cuda", cuda_graph=True, nb_threshold=8)
    ref = HydraCalculator(model32, device="cuda")
    pos, z = cluster(24, seed=2)
    calc(pos, z, forces=True)
    calc(pos, z, forces=True)
    got = calc(pos * 0.6, z, forces=True)  # many more edges than the spare capacity
    stats = calc.memory_stats()
    assert stats["overflows"] == 1 and stats["rebuilds"] == 1 and stats["admitted"] == 2
    torch.testing.assert_close(got["forces"], ref(pos * 0.6, z, forces=True)["forces"], rtol=1e-5, atol=1e-4)
    got = calc(pos * 0.6 + 0.01, z, forces=True)
    torch.testing.assert_close(got["forces"], ref(pos * 0.6 + 0.01, z, forces=True)["forces"], rtol=1e-5, atol=1e-4)
    assert calc.memory_stats()["replays"] == 1


def test_cuda_dense_batch_reuse(model32):
    calc = HydraCalculator(model32, device="cuda", cuda_graph=True)
    ref = HydraCalculator(model32, device="cuda")
    coord = torch.zeros(4, 9, 3)
    numbers = torch.zeros(4, 9, dtype=torch.long)
    for b, n in enumerate((9, 5, 7, 8)):
        p, zz = cluster(n, seed=10 + b)
        coord[b, :n], numbers[b, :n] = torch.as_tensor(p, dtype=torch.float32), torch.as_tensor(zz)
    calc(coord, numbers, forces=True)
    calc(coord, numbers, forces=True)
    calc(coord[:3], numbers[:3], forces=True)  # the first reuse for 3 rows is checked
    got = calc(coord[:3] + 0.01, numbers[:3], forces=True)  # then 3 rows replay the 4-row graph
    stats = calc.memory_stats()
    assert stats["padded_checks"] == 1 and stats["padded_replays"] == 1
    want = ref(coord[:3] + 0.01, numbers[:3], forces=True)
    torch.testing.assert_close(got["forces"], want["forces"], rtol=1e-5, atol=1e-4)


def test_cuda_replays_from_two_streams_are_ordered(model32):
    calc = HydraCalculator(model32, device="cuda", cuda_graph=True)
    ref = HydraCalculator(model32, device="cuda")
    pos, z = cluster(40, seed=3)
    calc(pos, z, forces=True)
    calc(pos, z, forces=True)
    streams = [torch.cuda.Stream(), torch.cuda.Stream()]
    shifts = [0.01 * k for k in range(20)]
    results = []
    for k, shift in enumerate(shifts):
        with torch.cuda.stream(streams[k % 2]):
            results.append(calc(pos + shift, z, forces=True))
    torch.cuda.synchronize()
    for shift, got in zip(shifts, results):
        torch.testing.assert_close(got["energy"], ref(pos + shift, z)["energy"], rtol=0, atol=5e-6 * len(z))
    assert calc.memory_stats()["replays"] == len(shifts)


def test_cuda_pool_accounting_reads_the_pool(model32):
    calc = HydraCalculator(model32, device="cuda", cuda_graph=True)
    pos, z = cluster(30, seed=4)
    for _ in range(2):
        calc(pos, z, forces=True)
    backend = calc.graph_engine.backend
    pool_id = tuple(backend.pool.id)
    segments = torch.cuda.memory_snapshot(pool_id)
    assert segments and calc.memory_stats()["graph_pool_bytes"] == sum(s["total_size"] for s in segments)
    calc.clear_cuda_graphs()
    assert backend.pool is None and calc.memory_stats()["graph_pool_bytes"] == 0

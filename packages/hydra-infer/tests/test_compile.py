"""compile_model=True: one torch.compile(dynamic=True) graph set serves every atom / edge count.

The only test that runs inductor (tens of seconds on CPU for a tiny model)."""

from __future__ import annotations

import torch
import torch._dynamo.utils as dynamo_utils
from infer_helpers import cluster

from hydragnn.infer import HydraCalculator


def test_compiled_matches_eager_without_recompiling(model64):
    torch._dynamo.reset()
    dynamo_utils.counters.clear()
    compiled = HydraCalculator(model64, compile_model=True)
    eager = HydraCalculator(model64)
    graphs = []
    for n in (8, 11, 15, 21):  # different atom and edge counts
        pos, z = cluster(n, seed=n)
        got = compiled(pos, z, forces=True)
        want = eager(pos, z, forces=True)
        torch.testing.assert_close(got["energy"], want["energy"])
        torch.testing.assert_close(got["forces"], want["forces"])
        graphs.append(dynamo_utils.counters["stats"]["unique_graphs"])
    assert graphs[0] > 0, "nothing was compiled"
    # at most one recompilation round (dynamic shapes): never a compile per size
    assert graphs[-1] <= 2 * graphs[0], f"compiled graphs per call: {graphs}"
    torch._dynamo.reset()

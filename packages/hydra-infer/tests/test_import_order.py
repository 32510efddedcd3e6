"""hydragnn and metatomic in one process, in either import order (PyG's ``torch.index_select``
replacement used to break TorchScript for every library imported after it)."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytest.importorskip("metatomic.torch", reason='needs hydra-infer[metatomic]: pip install "hydra-infer[metatomic]"')

SCRIPT = """
import sys
if sys.argv[1] == "hydragnn-first":
    from hydragnn.infer import HydraCalculator
    import metatensor.torch, metatomic.torch
elif sys.argv[1] == "hydragnn-module-first":  # a module imported directly, not through a public name
    import hydragnn.data.emt
    import metatensor.torch, metatomic.torch
    from hydragnn.infer import HydraCalculator
else:
    import metatensor.torch, metatomic.torch
    from hydragnn.infer import HydraCalculator
import torch
import torch_geometric  # loaded in both orders

def pick(x: torch.Tensor, i: torch.Tensor) -> torch.Tensor:
    return torch.index_select(x, 0, i) + torch.select(x, 0, 0)

scripted = torch.jit.script(pick)
x = torch.arange(4.0)
assert torch.equal(scripted(x, torch.tensor([2, 3])), torch.tensor([2.0, 3.0]))
print("ok", HydraCalculator.__name__)
"""


@pytest.mark.parametrize("order", ["hydragnn-first", "hydragnn-module-first", "metatomic-first"])
def test_hydragnn_and_metatomic_share_a_process(tmp_path, order):
    script = tmp_path / "order.py"  # TorchScript reads the source of what it scripts: a file, not -c
    script.write_text(SCRIPT)
    out = subprocess.run([sys.executable, str(script), order], capture_output=True, text=True, timeout=300, check=False)
    assert out.returncode == 0 and "ok HydraCalculator" in out.stdout, out.stderr[-3000:]


def test_registration_is_idempotent_and_leaves_eager_calls_to_pyg():
    import torch
    import torch_geometric.hash_tensor as hash_tensor

    from hydragnn.data.pyg_compat import keep_scripting_builtins

    keep_scripting_builtins()
    assert keep_scripting_builtins() == []  # nothing left to register
    assert torch.index_select is hash_tensor._new_index_select  # PyG's eager wrapper stays in place

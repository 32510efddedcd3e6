"""Serving side by side with mace-torch: energy + forces of the same cells, same threads, one run.

mace-torch is not a dependency of the packages: give a Python that has it (``--mace-python``;
``python -m venv mace && mace/bin/pip install torch==2.13.0 mace-torch``). Both sides serve an
untrained MACE of the same shape (2 interactions, 32 channels, node features up to l = 1,
spherical harmonics up to l = 2, correlation 3, 8 Bessel functions, cutoff 5 Å, float32 and
float64): hydra-infer's ``HydraCalculator`` (regular and ``compile_model=True``) in this process,
mace-torch's ``MACECalculator`` in a child process, on the same rattled fcc Cu-Au cells. Each
size is timed in rounds that alternate the two sides; the medians and their ratio are printed.
Untrained models say nothing of accuracy: for that, the trained comparisons of
``docs/notes/organic_benchmark.md`` and ``docs/notes/mlip_fit.md`` (same files, same budget).

    python tools/bench/serving_vs_mace.py --mace-python mace/bin/python [--sizes 256 2048] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CHILD = r"""
import json, sys, time, statistics
import numpy as np, torch, ase.io
from e3nn import o3
from mace import modules
from mace.calculators import MACECalculator
path, dtype, calls = sys.argv[1], sys.argv[2], int(sys.argv[3])
torch.set_num_threads(int(sys.argv[4]))
torch.set_default_dtype(getattr(torch, dtype))
torch.manual_seed(0)
block = modules.interaction_classes["RealAgnosticResidualInteractionBlock"]
model = modules.MACE(
    r_max=5.0, num_bessel=8, num_polynomial_cutoff=5, max_ell=2, interaction_cls=block, interaction_cls_first=block,
    num_interactions=2, num_elements=2, hidden_irreps=o3.Irreps("32x0e + 32x1o"), MLP_irreps=o3.Irreps("16x0e"),
    gate=torch.nn.functional.silu, atomic_energies=np.zeros(2), avg_num_neighbors=40.0, atomic_numbers=[29, 79],
    correlation=3, radial_type="bessel",
)
calc = MACECalculator(models=model, device="cpu", default_dtype=dtype)
out = {}
for atoms in ase.io.read(path, index=":"):
    atoms.calc = calc
    rng = np.random.default_rng(0)
    times = []
    for k in range(calls + 3):  # TorchScript (e3nn 0.4's code) optimises on its second call
        atoms.positions += rng.normal(scale=1e-3, size=atoms.positions.shape)  # a moving geometry
        t = time.perf_counter()
        atoms.get_forces()
        if k >= 3:
            times.append(time.perf_counter() - t)
    out[len(atoms)] = statistics.median(times)
print(json.dumps(out))
"""


def cells(sizes: list[int]) -> list:
    """Rattled fcc Cu-Au cells of about each size (a cubic repeat of the 4-atom cell)."""
    import numpy as np
    from ase.build import bulk

    out = []
    for n in sizes:
        k = max(1, round((n / 4) ** (1 / 3)))
        atoms = bulk("Cu", "fcc", a=3.7, cubic=True).repeat((k, k, k))
        rng = np.random.default_rng(n)
        atoms.numbers[rng.random(len(atoms)) < 0.3] = 79
        atoms.rattle(0.05, seed=n)
        out.append(atoms)
    return out


def hydra_model(dtype: str):
    import torch

    from hydragnn.data import Schema
    from hydragnn.data.emt import CUAU_VARIABLES
    from hydragnn.models import build_model

    torch.manual_seed(0)
    arch = {
        "mpnn_type": "MACE",
        "hidden_dim": 32,
        "num_conv_layers": 2,
        "radius": 5.0,
        "num_radial": 8,
        "max_ell": 2,
        "node_max_ell": 1,
        "correlation": 3,
        "avg_num_neighbors": 40.0,
        "precision": "fp64" if dtype == "float64" else "fp32",
        "enable_interatomic_potential": True,
        "output_heads": {"node": {"num_headlayers": 1}},
        "task_weights": [1.0, 0.0, 1.0],
    }
    return build_model(arch, Schema.from_dict(CUAU_VARIABLES)).eval()


def time_hydra(calc, atoms, calls: int) -> float:
    import numpy as np
    import torch

    dtype = next(calc.model.parameters()).dtype
    pos = torch.tensor(atoms.positions, dtype=dtype)
    z, cell = torch.tensor(atoms.numbers), torch.tensor(atoms.cell.array, dtype=dtype)
    rng = np.random.default_rng(0)
    times = []
    for k in range(calls + 1):
        pos = pos + torch.tensor(rng.normal(scale=1e-3, size=tuple(pos.shape)), dtype=dtype)
        t = time.perf_counter()
        calc(pos, z, cell=cell, forces=True)
        if k:
            times.append(time.perf_counter() - t)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mace-python", required=True, help="a Python with mace-torch installed")
    parser.add_argument("--sizes", type=int, nargs="+", default=[256, 2048])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--calls", type=int, default=3, help="timed calls per size and round")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    args = parser.parse_args(argv)

    import ase.io
    import torch

    from hydragnn.infer import HydraCalculator

    torch.set_num_threads(args.threads)
    structures = cells(args.sizes)
    model = hydra_model(args.dtype)
    calcs = {"regular": HydraCalculator(model), "compile": HydraCalculator(model, compile_model=True)}
    for calc in calcs.values():  # warm: the compile mode's first call is the compiler's
        time_hydra(calc, structures[0], 1)
    results: dict[str, dict[int, list[float]]] = {k: {} for k in ("mace-torch", *calcs)}
    # mace-torch pins e3nn 0.4, which loads its own packaged constants with torch.load's pre-2.6
    # default: allowed in the peer's process only
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD": "1"}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "cells.xyz"
        ase.io.write(path, structures)
        for _ in range(args.rounds):
            child = [args.mace_python, "-c", CHILD, str(path), args.dtype, str(args.calls), str(args.threads)]
            done = subprocess.run(child, capture_output=True, text=True, env=env, check=False)
            if done.returncode:
                raise RuntimeError(done.stderr[-3000:])
            for n, seconds in json.loads(done.stdout.strip().splitlines()[-1]).items():
                results["mace-torch"].setdefault(int(n), []).append(seconds)
            for name, calc in calcs.items():
                for atoms in structures:
                    results[name].setdefault(len(atoms), []).append(time_hydra(calc, atoms, args.calls))
    print(
        f"MACE E+F of a rattled fcc Cu-Au cell (moving geometry), {args.dtype}, {args.threads} thread(s), "
        f"median of {args.rounds} rounds x {args.calls} calls; untrained models of the same shape"
    )
    print(
        "| atoms | mace-torch ms | hydra regular ms | hydra compile ms | mace-torch / regular | mace-torch / compile |"
    )
    print("|---|---|---|---|---|---|")
    for atoms in structures:
        n = len(atoms)
        m, r, c = (1e3 * statistics.median(results[k][n]) for k in ("mace-torch", "regular", "compile"))
        print(f"| {n} | {m:.1f} | {r:.1f} | {c:.1f} | {m / r:.2f} | {m / c:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

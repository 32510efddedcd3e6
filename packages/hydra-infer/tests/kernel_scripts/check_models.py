"""Patched (kernel) vs stock tiny MLIPs: energies and forces; run with TRITON_INTERPRET=1.

SchNet and PAINN in float32 / float64, plus SchNet with GPS global attention and PAINN with
activation checkpointing (the kernels replace primitives, so both keep working). Prints one
JSON object and exits 1 when a relative error exceeds its tolerance or a check fails. Also
checks a sink-padded batch (zero-length sink edges) and that ``install`` leaves the stock
model untouched.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from infer_helpers import cluster, tiny_model  # noqa: E402

from hydragnn.infer import HydraCalculator  # noqa: E402
from hydragnn.infer.kernels import available, install  # noqa: E402
from hydragnn.models.nn import Primitive  # noqa: E402
from hydragnn.models.padding import pad_with_sink  # noqa: E402

TOL = {"fp32": 1e-5, "fp64": 1e-10}
DTYPE = {"fp32": torch.float32, "fp64": torch.float64}


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach(), b.detach()
    return float((a - b).abs().max()) / max(float(b.abs().max()), 1e-30)


def backends(model) -> set[str]:
    return {m.backend for m in model.modules() if isinstance(m, Primitive) and type(m).__name__ != "GaussianRBF"}


def compare(encoder: str, precision: str, sizes=(9, 14), **arch) -> dict[str, float]:
    model = tiny_model(seed=3, mpnn_type=encoder, precision=precision, num_conv_layers=2, hidden_dim=8, **arch)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    patched, why = install(model)
    assert why is None, why
    switched = {type(m).__name__ for m in patched.modules() if isinstance(m, Primitive) and m.backend == "triton"}
    assert switched == ({"RadialFilter", "ContinuousFilterConv"} if encoder == "SchNet" else {"EquivariantMessage"})
    assert backends(model) == {"torch"}, "install modified the stock model"
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    calc = HydraCalculator(model)
    coords = [torch.as_tensor(cluster(n, seed=n)[0]) for n in sizes]
    numbers = [torch.as_tensor(cluster(n, seed=n)[1]) for n in sizes]
    coord = torch.cat(coords).to(DTYPE[precision])
    mol_idx = torch.cat([torch.full((n,), i) for i, n in enumerate(sizes)])
    call = calc._check(coord, torch.cat(numbers), None, None, None, mol_idx)
    batch = calc.build_batch(call)
    out = {}
    ref = model(batch, compute_forces=True)
    got = patched(batch, compute_forces=True)
    out["energy"] = rel_err(got["energy"], ref["energy"])
    out["forces"] = rel_err(got["forces"], ref["forces"])
    padded = pad_with_sink(batch, extra_nodes=2, extra_edges=5)
    got_pad = patched(padded, compute_forces=True)
    n = batch.pos.shape[0]
    out["padded_energy"] = rel_err(got_pad["energy"][: len(sizes)], ref["energy"])
    out["padded_forces"] = rel_err(got_pad["forces"][:n], ref["forces"])
    out["padded_finite"] = 0.0 if bool(torch.isfinite(got_pad["forces"]).all()) else float("inf")
    return out


def through_calculator(encoder: str) -> dict[str, float]:
    """inference_kernels=True in the calculator: the patched copy answers, and follows model changes."""
    model = tiny_model(seed=5, mpnn_type=encoder, precision="fp64", num_conv_layers=2, hidden_dim=8)
    coord, numbers = (torch.as_tensor(a) for a in cluster(11, seed=2))
    coord = coord.to(torch.float64)
    fast = HydraCalculator(model, inference_kernels=True)
    assert fast.runner.patched is not None, fast.runner.problems
    out = {}
    got, ref = fast(coord, numbers, forces=True), HydraCalculator(model)(coord, numbers, forces=True)
    out["calc_energy"] = rel_err(got["energy"], ref["energy"])
    out["calc_forces"] = rel_err(got["forces"], ref["forces"])
    with torch.no_grad():  # change the model: the kernel copy must follow
        for p in model.parameters():
            p.mul_(1.1)
    got, ref = fast(coord, numbers, forces=True), HydraCalculator(model)(coord, numbers, forces=True)
    out["calc_energy_after_update"] = rel_err(got["energy"], ref["energy"])
    out["calc_forces_after_update"] = rel_err(got["forces"], ref["forces"])
    return out


def main() -> int:
    torch.set_num_threads(1)
    ok, why = available("cpu")
    report: dict[str, object] = {"available": [ok, why]}
    failed = not ok
    for encoder in ("SchNet", "PAINN"):
        for precision in ("fp32", "fp64"):
            res = compare(encoder, precision)
            report[f"{encoder}/{precision}"] = res
            failed |= any(not (val <= TOL[precision]) for val in res.values())
    variants = {
        "SchNet+GPS/fp64": ("SchNet", {"global_attn_engine": "GPS"}),
        "PAINN+checkpointing/fp64": ("PAINN", {"conv_checkpointing": True}),
    }
    for key, (encoder, arch) in variants.items():
        res = compare(encoder, "fp64", **arch)
        report[key] = res
        failed |= any(not (val <= TOL["fp64"]) for val in res.values())
        res = through_calculator(encoder)
        report[f"{encoder}/calculator"] = res
        failed |= any(not (val <= TOL["fp64"]) for val in res.values())
    report["ok"] = not failed
    print(json.dumps(report))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

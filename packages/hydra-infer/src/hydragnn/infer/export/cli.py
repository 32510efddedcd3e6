"""``hydragnn-export model.hydra out.pt2 [--format aoti|torchscript|metatomic] [--dtype ...] [--device ...]``.

Prints each step, then the file's size, the time of each step and the check's largest
differences from the calculator; exit status 2 with ``hydragnn-export: error: ...`` when the
model cannot be exported or the check fails (nothing is written then).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from hydragnn.data.pyg_compat import torchscript_quietly
from hydragnn.models.execution import get_profile


def _version() -> str:
    from hydragnn.infer import __version__

    return f"hydragnn-export (hydra-infer) {__version__}"


@torchscript_quietly()  # torch>=2.14's deprecation of what PyG and the export use on purpose
def main(argv: list[str] | None = None) -> int:
    get_profile().prefer_passive_waiting()  # the default profile's, before anything loads torch
    parser = argparse.ArgumentParser(
        prog="hydragnn-export",
        description=(
            "Export a HydraGNN interatomic potential to a file that runs without hydragnn: an AOTInductor "
            "package (.pt2), TorchScript (.pt) or a metatomic model for ASE, i-PI, LAMMPS and torch-sim. "
            "The written file is checked against HydraCalculator before it replaces OUTPUT."
        ),
    )
    parser.add_argument("artifact", type=Path, help="the model artifact (model.hydra)")
    parser.add_argument("output", type=Path, help="the file to write (.pt2: AOTInductor, .pt: TorchScript)")
    parser.add_argument("--format", choices=("aoti", "torchscript", "metatomic"), default=None)
    parser.add_argument("--dtype", choices=("float32", "float64"), default=None, help="default: the model's")
    parser.add_argument("--device", default="cpu", help="where the exported file runs (cpu, cuda)")
    parser.add_argument("--head", default=None, help="the energy head of a model trained on several sources")
    parser.add_argument("--charge", type=float, default=None, help="fixed total charge, for a model with that input")
    parser.add_argument("--spin", type=float, default=None, help="fixed spin, for a model with that input")
    parser.add_argument(
        "--uncertainty",
        action="store_true",
        help="a committee's spread in the file too (energy_uncertainty, forces_uncertainty; metatomic: energy_uncertainty)",
    )
    parser.add_argument("--version", action="version", version=_version())
    args = parser.parse_args(argv)

    from hydragnn.models import ArtifactError

    from .api import export_model
    from .graph import ExportError

    if not args.artifact.is_file():
        print(f"hydragnn-export: error: {args.artifact}: no such file", file=sys.stderr)
        return 2
    try:
        report = export_model(
            args.artifact,
            args.output,
            format=args.format,
            dtype=args.dtype,
            device=args.device,
            head=args.head,
            charge=args.charge,
            spin=args.spin,
            uncertainty=args.uncertainty,
            progress=lambda line: print(line, flush=True),
        )
    except (ExportError, ArtifactError, ImportError) as exc:
        print(f"hydragnn-export: error: {exc}", file=sys.stderr)
        return 2
    print(report.summary())
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

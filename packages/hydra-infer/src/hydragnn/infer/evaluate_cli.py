"""``hydragnn-evaluate``: the command line of :mod:`.evaluate`, and the predictions it writes (``--output``).

The structures come back with the predictions added under :data:`.evaluate.PREFIX` names, in the
format of the output's name, written atomically; the output format is checked before any work.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ase import Atoms

from hydragnn.data.pyg_compat import torchscript_quietly
from hydragnn.models.execution import get_profile

from .errors import InferenceError
from .evaluate import PREFIX, evaluate

__all__ = ["main", "output_format", "write_predictions"]


def output_format(path: str | os.PathLike) -> str:
    """The ASE format ``path`` is written in, from its name (``.extxyz``, ``.xyz``, ``.traj``, ...).

    Raises:
        InferenceError: a name ASE cannot guess a format from, a format it cannot write to an
            open file (an ASE database), or a folder that does not exist.
    """
    from ase.io.formats import filetype, ioformats

    path = Path(path)
    try:
        fmt = filetype(str(path), read=False)
    except (KeyError, ValueError) as exc:  # ASE's UnknownFileTypeError is a ValueError
        raise InferenceError(f"{path}: ASE cannot tell a format from this name ({exc}); use e.g. .extxyz") from None
    if fmt not in ioformats or not ioformats[fmt].can_write or not ioformats[fmt].acceptsfd:
        raise InferenceError(f"{path}: ASE cannot write the {fmt!r} format to a file atomically; use .extxyz or .traj")
    if not path.resolve().parent.is_dir():
        raise InferenceError(f"{path}: its folder {path.resolve().parent} does not exist")
    return fmt


def write_predictions(path: str | os.PathLike, structures: Sequence[Atoms]) -> Path:
    """Write ``structures`` with ASE in the format of ``path``'s name, atomically
    (:func:`hydragnn.data.io.atomic.atomic_write`: a temporary file in the same folder, then
    ``os.replace``): the file is the old one or the whole new one.

    Raises:
        InferenceError: see :func:`output_format`; a one-structure format given several; a
            write that fails (the message names the file).
    """
    import ase.io
    from ase.io.formats import ioformats

    from hydragnn.data.io.atomic import atomic_write

    path = Path(path)
    fmt = output_format(path)
    if ioformats[fmt].single and len(structures) > 1:
        raise InferenceError(f"{path}: the {fmt!r} format holds one structure, found {len(structures)}; use .extxyz")

    def write(fh: Any) -> None:
        if ioformats[fmt].isbinary:
            ase.io.write(fh, list(structures), format=fmt)
            return
        text = io.TextIOWrapper(fh, encoding="utf-8", newline="")
        ase.io.write(text, list(structures), format=fmt)
        text.flush()
        text.detach()  # the binary file stays open for atomic_write's fsync

    try:
        return atomic_write(path, write)
    except Exception as exc:  # ASE's writers raise anything from OSError to ValueError
        raise InferenceError(f"{path}: cannot write the predictions ({type(exc).__name__}: {exc})") from None


def _version() -> str:
    from .__about__ import __version__

    return f"hydra-infer {__version__}"


def _pair(text: str) -> tuple[str, str]:
    head, sep, label = text.partition("=")
    if not sep or not head or not label:
        raise argparse.ArgumentTypeError(f"expected HEAD=LABEL (e.g. atomic_energy=energies), found {text!r}")
    return head, label


@torchscript_quietly()  # torch>=2.14's deprecation of what PyG and the export use on purpose
def main(argv: list[str] | None = None) -> int:
    """``hydragnn-evaluate model.hydra data.extxyz [--energy-key K ...] [--json] [--output predictions.extxyz]``.

    Prints the errors table (or ``--json``) on stdout; progress goes to stderr on a terminal.
    Returns 0, or 2 with ``hydragnn-evaluate: error: ...`` on stderr for a user error.
    """
    get_profile().prefer_passive_waiting()  # the default profile's, before anything loads torch
    parser = argparse.ArgumentParser(
        prog="hydragnn-evaluate",
        description="Score a HydraGNN model on labelled structures (any file ASE reads) with the production "
        "calculator: MAE / RMSE per head, energy in eV/atom and eV, forces in eV/Å, stress in eV/Å³.",
    )
    parser.add_argument("artifact", type=Path, help="the model artifact (model.hydra)")
    parser.add_argument("structures", type=Path, help="labelled structures: any file ASE reads (extxyz, traj, db, ...)")
    for key in ("energy", "forces", "stress"):
        parser.add_argument(
            f"--{key}-key", default=None, help=f"file label of the {key} (default: the key the model was trained with)"
        )
    parser.add_argument(
        "--key", action="append", type=_pair, default=[], metavar="HEAD=LABEL", help="file label of another head"
    )
    parser.add_argument("--index", default=None, help="frames to score, as ase.io.read's index (':100', '::2')")
    parser.add_argument("--head", default=None, help="the energy head of a model trained on several sources")
    parser.add_argument("--device", default=None, help="cpu (default), cuda, cuda:1, ...")
    parser.add_argument("--batch-size", type=int, default=16, help="structures per calculator call (default 16)")
    parser.add_argument(
        "--output", type=Path, default=None, help=f"write the structures with the predictions ({PREFIX}*) with ASE"
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--version", action="version", version=_version())
    args = parser.parse_args(argv)

    from hydragnn.data import DataError
    from hydragnn.models import ModelError

    bar = None
    try:
        if not args.artifact.is_file():
            raise InferenceError(f"{args.artifact}: no such model artifact")
        if args.output is not None:
            output_format(args.output)  # before the work, not after it
        if sys.stderr.isatty():
            from tqdm import tqdm

            bar = tqdm(unit=" structures", desc="scoring", file=sys.stderr, leave=False)
        report = evaluate(
            args.artifact,
            args.structures,
            energy_key=args.energy_key,
            forces_key=args.forces_key,
            stress_key=args.stress_key,
            extra_keys=args.key,
            index=args.index,
            head=args.head,
            device=args.device,
            batch_size=args.batch_size,
            keep_predictions=args.output is not None,
            progress=(lambda done: bar.update(done - bar.n)) if bar is not None else None,
        )
        if args.output is not None:
            write_predictions(args.output, report.predictions or [])
    except (InferenceError, DataError, ModelError) as exc:
        print(f"hydragnn-evaluate: error: {exc}", file=sys.stderr)
        return 2
    finally:
        if bar is not None:
            bar.close()
    if args.json:
        out = {"model": str(args.artifact), "file": str(args.structures), **report.to_dict()}
        if args.output is not None:
            out["output"] = str(args.output)
        print(json.dumps(out, allow_nan=False))
    else:
        print(f"{args.structures}: errors per head")
        print("\n".join(report.table()))
        if args.output is not None:
            print(f"predictions written to {args.output}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

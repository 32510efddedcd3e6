"""Command lines: ``hydragnn-train config.json`` and ``hydragnn-predict model.hydra dataset``.

Where the execution profile tunes the process (the config's ``Training.execution`` for
``hydragnn-train``, the default profile for ``hydragnn-predict``), each sets OpenMP's passive wait
policy (unless the environment chose one) before anything loads torch, also under
``torchrun -m hydragnn.train.cli``; ``run_training`` applies the rest of the profile's process
tuning (:func:`hydragnn.models.execution.configure_threads`).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from hydragnn.data.pyg_compat import torchscript_quietly
from hydragnn.models.execution import Execution, get_profile

from .errors import TrainError


def _config_profile(path: Path) -> Execution:
    """The execution profile ``path``'s ``Training.execution`` names, read before torch loads; the
    default where the file names none or cannot be read (``load_config`` then reports why)."""
    try:
        name = json.loads(path.read_text())["NeuralNetwork"]["Training"].get("execution")
        return get_profile(name)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):  # (ExecutionError is a ValueError)
        return get_profile()


def _version() -> str:
    from .__about__ import __version__

    return f"hydra-train {__version__}"


@torchscript_quietly()  # torch>=2.14's deprecation of what PyG and the export use on purpose
def train_main(argv: list[str] | None = None) -> int:
    """``hydragnn-train config.json [--run-dir DIR] [--resume | --overwrite] [--init-from model.hydra] [--verbosity N]``.

    Arguments are parsed and the whole config is validated (:func:`~hydragnn.train.config.load_config`)
    before torch is imported: ``--help``, ``--version`` and a config error answer at once.
    """
    parser = argparse.ArgumentParser(
        prog="hydragnn-train",
        description="Train a HydraGNN model from a JSON config (structures from any file ASE reads, or a "
        "prepared dataset). Writes model.hydra, config.json, metrics.json, train.log, plots and checkpoint.pt to the "
        "run folder.",
    )
    parser.add_argument("config", type=Path, help="the JSON config file")
    parser.add_argument("--run-dir", type=Path, default=None, help="run folder (default runs/<Dataset.name>)")
    parser.add_argument(
        "--resume",
        action="store_true",
        help="continue the run in the folder from its checkpoint.pt (appending to its train.log); "
        "Training.max_time_s is the budget of the whole run, earlier segments included: a run that used it up "
        "trains no more until you raise max_time_s",
    )
    parser.add_argument(
        "--overwrite", action="store_true", help="replace the run files of a previous run in the folder"
    )
    parser.add_argument(
        "--init-from", type=Path, default=None, help="fine-tune a trained model artifact (overrides Training.init_from)"
    )
    parser.add_argument(
        "--verbosity",
        type=int,
        default=None,
        choices=range(5),
        help="override Verbosity.level (also what train.log records)",
    )
    parser.add_argument("--version", action="version", version=_version())
    args = parser.parse_args(argv)
    _config_profile(args.config).prefer_passive_waiting()  # before anything loads torch
    from hydragnn.data import DataError
    from hydragnn.models import ModelError

    from .config import load_config

    try:
        config = load_config(args.config, init_from=args.init_from)  # no torch unless Architecture comes from init_from
    except (TrainError, DataError, ModelError) as exc:
        print(f"hydragnn-train: error: {exc}", file=sys.stderr)
        return 2
    missing = config.dataset.missing_files()
    if missing:  # before torch loads: seconds sooner than the data loading would say it
        print(f"hydragnn-train: error: no such file: {'; '.join(missing)}", file=sys.stderr)
        return 2
    from .pipeline import run_training

    try:
        metrics = run_training(
            config,
            args.run_dir,
            resume=args.resume,
            verbosity=args.verbosity,
            overwrite=args.overwrite,
        )
    except (TrainError, DataError, ModelError) as exc:
        print(f"hydragnn-train: error: {exc}", file=sys.stderr)
        return 2
    paths = metrics.get("paths", {})
    if paths.get("artifact"):
        print(f"run folder: {Path(paths['artifact']).parent}")
    return 0


@torchscript_quietly()  # torch>=2.14's deprecation of what PyG and the export use on purpose
def predict_main(argv: list[str] | None = None) -> int:
    """``hydragnn-predict model.hydra dataset [--energy-key K ...] [--batch-size N] [--output predictions.pt] [--json]``."""
    get_profile().prefer_passive_waiting()  # the default profile's, before anything loads torch
    parser = argparse.ArgumentParser(
        prog="hydragnn-predict",
        description="Evaluate a saved HydraGNN model on a dataset: its errors per head (MAE, RMSE) in physical units.",
    )
    parser.add_argument("artifact", type=Path, help="the model artifact (model.hydra)")
    parser.add_argument(
        "dataset", type=Path, help="a dataset container (pickle file, .pt or .bp directory) or any file ASE reads"
    )
    for key in ("energy", "forces", "stress"):
        parser.add_argument(
            f"--{key}-key", default=None, help=f"file label of the {key} (default: the key the model was trained with)"
        )
    parser.add_argument("--index", default=None, help="frames of the file to evaluate, as ase.io.read's index")
    parser.add_argument("--head", default=None, help="the energy head of a model trained on several sources")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument(
        "--output", type=Path, default=None, help="write targets and predictions (torch .pt of tensors)"
    )
    parser.add_argument(
        "--json", action="store_true", help="print the errors as JSON (with the model's loss on the data, unitless)"
    )
    parser.add_argument("--version", action="version", version=_version())
    args = parser.parse_args(argv)
    import torch

    from hydragnn.data import DataError
    from hydragnn.data.io.atomic import atomic_write, destination_problem
    from hydragnn.models import ModelError
    from hydragnn.models.metrics import format_errors

    from .predict import predict

    if args.output is not None and (problem := destination_problem(args.output)) is not None:
        print(f"hydragnn-predict: error: --output {args.output}: {problem}", file=sys.stderr)
        return 2
    try:
        labels = {f"{k}_key": getattr(args, f"{k}_key") for k in ("energy", "forces", "stress")}
        labels = {k: v for k, v in labels.items() if v is not None}
        if args.index is not None:
            labels["index"] = args.index
        result, trues, preds = predict(
            args.artifact, args.dataset, batch_size=args.batch_size, labels=labels, head=args.head
        )
    except (TrainError, DataError, ModelError) as exc:
        print(f"hydragnn-predict: error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        from hydragnn.models.metrics import jsonable

        print(json.dumps(jsonable(result), allow_nan=False))
    else:
        # errors in physical units only: the loss is a weighted objective of the training config
        # (stage weights, normalisation), not comparable between runs; --json still carries it
        print(f"{args.dataset}: errors per head")
        print("\n".join(format_errors(result["mae"])))
    if args.output is not None:
        try:
            atomic_write(args.output, lambda fh: torch.save({"targets": trues, "predictions": preds}, fh))
        except OSError as exc:  # a full disk, a file-size limit: the errors above stand, the file is not there
            print(
                f"hydragnn-predict: error: --output {args.output}: cannot write it: {exc.strerror or exc}",
                file=sys.stderr,
            )
            return 2
        print(f"predictions written to {args.output}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(train_main())

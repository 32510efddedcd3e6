"""Command lines: ``hydragnn-train config.json`` and ``hydragnn-predict model.hydra dataset``."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .errors import TrainError


def train_main(argv: list[str] | None = None) -> int:
    """``hydragnn-train config.json [--run-dir DIR] [--resume] [--verbosity N]``."""
    parser = argparse.ArgumentParser(prog="hydragnn-train", description="Train a HydraGNN model from a JSON config.")
    parser.add_argument("config", type=Path, help="the JSON config file")
    parser.add_argument("--run-dir", type=Path, default=None, help="run folder (default runs/<Dataset.name>)")
    parser.add_argument("--resume", action="store_true", help="continue from <run-dir>/checkpoint.pt")
    parser.add_argument("--verbosity", type=int, default=None, choices=range(5), help="override Verbosity.level")
    args = parser.parse_args(argv)
    from hydragnn.data import DataError
    from hydragnn.models import ModelError

    from .pipeline import run_training

    try:
        metrics = run_training(args.config, args.run_dir, resume=args.resume, verbosity=args.verbosity)
    except (TrainError, DataError, ModelError) as exc:
        print(f"hydragnn-train: error: {exc}", file=sys.stderr)
        return 2
    paths = metrics.get("paths", {})
    if paths.get("artifact"):
        print(f"run folder: {Path(paths['artifact']).parent}")
    return 0


def predict_main(argv: list[str] | None = None) -> int:
    """``hydragnn-predict model.hydra dataset [--batch-size N] [--output predictions.pt] [--json]``."""
    parser = argparse.ArgumentParser(prog="hydragnn-predict", description="Evaluate a saved HydraGNN model on a dataset.")
    parser.add_argument("artifact", type=Path, help="the model artifact (model.hydra)")
    parser.add_argument("dataset", type=Path, help="a dataset container (pickle file, .pt or .bp directory)")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--output", type=Path, default=None, help="write targets and predictions (torch .pt of tensors)")
    parser.add_argument("--json", action="store_true", help="print the errors as JSON")
    args = parser.parse_args(argv)
    import torch

    from hydragnn.data import DataError
    from hydragnn.models import ModelError

    from .pipeline import format_errors, predict

    try:
        result, trues, preds = predict(args.artifact, args.dataset, batch_size=args.batch_size)
    except (TrainError, DataError, ModelError) as exc:
        print(f"hydragnn-predict: error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(result))
    else:
        print(f"{args.dataset}: loss {result['loss']:.6g}")
        print("\n".join(format_errors(result["mae"])))
    if args.output is not None:
        torch.save({"targets": trues, "predictions": preds}, args.output)
        print(f"predictions written to {args.output}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(train_main())

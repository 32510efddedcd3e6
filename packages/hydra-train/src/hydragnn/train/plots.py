"""Parity plots (predicted vs true), one PNG per output head (matplotlib, Agg backend)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import torch

from hydragnn.models.metrics import UNITS


def parity_plots(
    targets: Mapping[str, torch.Tensor],
    predictions: Mapping[str, torch.Tensor],
    out_dir: str | Path,
    *,
    natoms: torch.Tensor | None = None,
    mae: Mapping[str, Mapping] | None = None,
) -> list[Path]:
    """Write ``<out_dir>/parity_<head>.png`` for every head; vector heads plot all components.

    ``energy`` (a graph total) is plotted per atom when ``natoms`` ``[B]`` is given.

    Returns:
        The files written.
    """
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths: list[Path] = []
    for name, true in targets.items():
        pred = predictions[name].double()
        true = true.double()
        unit, per_atom = UNITS.get(name, ("", False))
        if per_atom and natoms is not None and natoms.numel() == true.shape[0]:
            true = true / natoms.double().reshape(-1, 1)
            pred = pred / natoms.double().reshape(-1, 1)
        t, p = true.reshape(-1).numpy(), pred.reshape(-1).numpy()
        fig, ax = plt.subplots(figsize=(4.5, 4.5), dpi=100)
        ax.scatter(t, p, s=4, alpha=0.5)
        if t.size:
            lo, hi = float(min(t.min(), p.min())), float(max(t.max(), p.max()))
            ax.plot([lo, hi], [lo, hi], "k--", lw=1)
        label = f" ({unit})" if unit else ""
        ax.set_xlabel(f"true {name}{label}")
        ax.set_ylabel(f"predicted {name}{label}")
        title = name
        if mae and name in mae:
            title += f": MAE {mae[name]['mae']:.4g} {mae[name].get('unit', '')}"
        ax.set_title(title, fontsize=10)
        fig.tight_layout()
        path = out_dir / f"parity_{name}.png"
        fig.savefig(path)
        plt.close(fig)
        paths.append(path)
    return paths

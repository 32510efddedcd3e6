"""``hydragnn.preprocess``: the seed's module path for building loaders.

The seed's Quick Start calls ``hydragnn.preprocess.create_dataloaders(trainset, valset, testset,
batch_size=32)``; it is :func:`hydragnn.data.create_dataloaders` (returns ``(train_loader,
val_loader, test_loader)``, each rank's share under torch.distributed). Upstream's
``CostAwareBatchSampler`` lives here too, as :class:`hydragnn.data.CostAwareBatchSampler` (one
class, rank-aware, for single-process and distributed runs). Upstream's other preprocess helpers
built datasets from raw files and ``Variables_of_interest``; here datasets are prepared with
:func:`hydragnn.data.prepare` against the named ``Variables`` schema.

Names are imported on first use, so ``import hydragnn.preprocess`` loads no torch.
"""

from __future__ import annotations

from hydragnn.data.lazy import lazy_names

_LAZY = {
    "create_dataloaders": "hydragnn.data",
    "CostAwareBatchSampler": "hydragnn.data",
}

__all__ = sorted(_LAZY)

__getattr__, __dir__ = lazy_names(__name__, _LAZY, globals())

"""``hydragnn.utils.model``: the seed's module path for model checkpoints.

* ``save_model(model, optimizer, name, path="./logs/")`` writes ``<path>/<name>/<name>.pt``
  atomically: the model's state dict and, when ``optimizer`` is given, its state
  (:func:`hydragnn.train.save_model`).
* ``load_existing_model(model, name, path="./logs/", optimizer=None)`` loads that file into
  ``model`` (and ``optimizer``) with ``torch.load(weights_only=True)``; a file of another
  architecture is refused naming the mismatched keys (:func:`hydragnn.train.load_existing_model`).
* ``load_model`` is the name the seed's text gives the loading function; upstream HydraGNN has no
  function of that name, its loader is ``load_existing_model``, so here it is that same function.

For serving, a model artifact (``hydragnn.models.save_artifact``, one file with the manifest and
safetensors weights) is the stable format; these checkpoints continue training in the same code.
"""

from __future__ import annotations

from hydragnn.train import load_existing_model, save_model

load_model = load_existing_model

__all__ = ["load_existing_model", "load_model", "save_model"]

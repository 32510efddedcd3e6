"""``build_model``: the model of an ``Architecture`` section, one :class:`~.model.HydraModel` or a
:class:`~.committee.Committee` of them (the one module that knows both)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hydragnn.data import Schema

from .committee import Committee
from .config import ModelConfig
from .model import HydraModel

__all__ = ["build_model"]


def build_model(config: Mapping[str, Any] | ModelConfig, schema: Schema | Mapping[str, Any]) -> HydraModel | Committee:
    """Build the model of an ``Architecture`` section for a schema.

    Args:
        config: the JSON ``NeuralNetwork.Architecture`` dict (or a parsed :class:`ModelConfig`).
        schema: the :class:`~hydragnn.data.Schema` (or its ``Variables`` dict).

    Returns:
        A :class:`HydraModel` with parameters in the ``precision`` dtype, or a
        :class:`~hydragnn.models.committee.Committee` of such members for ``committee`` > 1.
        Initialisation uses torch's global RNG (members draw from it in turn): seed it for a
        reproducible model.

    Raises:
        ModelConfigError: on an invalid section or one that does not fit the schema.
    """
    if not isinstance(config, ModelConfig):
        config = ModelConfig.from_dict(config)
    if not isinstance(schema, Schema):
        schema = Schema.from_dict(schema)
    if config.committee > 1:
        return Committee(config, schema).to(config.dtype)
    return HydraModel(config, schema).to(config.dtype)

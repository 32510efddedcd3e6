"""``EngineHost``: what the CUDA-graph engines need from the runner that owns them.

The policy cache (:mod:`.engine`) and the static engines (:mod:`.base`, :mod:`.dense`,
:mod:`.sparse`, :mod:`.periodic`) read the host's models, :class:`~..model_info.ModelInfo`,
device, position dtype and dense / sparse threshold, and call back two methods:
:meth:`EngineHost.regular`, the reference a capture is admitted against (and the answer while a
layout is not replayed), and :meth:`EngineHost.warn`, the once-per-reason fallback warning. They
use nothing else, so :class:`~..runners.GraphRunner` is one host and a test can drive the
engines with any object of this shape.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch

from ..errors import HydraInferWarning
from ..inputs import CallInputs
from ..model_info import ModelInfo, ServedModel
from .backends import Outputs


@runtime_checkable
class EngineHost(Protocol):
    """The engines' view of their runner (read-only attributes and two callbacks)."""

    @property
    def model(self) -> ServedModel:
        """The served model: a change of its parameters or buffers drops every engine."""
        ...

    @property
    def eager_model(self) -> ServedModel:
        """What the engines capture: the kernel-patched copy, else :attr:`model` (never a compiled forward)."""
        ...

    @property
    def info(self) -> ModelInfo:
        """Cutoff, graph inputs and output names of :attr:`model`."""
        ...

    @property
    def device(self) -> torch.device:
        """Where the static buffers live."""
        ...

    @property
    def dtype(self) -> torch.dtype:
        """Floating dtype of the positions, cells and graph inputs loaded into the static buffers."""
        ...

    @property
    def nb_threshold(self) -> int:
        """Atoms per structure from which a padded batch is served by the sparse engine, not the dense one."""
        ...

    def regular(self, call: CallInputs, *, forces: bool) -> Outputs:
        """The regular evaluation of ``call``: raw model outputs in the call's flat layout."""
        ...

    def warn(self, reason: str, message: str, category: type[Warning] = HydraInferWarning) -> None:
        """Warn that CUDA-graph replay fell back, at most once per host and ``reason``."""
        ...

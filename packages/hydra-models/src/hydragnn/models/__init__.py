"""hydra-models: skeleton of this HydraGNN layer; its issue fills it in."""

from .__about__ import __version__

__all__ = ["__version__"]

"""Version of the hydra-data distribution (bumped by tools/release.py)."""

__version__ = "0.2.0"

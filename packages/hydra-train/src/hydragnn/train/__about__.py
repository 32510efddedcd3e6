"""Version of the hydra-train distribution (bumped by tools/release.py)."""

__version__ = "0.2.0"

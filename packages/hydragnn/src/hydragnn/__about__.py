"""Version of the hydragnn distribution (bumped by tools/release.py)."""

__version__ = "0.1.0"

"""The conformance suite (tests/conformance.py) applied to every registered encoder."""

import pytest

from hydragnn.models.testing import REGISTERED_ENCODERS, EncoderConformance


@pytest.mark.parametrize("encoder_name", REGISTERED_ENCODERS)
class TestConformance(EncoderConformance):
    """Invariance, equivariance, forces, batching, padding, capture safety, artifacts, dtypes."""

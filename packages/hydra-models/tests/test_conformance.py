"""The conformance suite (tests/conformance.py) applied to every registered encoder."""

import pytest
from conformance import REGISTERED_ENCODERS, ConformanceTests


@pytest.mark.parametrize("encoder_name", REGISTERED_ENCODERS)
class TestConformance(ConformanceTests):
    """Invariance, equivariance, forces, batching, padding, capture safety, artifacts, dtypes."""

"""The conformance suite (tests/conformance.py) applied to every registered encoder."""

import pytest

from hydragnn.models.testing import REGISTERED_ENCODERS, EncoderConformance


@pytest.mark.parametrize("encoder_name", REGISTERED_ENCODERS)
class TestConformance(EncoderConformance):
    """Invariance, equivariance, forces, batching, padding, capture safety, artifacts, dtypes."""


def test_subject_merges_arch_skips_and_tolerances():
    """The mixin's fixtures reach the checks: extra Architecture keys, by-design skips, tolerances."""
    from hydragnn.models.testing import Tolerances, subject

    tol = Tolerances(invariance=(1e-3, 1e-4))
    s = subject("SchNet", arch={"num_filters": 8}, skips={"finite_differences": "by design"}, tol=tol)
    assert s.arch["mpnn_type"] == "SchNet" and s.arch["num_filters"] == 8 and s.tol is tol
    assert s.build().encoder.interactions[0].lin1.out_features == 8
    with pytest.raises(pytest.skip.Exception, match="SchNet: by design"):
        s.skip_by_design("finite_differences")
    s.skip_by_design("rotation_translation")  # not listed: runs
    dimenet = subject("DimeNet")  # conftest's set_defaults applies to names
    assert dimenet.arch["triplet_capacity"] == 32

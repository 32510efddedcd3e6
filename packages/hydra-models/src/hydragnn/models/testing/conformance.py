"""The encoder conformance suite: checks every encoder must pass, and a pytest mixin to run them.

An encoder written anywhere proves itself with the same checks as the built-in ones (NequIP
style): register it with :func:`hydragnn.models.register_encoder`, then::

    import pytest
    from hydragnn.models.testing import EncoderConformance

    @pytest.mark.parametrize("encoder_name", ["MyEncoder"])
    class TestMyEncoder(EncoderConformance):
        @pytest.fixture
        def conformance_arch(self, encoder_name):     # extra Architecture keys (default: none)
            return {"my_width": 8}

        @pytest.fixture
        def conformance_skips(self, encoder_name):    # check -> reason it cannot hold by design
            return {}

Each check builds a tiny MLIP (hidden 16, 2 layers, cutoff 4 Å) around the encoder and compares
against physics that does not depend on it: permutation, rotation / translation invariance,
vector equivariance, forces and stress against finite differences, energy continuity at the
cutoff, batch == single, padded == unpadded, no host synchronisation, no subnormal arithmetic,
periodic supercells, artifact round trip, precisions, activation checkpointing, forces by
``torch.func.grad`` (a compiled training step's) equal to autograd's, and every shipped execution
profile equal to the reference (:func:`~.checks.check_execution_profile`). Tolerances are a
:class:`Tolerances` fixture (``conformance_tolerances``). The checks also accept a subject name
(an encoder or a :func:`register_variant` id) with defaults from :func:`set_defaults`.
"""

from __future__ import annotations

import pathlib
from typing import Any

import pytest

from hydragnn.models.execution import PROFILES

from . import checks
from .subjects import Subject, Tolerances, subject

SWITCHED_PROFILES = sorted(name for name in PROFILES if name != "reference")
"""The shipped profiles that switch something in, each checked against the reference."""


class EncoderConformance:
    """Pytest mixin: the conformance checks as tests of the ``encoder_name`` parameter or fixture.

    Override the fixtures to adapt the checks: ``conformance_arch`` (extra ``Architecture`` keys),
    ``conformance_skips`` (check -> reason, for ``rotation_translation`` or
    ``finite_differences`` that cannot hold by design; the test is skipped with the reason) and
    ``conformance_tolerances`` (a :class:`Tolerances`).
    """

    @pytest.fixture
    def conformance_arch(self, encoder_name: str) -> dict[str, Any]:
        return {}

    @pytest.fixture
    def conformance_skips(self, encoder_name: str) -> dict[str, str]:
        return {}

    @pytest.fixture
    def conformance_tolerances(self) -> Tolerances:
        return Tolerances()

    @pytest.fixture
    def conformance_subject(
        self,
        encoder_name: str,
        conformance_arch: dict[str, Any],
        conformance_skips: dict[str, str],
        conformance_tolerances: Tolerances,
    ) -> Subject:
        return subject(encoder_name, conformance_arch, conformance_skips, conformance_tolerances)

    def test_deterministic(self, conformance_subject: Subject) -> None:
        checks.check_deterministic(conformance_subject)

    def test_permutation_invariance(self, conformance_subject: Subject) -> None:
        checks.check_permutation(conformance_subject)

    def test_rotation_translation(self, conformance_subject: Subject) -> None:
        conformance_subject.skip_by_design("rotation_translation")
        checks.check_rotation_translation(conformance_subject)

    def test_vector_equivariance(self, conformance_subject: Subject) -> None:
        if not conformance_subject.equivariant:
            pytest.skip(f"{conformance_subject.name} is not equivariant (no vector features)")
        checks.check_vector_equivariance(conformance_subject)

    def test_forces_stress_finite_differences(self, conformance_subject: Subject) -> None:
        conformance_subject.skip_by_design("finite_differences")
        checks.check_finite_differences(conformance_subject)

    def test_cutoff_continuity(self, conformance_subject: Subject) -> None:
        checks.check_cutoff_continuity(conformance_subject)

    def test_batch_equals_single(self, conformance_subject: Subject) -> None:
        checks.check_batch_equals_single(conformance_subject)

    def test_padded_equals_unpadded(self, conformance_subject: Subject) -> None:
        checks.check_padding(conformance_subject)

    def test_capture_safe(self, conformance_subject: Subject) -> None:
        checks.check_capture_safe(conformance_subject)

    def test_no_subnormals(self, conformance_subject: Subject) -> None:
        checks.check_no_subnormals(conformance_subject)

    def test_periodic_supercell(self, conformance_subject: Subject) -> None:
        checks.check_periodic_supercell(conformance_subject)

    def test_artifact_round_trip(self, conformance_subject: Subject, tmp_path: pathlib.Path) -> None:
        checks.check_artifact_round_trip(conformance_subject, tmp_path)

    def test_precisions(self, conformance_subject: Subject) -> None:
        checks.check_precisions(conformance_subject)

    def test_checkpointing(self, conformance_subject: Subject) -> None:
        checks.check_checkpointing(conformance_subject)

    def test_functional_derivatives(self, conformance_subject: Subject) -> None:
        checks.check_functional_derivatives(conformance_subject)

    @pytest.mark.parametrize("profile", SWITCHED_PROFILES)
    def test_execution_profile(self, conformance_subject: Subject, profile: str) -> None:
        checks.check_execution_profile(conformance_subject, profile)

"""Testing support shipped with hydra-models (needs pytest: ``hydra-models[test]``).

:class:`EncoderConformance` is the conformance suite every built-in encoder passes, as a pytest
mixin any encoder can reuse; the ``check_*`` functions, the test structures of :mod:`.graphs` and
:class:`HostSyncDetector` / :class:`SubnormalDetector` are usable on their own.
"""

from .checks import (
    check_artifact_round_trip,
    check_batch_equals_single,
    check_capture_safe,
    check_checkpointing,
    check_cutoff_continuity,
    check_deterministic,
    check_execution_profile,
    check_finite_differences,
    check_no_subnormals,
    check_padding,
    check_periodic_supercell,
    check_permutation,
    check_precisions,
    check_rotation_translation,
    check_vector_equivariance,
    finite_difference_forces_stress,
)
from .conformance import EncoderConformance
from .host_sync import HostSyncDetector
from .locality_check import check_locality, cut_out, decomposed_evaluation
from .subjects import (
    CUTOFF,
    REGISTERED_ENCODERS,
    SCALAR_OUTPUTS,
    VARIANTS,
    Subject,
    Tolerances,
    build,
    is_equivariant,
    missing_extra,
    register_variant,
    set_defaults,
    small_arch,
    subject,
)
from .subnormal import SubnormalDetector

__all__ = [
    "CUTOFF",
    "REGISTERED_ENCODERS",
    "missing_extra",
    "SCALAR_OUTPUTS",
    "VARIANTS",
    "EncoderConformance",
    "HostSyncDetector",
    "SubnormalDetector",
    "Subject",
    "Tolerances",
    "build",
    "check_artifact_round_trip",
    "check_locality",
    "cut_out",
    "decomposed_evaluation",
    "check_batch_equals_single",
    "check_capture_safe",
    "check_checkpointing",
    "check_cutoff_continuity",
    "check_deterministic",
    "check_execution_profile",
    "check_finite_differences",
    "check_no_subnormals",
    "check_padding",
    "check_periodic_supercell",
    "check_permutation",
    "check_precisions",
    "check_rotation_translation",
    "check_vector_equivariance",
    "finite_difference_forces_stress",
    "is_equivariant",
    "register_variant",
    "set_defaults",
    "small_arch",
    "subject",
]

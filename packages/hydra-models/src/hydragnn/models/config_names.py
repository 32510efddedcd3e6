"""Names of the ``Architecture`` choices whose implementations are torch tables, torch-free.

``ModelConfig`` validates ``activation``, ``graph_pooling`` and ``precision`` against these
names without importing torch. Invariant: :data:`ACTIVATION_NAMES` are the keys of
:data:`hydragnn.models.nn.activations.ACTIVATIONS` and :data:`POOLING_NAMES` those of
:data:`hydragnn.models.nn.scatter.POOLINGS` (both modules assert it on import).
"""

from __future__ import annotations

ACTIVATION_NAMES: tuple[str, ...] = (
    "relu",
    "silu",
    "swish",
    "gelu",
    "tanh",
    "sigmoid",
    "elu",
    "leaky_relu",
    "softplus",
    "shifted_softplus",
)
"""``Architecture.activation`` choices."""

POOLING_NAMES: tuple[str, ...] = ("add", "sum", "mean", "max")
"""``Architecture.graph_pooling`` choices."""

PRECISIONS: dict[str, str] = {
    "fp32": "float32",
    "float32": "float32",
    "fp64": "float64",
    "float64": "float64",
    "bf16": "bfloat16",
    "bfloat16": "bfloat16",
}
"""``precision`` names and the names of their torch dtypes (``getattr(torch, PRECISIONS[p])``)."""

"""The execution layer: every speed device of HydraGNN, chosen by one named profile.

:mod:`.profiles` defines :class:`Execution` (which primitive implementations, optimizer step,
thread and process policy, compile options and derivative engine a run uses) and the shipped
profiles ``"reference"`` (stock PyTorch) and ``"cpu"`` (the default); :mod:`.process` holds the
process tuning a profile may apply (:func:`configure_threads`), explicit and never on import.
The training loop, the command lines and the calculator take a profile by name; nothing else
switches a speed device on. Importing this package loads no torch.
"""

from .process import (
    choose_threads,
    compile_kwargs,
    compiled_kernel_threads,
    configure_threads,
    prefer_passive_waiting,
    set_intra_op_threads,
    wait_policy,
)
from .profiles import (
    DEFAULT_PROFILE,
    OPTIMIZER_STEPS,
    PROFILES,
    Execution,
    ExecutionError,
    get_profile,
    register_profile,
)

__all__ = [
    "DEFAULT_PROFILE",
    "OPTIMIZER_STEPS",
    "PROFILES",
    "Execution",
    "ExecutionError",
    "choose_threads",
    "compile_kwargs",
    "compiled_kernel_threads",
    "configure_threads",
    "get_profile",
    "prefer_passive_waiting",
    "register_profile",
    "set_intra_op_threads",
    "wait_policy",
]

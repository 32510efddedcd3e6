"""``check_model`` under its first address (it lives in :mod:`.torchsim`, next to the model it adapts;
the checks themselves are :mod:`.torchsim_checks`)."""

from .torchsim import check_model

__all__ = ["check_model"]

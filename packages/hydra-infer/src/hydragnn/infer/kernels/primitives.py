"""Triton implementations of hydra-models primitives (backend ``"triton"``).

Registered against primitives, never encoders: every encoder built from
:class:`~hydragnn.models.nn.RadialFilter`, :class:`~hydragnn.models.nn.ContinuousFilterConv` or
:class:`~hydragnn.models.nn.EquivariantMessage` gets the kernels, and everything around them
(embeddings, GPS mixers, update blocks, heads, forces by autograd) stays stock PyTorch.

Each implementation serves a call only when the fused kernel computes exactly what the stock
forward computes: a Gaussian basis and a shifted softplus for the filter, a cosine envelope,
a Bessel basis without appended edge inputs for the PaiNN message, float32 or float64
throughout. Any other call runs the primitive's own forward (the reference), so switching the
backend never changes what a model computes beyond round-off.
"""

from __future__ import annotations

from typing import cast

import torch

from hydragnn.models.nn import (
    BesselRBF,
    ContinuousFilterConv,
    CosineCutoff,
    EquivariantMessage,
    GaussianRBF,
    Implementation,
    Primitive,
    RadialEdges,
    RadialFilter,
    register_implementation,
)
from hydragnn.models.nn.activations import ShiftedSoftplus

from . import ops

BACKEND = "triton"
DTYPES = frozenset({torch.float32, torch.float64})


def _consts(module: Primitive, like: torch.Tensor, *values: float) -> torch.Tensor:
    """The ``consts`` tensor of an op, cached on the module per device / dtype / values.

    The first call (a regular call or the warm-up before a CUDA-graph capture) creates it, so a
    captured replay never copies from the host.
    """
    cache = module.__dict__.setdefault("_kernel_consts", {})
    key = (like.device, like.dtype, values)
    consts = cache.get(key)
    if consts is None:
        consts = cache[key] = ops.constants(*values, like=like)
    return consts


def _param_dtype_problem(module: Primitive) -> str | None:
    dtypes = {p.dtype for p in module.parameters()}
    if dtypes and not dtypes <= DTYPES:
        found = ", ".join(sorted(str(d).removeprefix("torch.") for d in dtypes))
        return f"{type(module).__name__} in {found}: the Triton kernels support float32 and float64"
    return None


def _served(edges: RadialEdges, *tensors: torch.Tensor) -> bool:
    return edges.dtype in DTYPES and all(t.dtype == edges.dtype for t in tensors)


# --------------------------------------------------------------------------- RadialFilter
def _filter_accepts(module: Primitive) -> str | None:
    """Registered for :class:`RadialFilter` only, so ``module`` is one (an ``nn.Sequential``)."""
    module = cast(RadialFilter, module)
    if not (len(module) == 3 and isinstance(module[1], ShiftedSoftplus)):
        return "a RadialFilter whose activation is not the shifted softplus"
    return _param_dtype_problem(module)


def _filter_run(module: RadialFilter, edges: RadialEdges) -> torch.Tensor:
    first = cast(torch.nn.Linear, module[0])  # RadialFilter: Linear(R, F) -> act -> Linear(F, F)
    if not (isinstance(edges.basis, GaussianRBF) and edges.attr is None and _served(edges, first.weight)):
        return module.forward(edges)
    r = edges.length.to(edges.dtype)
    consts = _consts(module, r, edges.basis.coeff)
    centers = cast(torch.Tensor, edges.basis.centers)  # a registered buffer
    t = ops.schnet_filter(r, centers.to(r.dtype), consts, first.weight, first.bias)
    return module[2](t)


# --------------------------------------------------------------------------- ContinuousFilterConv
def _conv_run(module: ContinuousFilterConv, x: torch.Tensor, w: torch.Tensor, edges: RadialEdges) -> torch.Tensor:
    if not (isinstance(edges.envelope, CosineCutoff) and _served(edges, x, w)):
        return module.forward(x, w, edges)
    r = edges.length.to(edges.dtype)
    consts = _consts(module, r, 0.0, edges.envelope.cutoff)
    return ops.cfconv(x, w, r, edges.src, edges.dst, consts, edges.num_nodes)


# --------------------------------------------------------------------------- EquivariantMessage
def _message_run(
    module: EquivariantMessage, phi: torch.Tensor, v: torch.Tensor, edges: RadialEdges
) -> tuple[torch.Tensor, torch.Tensor]:
    basis, envelope = edges.basis, edges.envelope
    if not (
        isinstance(basis, BesselRBF)
        and isinstance(envelope, CosineCutoff)
        and edges.attr is None
        and edges.unit is not None
        and _served(edges, phi, v, module.weight)
    ):
        return module.forward(phi, v, edges)
    r = edges.length.to(edges.dtype)
    consts = _consts(module, r, basis.prefactor, envelope.cutoff)
    return ops.painn_message(
        phi,
        v,
        r,
        edges.unit.to(r.dtype),
        basis.freqs.to(r.dtype),
        module.weight,
        module.bias,
        edges.src,
        edges.dst,
        consts,
        edges.num_nodes,
    )


IMPLEMENTATIONS = (
    register_implementation(Implementation(RadialFilter, BACKEND, _filter_run, _filter_accepts, DTYPES)),
    register_implementation(Implementation(ContinuousFilterConv, BACKEND, _conv_run, lambda m: None, DTYPES)),
    register_implementation(Implementation(EquivariantMessage, BACKEND, _message_run, _param_dtype_problem, DTYPES)),
)
"""The registered implementations (imported for their registration)."""

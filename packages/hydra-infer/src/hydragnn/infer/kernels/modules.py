"""Kernel-backed subclasses of the SchNet and PAINN encoders (same parameters, fused forward).

:func:`patch_encoder` builds the subclass from the stock encoder's ``dims`` / ``config``, casts
it to the stock encoder's dtype and device and loads its ``state_dict`` strictly, so the two
hold identical parameters and buffers. The stock modules are never modified.
"""

from __future__ import annotations

import torch
from torch import nn

from hydragnn.models.encoders import GraphInputs, NodeEmbedding
from hydragnn.models.encoders.equivariant_utils import edge_geometry
from hydragnn.models.encoders.painn import PAINN, PaiNNMessage
from hydragnn.models.encoders.schnet import SchNet

from . import ops


class KernelSchNet(SchNet):
    """:class:`SchNet` whose interactions run :func:`.ops.schnet_filter` and :func:`.ops.cfconv`.

    Per interaction: ``t = schnet_filter(r)`` (Gaussians, first filter layer, shifted softplus),
    ``w = filter[2](t)`` (torch matmul), ``agg = cfconv(lin1(h), w, r)`` (cosine envelope, gather,
    scatter-add), then ``lin(ssp(lin2(agg)))`` as in the stock block. Activation checkpointing
    is ignored (inference).
    """

    def _init_kernels(self) -> None:
        ref = self.interactions[0].lin1.weight if len(self.interactions) else self.rbf.centers
        self.register_buffer(
            "kernel_consts", ops.constants(self.rbf.coeff, self.envelope.cutoff, like=ref), persistent=False
        )

    def forward(self, inputs: GraphInputs) -> NodeEmbedding:
        if isinstance(self.embed, nn.Embedding):
            h = self.embed(inputs.x[:, 0].long())
        else:
            h = self.embed(inputs.x)
        src, dst = inputs.edge_index[0], inputs.edge_index[1]
        r = inputs.edge_len.to(h.dtype)
        centers = self.rbf.centers.to(h.dtype)
        for block in self.interactions:
            first, second = block.filter[0], block.filter[2]
            t = ops.schnet_filter(r, centers, self.kernel_consts, first.weight, first.bias)
            w = second(t)
            agg = ops.cfconv(block.lin1(h), w, r, src, dst, self.kernel_consts, h.shape[0])
            h = h + block.lin(block.act(block.lin2(agg)))
        return NodeEmbedding(scalar=h)


class KernelPAINN(PAINN):
    """:class:`PAINN` whose message blocks run :func:`.ops.painn_message` (one fused kernel a layer).

    Per layer: ``phi(s)`` (torch MLP), then the fused Bessel basis, filter layer, cosine cutoff,
    gating and both scatter-adds, then the stock residual and update block.
    """

    def _init_kernels(self) -> None:
        self.register_buffer(
            "kernel_consts",
            ops.constants(self.rbf.prefactor, self.cutoff.cutoff, like=self.rbf.freqs),
            persistent=False,
        )

    def forward(self, inputs: GraphInputs) -> NodeEmbedding:
        length, unit = edge_geometry(inputs, "PAINN")
        s = self.embedding(inputs.x)
        length = length.to(s.dtype)
        unit = unit.to(s.dtype)
        freqs = self.rbf.freqs.to(s.dtype)
        src, dst = inputs.edge_index[0], inputs.edge_index[1]
        v = s.new_zeros((s.shape[0], 3, s.shape[1]))
        for layer in self.layers:
            layer: PaiNNMessage
            ds, dv = ops.painn_message(
                layer.phi(s),
                v,
                length,
                unit,
                freqs,
                layer.filter.weight,
                layer.filter.bias,
                src,
                dst,
                self.kernel_consts,
                s.shape[0],
            )
            s, v = layer.update(s + ds, v + dv)
        return NodeEmbedding(scalar=s, vector=self.readout(v))


KERNEL_ENCODERS: dict[type, type] = {SchNet: KernelSchNet, PAINN: KernelPAINN}
"""Stock encoder class -> kernel-backed subclass (exact class match: subclasses may differ)."""

SUPPORTED_DTYPES = (torch.float32, torch.float64)


def encoder_problem(encoder: nn.Module) -> str | None:
    """``None`` when :func:`patch_encoder` can swap ``encoder``, else why not."""
    name = type(encoder).__name__
    if type(encoder) not in KERNEL_ENCODERS:
        known = ", ".join(sorted(cls.__name__ for cls in KERNEL_ENCODERS))
        return f"encoder {name} has no inference kernels (kernels exist for {known})"
    dtypes = {p.dtype for p in encoder.parameters()}
    if not dtypes <= set(SUPPORTED_DTYPES):
        found = ", ".join(sorted(str(d).removeprefix("torch.") for d in dtypes))
        return f"encoder {name} in {found}: the inference kernels support float32 and float64"
    if len(dtypes) > 1:
        return f"encoder {name} mixes parameter dtypes {sorted(str(d) for d in dtypes)}"
    if getattr(encoder, "mixers", None) is not None:
        return f"encoder {name} with GPS global attention: the inference kernels fuse the local convolutions only"
    if isinstance(encoder, PAINN) and encoder.dims.edge_in > 0:
        return "encoder PAINN with edge inputs (edge_in > 0): the fused filter reads the radial basis only"
    return None


def patch_encoder(encoder: nn.Module) -> nn.Module:
    """A kernel-backed copy of ``encoder`` (check :func:`encoder_problem` first)."""
    param = next(iter(encoder.parameters()))
    patched = KERNEL_ENCODERS[type(encoder)](encoder.dims, encoder.config)
    patched.to(device=param.device, dtype=param.dtype)
    patched.load_state_dict(encoder.state_dict(), strict=True)
    patched._init_kernels()
    return patched.train(encoder.training)

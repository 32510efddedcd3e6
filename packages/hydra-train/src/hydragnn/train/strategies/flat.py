"""One fused optimizer kernel per parameter group: parameters and Adam state laid out flat.

torch's fused Adam / AdamW step on CPU costs about 6 us of kernel and as much Python per
parameter tensor: 0.2-1 ms per step for models of 30-80 small tensors, 5-10 % of a training step
on small graphs, where one flat tensor takes 20 us. While training, :class:`FlatStep` makes each
group's parameters views of one buffer (and their ``exp_avg`` / ``exp_avg_sq`` / ``step`` views
of three more), and steps one flat parameter per group: torch's fused kernel called directly when
nothing could observe ``optimizer.step()`` (no step hooks, no gradient scaler; its Python wrapper
costs more than the kernel), else the optimizer's own ``step()`` with the group's ``params`` list
and ``optimizer.state`` swapped for that call. Either way hooks, LR schedulers' step counting and
the hyperparameters in ``param_groups`` work as before. The
optimizer's ``state_dict()`` keeps torch's per-parameter layout (its tensors are the views), so
checkpoints are unchanged; :meth:`FlatStep.release` gives every tensor its own storage back.

Invariant: every step applies the update torch's fused step applies, element by element (its
vectorised and scalar lanes may round the last bit differently, by position in the buffer).
Where torch would do something the flat layout cannot (a parameter without a gradient in a step
is skipped by torch; a parameter whose storage was replaced), flat mode ends for good, before
that step, and torch steps per parameter from then on. Only optimizers whose parameter tensors
are small on average are laid out flat (:data:`MAX_MEAN_NUMEL`): for large tensors the
per-tensor cost is negligible and the gradient copy into the flat buffer would not pay.

The flat step calls torch names that are not public API (:data:`_TORCH_PRIVATE`, the fused
kernels of :data:`_KERNELS`, the optimizers' hook tables). :func:`private_step_ok` checks them
once per device type: the names exist and the direct kernel call on a flat buffer of two small
tensors matches torch's public single-tensor Adam / AdamW step to 1e-7. Where it does not (a torch
that renamed or changed them), nothing is laid out flat: ``optimizer.step()`` steps per parameter,
after one warning.
"""

from __future__ import annotations

import functools
import importlib
import warnings
from collections import defaultdict
from typing import Any

import torch
import torch.optim.optimizer as _optim_module
from torch import nn

_ADAM = (torch.optim.Adam, torch.optim.AdamW)
MAX_MEAN_NUMEL = 1 << 16
"""Largest mean number of elements per parameter tensor that is laid out flat."""
_STATE_KEYS = {"step", "exp_avg", "exp_avg_sq"}
_KERNELS = {False: "_fused_adam_", True: "_fused_adamw_"}
"""torch's fused kernel by decoupled weight decay (Adam: False, AdamW: True)."""
_TORCH_PRIVATE = ("_foreach_copy_",)
"""Other private ``torch`` functions the flat step calls."""
_HOOK_TABLES = ("_global_optimizer_pre_hooks", "_global_optimizer_post_hooks")
"""Private globals of ``torch.optim.optimizer`` read to see whether a step could be observed."""
_CHECK_TOLERANCE = 1e-7
"""Largest difference :func:`private_step_ok` accepts from torch's public step (parameters within 0.5)."""


def _qualifies(optimizer: torch.optim.Optimizer) -> bool:
    """Adam / AdamW on the fused step, no amsgrad / capturable / differentiable / tensor lr, each
    group's parameters dense floating-point tensors of one device and dtype, none in two groups,
    at most :data:`MAX_MEAN_NUMEL` elements per tensor on average."""
    if type(optimizer) not in _ADAM:
        return False
    seen: set[int] = set()
    sizes = [p.numel() for group in optimizer.param_groups for p in group["params"]]
    if not sizes or sum(sizes) > MAX_MEAN_NUMEL * len(sizes):
        return False
    for group in optimizer.param_groups:
        params = group["params"]
        if not params or not group.get("fused") or group.get("amsgrad") or group.get("capturable"):
            return False
        if group.get("differentiable") or isinstance(group.get("lr"), torch.Tensor):
            return False
        first = params[0]
        for p in params:
            if type(p.data) is not torch.Tensor or p.layout != torch.strided or not p.requires_grad:
                return False
            if p.dtype != first.dtype or p.device != first.device or not p.is_floating_point() or id(p) in seen:
                return False
            seen.add(id(p))
    return True


class _Group:
    """The flat buffers of one parameter group and the per-parameter views into them."""

    def __init__(self, params: list[torch.Tensor]) -> None:
        self.params = params
        sizes = [p.numel() for p in params]
        self.flat = nn.Parameter(torch.cat([p.detach().reshape(-1) for p in params]))
        self.exp_avg = torch.zeros_like(self.flat.data)
        self.exp_avg_sq = torch.zeros_like(self.flat.data)
        self.step = torch.zeros((), dtype=torch.float32, device=self.flat.device)
        self.steps = torch.zeros(len(params), dtype=torch.float32, device=self.flat.device)
        for p, view in zip(params, self.flat.data.split(sizes)):
            p.data = view.view_as(p)
        self.ptrs = [p.data_ptr() for p in params]
        self.sizes = sizes
        self.grad = torch.empty_like(self.flat.data)
        self.grad_views = [v.view_as(p) for p, v in zip(params, self.grad.split(sizes))]

    def gather_grads(self) -> bool:
        """Copy the parameters' gradients into :attr:`grad`; ``False`` (nothing copied) when one
        has none, is sparse, or its parameter no longer views the flat buffer."""
        grads = []
        for p, ptr in zip(self.params, self.ptrs):
            grad = p.grad
            if grad is None or grad.is_sparse or p.data_ptr() != ptr:
                return False
            grads.append(grad)
        torch._foreach_copy_(self.grad_views, grads)  # pyright: ignore[reportPrivateImportUsage]  # a torch kernel outside torch.__all__
        return True

    def state_views(self) -> dict[torch.Tensor, dict[str, torch.Tensor]]:
        m = self.exp_avg.split(self.sizes)
        v = self.exp_avg_sq.split(self.sizes)
        return {
            p: {"step": self.steps[k], "exp_avg": m[k].view_as(p), "exp_avg_sq": v[k].view_as(p)}
            for k, p in enumerate(self.params)
        }


class FlatStep:
    """Flat parameters and Adam state for ``optimizer`` (see the module docstring).

    Build it with :meth:`attach` (``None`` when the optimizer does not qualify); call
    :meth:`step` instead of ``optimizer.step()`` (it returns ``False`` when flat mode has ended:
    then call ``optimizer.step()``), and :meth:`release` at the end of training.
    """

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        self.optimizer = optimizer
        self.groups = [_Group(list(group["params"])) for group in optimizer.param_groups]
        self.active = True
        self._bind(optimizer.state)  # sets self._state

    @classmethod
    def attach(cls, optimizer: torch.optim.Optimizer) -> FlatStep | None:
        """Lay ``optimizer``'s parameters and state out flat, or ``None`` when it does not qualify
        (see :func:`_qualifies`) or its existing state is not a plain, in-step Adam state."""
        if not _qualifies(optimizer) or not _plain_state(optimizer):
            return None
        if not private_step_ok(optimizer.param_groups[0]["params"][0].device.type):
            return None
        return cls(optimizer)

    def _bind(self, state) -> None:
        """Copy ``state`` (per parameter; empty: zeros) into the flat buffers and point the
        optimizer's per-parameter state at views of them."""
        fresh: defaultdict[torch.Tensor, Any] = defaultdict(dict)
        for g in self.groups:
            views = g.state_views()
            old = [state.get(p) for p in g.params]
            if all(s for s in old):
                g.step.copy_(old[0]["step"])
                for p, s in zip(g.params, old):
                    views[p]["exp_avg"].copy_(s["exp_avg"])
                    views[p]["exp_avg_sq"].copy_(s["exp_avg_sq"])
            g.steps.fill_(g.step)
            fresh.update(views)
        self.optimizer.state = fresh
        self._state = fresh

    def step(self) -> bool:
        """One step of every group over its flat buffers. ``False`` (nothing done, flat mode over)
        when a parameter has no gradient or no longer views its buffer, or the optimizer's state
        was replaced by one that is not flat-able."""
        if not self.active:
            return False
        opt = self.optimizer
        if opt.state is not self._state:  # load_state_dict since the last step
            if not _plain_state(opt):
                self.release()
                return False
            self._bind(opt.state)
        for g in self.groups:
            if not g.gather_grads():
                self.release()
                return False
        if self._direct():
            for g in self.groups:
                g.steps.fill_(g.step)
            return True
        for g in self.groups:
            g.flat.grad = g.grad
        flat_state: dict[torch.Tensor, dict[str, Any]] = {
            g.flat: {"step": g.step, "exp_avg": g.exp_avg, "exp_avg_sq": g.exp_avg_sq} for g in self.groups
        }
        saved = [group["params"] for group in opt.param_groups]
        try:
            for group, g in zip(opt.param_groups, self.groups):
                group["params"] = [g.flat]
            opt.state = defaultdict(dict, flat_state)
            opt.step()
        finally:
            for group, params in zip(opt.param_groups, saved):
                group["params"] = params
            opt.state = self._state
            for g in self.groups:
                g.flat.grad = None
        for g in self.groups:
            g.steps.fill_(g.step)
        return True

    def _direct(self) -> bool:
        """Run torch's fused Adam / AdamW kernel on the flat buffers without ``optimizer.step()``.

        ``step()`` costs 60-80 us of Python per call on CPU (its profiling and hook wrapper, grad
        mode, grouping by device), more than the kernel on a few thousand parameters. Skipped
        (``False``, nothing done) whenever something could observe or change the call: a step
        hook (the optimizer's or a global one), a ``step`` replaced by anything but an LR
        scheduler's call counter (whose flag is set here as its wrapper would), a gradient scale,
        tensor betas, or a torch without the kernel. The kernel, its arguments and the step
        count's increment are those of torch's fused path."""
        opt = self.optimizer
        if opt._optimizer_step_pre_hooks or opt._optimizer_step_post_hooks:
            return False
        if _optim_module._global_optimizer_pre_hooks or _optim_module._global_optimizer_post_hooks:
            return False
        step = opt.__dict__.get("step")
        if step is not None and not getattr(step, "_wrapped_by_lr_sched", False):
            return False
        if getattr(opt, "grad_scale", None) is not None or getattr(opt, "found_inf", None) is not None:
            return False
        calls = []
        for group, g in zip(opt.param_groups, self.groups):
            decoupled = group.get("decoupled_weight_decay", isinstance(opt, torch.optim.AdamW))
            kernel = getattr(torch, _KERNELS[decoupled], None)
            beta1, beta2 = group["betas"]
            if kernel is None or isinstance(beta1, torch.Tensor) or isinstance(beta2, torch.Tensor):
                return False
            calls.append((kernel, g, group))
        if step is not None:
            opt._opt_called = True  # pyright: ignore[reportAttributeAccessIssue]  # torch's own flag; what the scheduler's wrapper records before calling step()
        with torch.no_grad():
            for kernel, g, group in calls:
                _kernel_step(kernel, g.flat, g.grad, g.exp_avg, g.exp_avg_sq, g.step, group)
        return True

    def zero_grad(self) -> None:
        """``optimizer.zero_grad(set_to_none=True)`` without its per-call bookkeeping."""
        for g in self.groups:
            for p in g.params:
                p.grad = None

    def release(self) -> None:
        """End flat mode: every parameter and state tensor gets its own storage (same values)."""
        if not self.active:
            return
        self.active = False
        for g in self.groups:
            for p in g.params:
                if p.data_ptr() in g.ptrs:
                    p.data = p.data.clone()
        state = self.optimizer.state
        if state is self._state:
            for s in state.values():
                for key in _STATE_KEYS & s.keys():
                    s[key] = s[key].clone()


def _kernel_step(kernel, flat, grad, exp_avg, exp_avg_sq, step, group) -> None:
    """One step of torch's fused Adam / AdamW ``kernel`` on one flat tensor, with the group's
    hyperparameters and torch's increment of the step count before the call (under ``no_grad``)."""
    beta1, beta2 = group["betas"]
    step.add_(1)
    kernel([flat], [grad], [exp_avg], [exp_avg_sq], [], [step], amsgrad=False, lr=group["lr"], beta1=beta1,
           beta2=beta2, weight_decay=group["weight_decay"], eps=group["eps"], maximize=group["maximize"],
           grad_scale=None, found_inf=None)  # fmt: skip


@functools.cache
def private_step_ok(device_type: str = "cpu") -> bool:
    """Whether this torch has the private names the flat step calls and its direct kernel call
    steps as torch's public single-tensor ``adam()`` / ``adamw()`` do (two steps of two small
    tensors, parameters and state within 1e-7; no optimizer is stepped, so no step hook sees the
    check). Checked once per device type; ``False`` warns once."""
    problem = _private_step_problem(torch.device(device_type))
    if problem is not None:
        warnings.warn(
            f"torch {torch.__version__}: {problem}; Adam / AdamW step per parameter (optimizer.step())",
            RuntimeWarning,
            stacklevel=3,
        )
    return problem is None


def _private_step_problem(device: torch.device) -> str | None:
    """What fails the check of :func:`private_step_ok`, in words, or None."""
    missing = [f"torch.{name}" for name in (*_KERNELS.values(), *_TORCH_PRIVATE) if not hasattr(torch, name)]
    missing += [f"torch.optim.optimizer.{name}" for name in _HOOK_TABLES if not hasattr(_optim_module, name)]
    probe = torch.optim.Adam([torch.zeros(1)])
    missing += [f"Optimizer.{name}" for name in ("_optimizer_step_pre_hooks", "_optimizer_step_post_hooks")
                if not hasattr(probe, name)]  # fmt: skip
    if missing:
        return f"no {', '.join(missing)} for the flat fused Adam step"
    gen = torch.Generator().manual_seed(0)
    start = [torch.rand(3, generator=gen) - 0.5, torch.rand(2, 2, generator=gen) - 0.5]
    grads = [[torch.randn(p.shape, generator=gen).to(device) for p in start] for _ in range(2)]
    hyper = {"lr": 0.01, "betas": (0.9, 0.999), "weight_decay": 0.1, "eps": 1e-8, "maximize": False}
    for module, decoupled in (("adam", False), ("adamw", True)):
        public = getattr(importlib.import_module(f"torch.optim.{module}"), module, None)
        if public is None:
            return f"no public torch.optim.{module}.{module}() to check the flat fused Adam step against"
        params = [p.clone().to(device) for p in start]
        moments = [[torch.zeros_like(p) for p in params] for _ in range(2)]
        steps = [torch.zeros((), dtype=torch.float32, device=device) for _ in params]
        flat = torch.cat([p.reshape(-1) for p in params])
        exp_avg, exp_avg_sq = torch.zeros_like(flat), torch.zeros_like(flat)
        step = torch.zeros((), dtype=torch.float32, device=device)
        name = f"torch.{_KERNELS[decoupled]}"
        try:
            with torch.no_grad():
                for g in grads:
                    public(params, g, *moments, [], steps, foreach=False, fused=False, amsgrad=False,
                           beta1=0.9, beta2=0.999, lr=0.01, weight_decay=0.1, eps=1e-8, maximize=False)  # fmt: skip
                    flat_grad = torch.cat([t.reshape(-1) for t in g])
                    _kernel_step(getattr(torch, _KERNELS[decoupled]), flat, flat_grad, exp_avg, exp_avg_sq, step, hyper)
        except (RuntimeError, TypeError) as exc:
            return f"{name} or the public {public.__name__}() failed on two small tensors ({type(exc).__name__}: {exc})"
        pairs = [(flat, params), (exp_avg, moments[0]), (exp_avg_sq, moments[1])]
        worst = max(float((a - torch.cat([t.reshape(-1) for t in b])).abs().max()) for a, b in pairs)
        if worst > _CHECK_TOLERANCE or float(step) != float(steps[0]):
            return f"{name} on a flat tensor differs from the public {public.__name__}() step by {worst:.2g}"
    return None


def _plain_state(optimizer: torch.optim.Optimizer) -> bool:
    """Empty, or every parameter with exactly ``step`` / ``exp_avg`` / ``exp_avg_sq`` of its
    shape and one step count per group (what a flat group can hold)."""
    state = optimizer.state
    if not state:
        return True
    for group in optimizer.param_groups:
        entries = [state.get(p, {}) for p in group["params"]]  # {}: no state, as ``not s`` sees
        if any(not s or s.keys() != _STATE_KEYS for s in entries):
            return False
        if any(
            s["exp_avg"].shape != p.shape or s["exp_avg_sq"].shape != p.shape for s, p in zip(entries, group["params"])
        ):
            return False
        if len({float(s["step"]) for s in entries}) != 1:
            return False
    return True

"""Adafactor's update as pure whole-tensor torch ops, for torch.compile.

The eager paths (:mod:`._kernels`, :mod:`._cpu_kernel`) read numbers back to
the host (``RMS(U)``, ``RMS(X)``) and hand pointers to C; neither can be
traced. Here every number stays a tensor, so the whole update is one graph:
under ``torch.compile(opt.step)`` it is what runs, and the ``"compiled"``
implementation compiles it once per (device, dtype, number of dims).

The numbers come in as one small tensor ``scalars`` (see :data:`FIELDS`):
the step-dependent ``beta2t`` and ``rho`` (the relative step size or the
group's lr), the loss scale and the group's constants. A new step, a scheduled
lr or a group with another weight_decay then changes data, not the graph; the
graph specialises only on structure: rank, dtype, first moment or not, weight
decay or not, scale_parameter or not.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

#: The entries of ``scalars``, in order.
FIELDS = ("beta2t", "rho", "inv_scale", "eps1", "eps2", "clip_threshold", "beta1", "weight_decay")
BETA2T, RHO, INV_SCALE, EPS1, EPS2, CLIP, BETA1, WEIGHT_DECAY = range(len(FIELDS))


def pack_scalars(group: dict[str, Any], beta2t: float | Tensor, rho: float | Tensor, inv_scale: float, like: Tensor) -> Tensor:
    """``scalars`` for :func:`factored_update_` / :func:`full_update_`, in
    ``like``'s dtype and device (``beta2t`` and ``rho`` may be tensors)."""
    values = [beta2t, rho, inv_scale, group["eps"][0], group["eps"][1], group["clip_threshold"],
              group["beta1"] or 0.0, group["weight_decay"]]
    if not any(isinstance(v, Tensor) for v in values):
        return torch.tensor(values, dtype=like.dtype, device=like.device)
    return torch.stack([torch.as_tensor(v, dtype=like.dtype, device=like.device).reshape(()) for v in values])


def _rms(x: Tensor) -> Tensor:
    return x.square().mean().sqrt()


def _step_size(x: Tensor, scalars: Tensor, scale_parameter: bool) -> tuple[Tensor | None, Tensor]:
    """RMS(X_{t-1}) (only where it is used) and alpha_t = max(eps2, RMS(X_{t-1})) rho_t
    (rho_t without scale_parameter)."""
    rho = scalars[RHO]
    if not scale_parameter:
        return None, rho
    rms_x = _rms(x)
    return rms_x, torch.maximum(rms_x, scalars[EPS2]) * rho


def _apply(
    param: Tensor, x: Tensor, u: Tensor, exp_avg: Tensor | None, step_size: Tensor, scalars: Tensor, *, decay: bool
) -> None:
    """Û = U / max(1, RMS(U)/d);  M_t = beta1 M + (1 - beta1) alpha Û;  X_t = X - wd alpha X - (M_t or alpha Û)."""
    update = u * (step_size / (_rms(u) / scalars[CLIP]).clamp(min=1.0))
    if exp_avg is not None:
        beta1 = scalars[BETA1]
        exp_avg.mul_(beta1).add_((1.0 - beta1) * update)
        update = exp_avg
    if decay:
        x = x - (scalars[WEIGHT_DECAY] * step_size) * x
    param.copy_(x - update)


def factored_update_(
    param: Tensor, grad: Tensor, row: Tensor, col: Tensor, exp_avg: Tensor | None, rms_out: Tensor,
    scalars: Tensor, *, decay: bool, scale_parameter: bool,
) -> None:
    """One step of Algorithm 4 for a parameter of two or more dims (factored over
    the last two). Updates param, row, col, exp_avg and ``rms_out`` (the state's
    RMS, with scale_parameter) in place."""
    dtype = row.dtype
    x = param.to(dtype)
    g = grad.to(dtype) * scalars[INV_SCALE]
    beta2t = scalars[BETA2T]
    rms_x, step_size = _step_size(x, scalars, scale_parameter)
    g2 = g * g + scalars[EPS1]
    # R_t = beta2t R + (1 - beta2t) mean_j(G² + eps1);  C_t likewise over i
    row.mul_(beta2t).add_((1.0 - beta2t) * g2.mean(-1))
    col.mul_(beta2t).add_((1.0 - beta2t) * g2.mean(-2))
    # U = G / sqrt(R_t C_t / mean(R_t))
    r_factor = (row / row.mean(-1, keepdim=True)).rsqrt().unsqueeze(-1)
    u = g * r_factor * col.rsqrt().unsqueeze(-2)
    _apply(param, x, u, exp_avg, step_size, scalars, decay=decay)
    if rms_x is not None:
        rms_out.copy_(rms_x)


def full_update_(
    param: Tensor, grad: Tensor, exp_avg_sq: Tensor, exp_avg: Tensor | None, rms_out: Tensor,
    scalars: Tensor, *, decay: bool, scale_parameter: bool,
) -> None:
    """One step of Algorithm 5 (vectors and scalars: the full second moment)."""
    dtype = exp_avg_sq.dtype
    x = param.to(dtype)
    g = grad.to(dtype) * scalars[INV_SCALE]
    beta2t = scalars[BETA2T]
    rms_x, step_size = _step_size(x, scalars, scale_parameter)
    # V_t = beta2t V + (1 - beta2t)(G² + eps1);  U = G / sqrt(V_t)
    exp_avg_sq.mul_(beta2t).add_((1.0 - beta2t) * (g * g + scalars[EPS1]))
    u = g * exp_avg_sq.rsqrt()
    _apply(param, x, u, exp_avg, step_size, scalars, decay=decay)
    if rms_x is not None:
        rms_out.copy_(rms_x)


class CompiledUpdates:
    """``torch.compile``-d :func:`factored_update_` / :func:`full_update_`, one
    per (device type, dtype, number of dims), built on first use and kept.

    ``dynamic=True`` makes sizes symbolic, so all matrices of a model share one
    graph instead of one per shape (a graph's rank is fixed, hence the dims in
    the key). A group whose constants differ (another weight_decay, say) adds
    one graph; a new step or lr does not: those come in as data."""

    #: torch.compile's backend (tests swap in a counting one).
    backend: Any = "inductor"

    def __init__(self) -> None:
        self._fns: dict[tuple[str, torch.dtype, int], Callable[..., Tensor]] = {}

    def get(self, device: torch.device, dtype: torch.dtype, ndim: int) -> Callable[..., Tensor]:
        key = (device.type, dtype, ndim)
        fn = self._fns.get(key)
        if fn is None:
            fn = self._fns[key] = torch.compile(
                factored_update_ if ndim >= 2 else full_update_, backend=self.backend, dynamic=True, fullgraph=True
            )
        return fn

    def __len__(self) -> int:
        return len(self._fns)

    def __deepcopy__(self, memo: dict[int, Any]) -> CompiledUpdates:
        return CompiledUpdates()  # compiled functions are a cache, rebuilt on use

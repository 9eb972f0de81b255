"""Adafactor's update as one function: the algorithm, where it is changed.

Shazeer & Stern (2018), https://arxiv.org/abs/1804.04235, Algorithms 4 and 5,
with the choices of fairseq and Hugging Face (``transformers.optimization.
Adafactor``): row and column *means*, ``eps1`` added to the squared gradient,
clipping before the optional first moment, decoupled weight decay scaled by
the step size. For a weight X of shape (n, m) with gradient G at step t:

    rho_t   = min(1e-2, 1/sqrt(t))          (min(1e-6 t, 1/sqrt(t)) with warmup_init;
                                             the group's lr when relative_step=False)
    alpha_t = max(eps2, RMS(X_{t-1})) rho_t  (rho_t when scale_parameter=False)
    beta2t  = 1 - t^decay_rate
    R_t = beta2t R + (1 - beta2t) mean_j (G² + eps1)          # n numbers
    C_t = beta2t C + (1 - beta2t) mean_i (G² + eps1)          # m numbers
    U   = G / sqrt(R_t C_t / mean(R_t))                       # vectors: V_t instead
    Û   = U / max(1, RMS(U) / clip_threshold)
    M_t = beta1 M + (1 - beta1) alpha_t Û                     # only with beta1
    X_t = X - weight_decay alpha_t X - (M_t or alpha_t Û)

:func:`adafactor_update` is that box, one operation per line, for one
parameter. It runs eagerly, traces under ``torch.compile`` (every number may
be a 0-dim tensor, and nothing is read back to the host), and runs on a
shard of a parameter: every reduction over the parameter's elements goes
through ``mean``, which a caller holding a shard replaces by one that
all-reduces over the shards. The C kernel (:mod:`._cpu_kernel`) computes the
same step for fp32 CPU tensors in two passes over memory, and is tested
against this function.
"""

from __future__ import annotations

import math
import types
from collections.abc import Callable
from typing import Any, Protocol

import torch
from torch import Tensor

#: parameters stepped with fp32 math and fp32 state
LOW_PRECISION = (torch.float16, torch.bfloat16)

Number = float | Tensor


class Mean(Protocol):
    """``torch.mean``'s signature, for the reductions over a parameter's
    elements: ``x`` has the parameter's number of dims (1 where a statistic
    is reduced already), and ``dim`` is one of the parameter's dims: -1 (its
    columns), -2 (its rows) or None (all of it). Over a whole parameter that
    is ``x.mean(dim)``; over a shard, the local sums all-reduced over the
    shards that split ``dim`` and divided by the whole parameter's count
    along it (tests/test_adafactor_functional.py steps a parameter as two
    row shards this way)."""

    def __call__(self, x: Tensor, dim: int | None = None, keepdim: bool = False) -> Tensor: ...


def _mean(x: Tensor, dim: int | None = None, keepdim: bool = False) -> Tensor:
    return x.mean() if dim is None else x.mean(dim, keepdim=keepdim)


def relative_step_size(step: Number, warmup_init: bool) -> Number:
    """rho_t of the paper: min(1e-2, 1/sqrt(t)), or min(1e-6 t, 1/sqrt(t)) with warm-up
    (a number for a number ``step``, a tensor for a tensor one)."""
    cap = 1e-6 * step if warmup_init else 1e-2
    if isinstance(step, Tensor):
        return torch.minimum(step.rsqrt(), torch.as_tensor(cap, dtype=step.dtype, device=step.device))
    return min(cap, 1.0 / math.sqrt(step))


def adafactor_update(
    param: Tensor,
    grad: Tensor,
    exp_avg_sq_row: Tensor | None,
    exp_avg_sq_col: Tensor | None,
    exp_avg_sq: Tensor | None,
    exp_avg: Tensor | None,
    rms: Tensor,
    *,
    step: Number,
    lr: Number | None,
    eps1: Number,
    eps2: Number,
    clip_threshold: Number,
    decay_rate: Number,
    beta1: Number | None,
    weight_decay: Number,
    scale_parameter: bool,
    relative_step: bool,
    warmup_init: bool,
    lr_scale: Number = 1.0,
    inv_scale: Number = 1.0,
    mean: Mean = _mean,
) -> None:
    """One Adafactor step of ``param`` (step count ``step``, already advanced),
    in place: the parameter, its statistics (``exp_avg_sq_row`` and
    ``exp_avg_sq_col`` for two or more dims, ``exp_avg_sq`` otherwise), its
    first moment ``exp_avg`` (with ``beta1``) and ``rms`` (RMS(X_{t-1}),
    stored as Hugging Face stores it). fp16/bf16 parameters are stepped with
    fp32 math; the state is in the compute dtype. ``inv_scale``: the gradient
    is ``grad * inv_scale`` (a loss scale folded into the step). ``lr_scale``
    multiplies the relative step size (optcore's layer-wise scaling)."""
    dtype = torch.float32 if param.dtype in LOW_PRECISION else param.dtype
    x = param.to(dtype)  # fp16/bf16: an fp32 copy, written back at the end
    g = grad.to(dtype)
    # Step size: rho_t times the parameter's scale RMS(X_{t-1}).
    rms.copy_(mean(x.square()).sqrt())
    rho = relative_step_size(step, warmup_init) * lr_scale if relative_step else lr
    alpha = rms.clamp(min=eps2) * rho if scale_parameter else rho
    beta2t = 1.0 - step**decay_rate
    # Second moment: factored into row and column means for matrices, full for vectors.
    sq = g.square() * inv_scale**2 + eps1  # (G / s)² + eps1
    if exp_avg_sq is None:
        exp_avg_sq_row.mul_(beta2t).add_((1.0 - beta2t) * mean(sq, -1))  # type: ignore[union-attr]
        exp_avg_sq_col.mul_(beta2t).add_((1.0 - beta2t) * mean(sq, -2))  # type: ignore[union-attr]
        row = exp_avg_sq_row.unsqueeze(-1)  # type: ignore[union-attr]  # R as a column, n x 1
        r_factor = (row / mean(row, -2, keepdim=True)).rsqrt()
        c_factor = exp_avg_sq_col.unsqueeze(-2).rsqrt()  # type: ignore[union-attr]
        u = g * r_factor * c_factor
    else:
        exp_avg_sq.mul_(beta2t).add_((1.0 - beta2t) * sq)
        u = g * exp_avg_sq.rsqrt()
    # Update clipping: RMS(Û) at most clip_threshold (u is U times the loss scale 1/inv_scale).
    rms_u = mean(u.square()).sqrt() * inv_scale
    u = u * (alpha * inv_scale / (rms_u / clip_threshold).clamp(min=1.0))
    # First moment of the clipped, scaled update.
    if beta1 is not None:
        exp_avg.mul_(beta1).add_((1.0 - beta1) * u)  # type: ignore[union-attr]
        u = exp_avg  # type: ignore[assignment]
    # Decoupled weight decay, then the step.
    if not (isinstance(weight_decay, (int, float)) and weight_decay == 0):
        x = x - (weight_decay * alpha) * x
    param.copy_(x - u)


def state_shapes(p: Tensor, beta1: float | None) -> dict[str, torch.Size]:
    """The state :func:`adafactor_update` keeps for ``p`` (besides ``step`` and
    ``RMS``): factored statistics for two or more dims, the full second moment
    otherwise, the first moment only with ``beta1``."""
    if p.dim() >= 2:
        shapes = {"exp_avg_sq_row": p.shape[:-1], "exp_avg_sq_col": p.shape[:-2] + p.shape[-1:]}
    else:
        shapes = {"exp_avg_sq": p.shape}
    if beta1 is not None:
        shapes["exp_avg"] = p.shape
    return shapes


def _own_code(fn: Callable[..., None]) -> Callable[..., None]:
    """``fn`` with a code object of its own: dynamo keeps compiled graphs, and
    counts recompiles against its limit (8), per code object, so each
    structure compiled separately gets its own instead of sharing one."""
    copy = types.FunctionType(fn.__code__.replace(), fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)
    copy.__kwdefaults__ = fn.__kwdefaults__
    return copy


class CompiledUpdate:
    """:func:`adafactor_update` through ``torch.compile``, one graph per
    (device type, dtype, number of dims, structure), built on first use.

    Every number goes in as a 0-dim tensor (a zero weight decay as the
    number 0, which drops its term), so a new step, a scheduled lr or a group
    with other constants changes data, not the graph; ``dynamic=True`` lets
    all shapes of one rank share a graph."""

    #: torch.compile's backend (tests swap in a counting one).
    backend: Any = "inductor"

    def __init__(self) -> None:
        self._fns: dict[tuple[Any, ...], Callable[..., None]] = {}

    def __call__(self, param: Tensor, grad: Tensor, *state: Tensor | None, **hparams: Any) -> None:
        """:func:`adafactor_update` with the same arguments."""
        like = state[-1]  # RMS: the compute dtype, on the parameter's device
        flags = tuple(hparams[k] for k in ("scale_parameter", "relative_step", "warmup_init"))
        key = (param.device.type, param.dtype, param.dim(), hparams["beta1"] is None, hparams["weight_decay"] == 0, flags)
        fn = self._fns.get(key)
        if fn is None:
            fn = self._fns[key] = torch.compile(_own_code(adafactor_update), backend=self.backend, dynamic=True,
                                                fullgraph=True)
        data = {
            k: v if v is None or isinstance(v, bool) or (k == "weight_decay" and v == 0)
            else torch.as_tensor(v, dtype=like.dtype, device=like.device)
            for k, v in hparams.items()
        }
        fn(param, grad, *state, **data)

    def __len__(self) -> int:
        return len({k[:3] for k in self._fns})

    def __deepcopy__(self, memo: dict[int, Any]) -> CompiledUpdate:
        return CompiledUpdate()  # compiled functions are a cache, rebuilt on use

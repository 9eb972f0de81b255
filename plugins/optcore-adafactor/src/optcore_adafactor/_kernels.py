"""Adafactor's updates, written to touch memory as little as possible.

A transcription of the algorithm (Hugging Face's) allocates about six
temporaries of the parameter's size per step (G² + eps, the row and column
means' inputs, V̂, U, ...) and makes about a dozen passes over memory. Here a
weight matrix is visited in row chunks of about a core's L2 cache, with
scratch buffers that are reused from step to step:

1. *statistics* (:func:`factored_second_moment_`): R from one fused
   square-and-sum over G (``vector_norm(G, dim=1)``); then per chunk, G² goes
   to a scratch buffer that stays in cache, and two matrix-vector products add
   its column sums (for C) and its column sums weighted by 1/R (for RMS(U),
   below) to two m-vectors.
2. *update* (:func:`apply_factored_`): per chunk, U = G * (r ⊗ c) is formed in
   a scratch buffer and added to the parameter (through the first moment, if
   any), visiting the chunks backwards so that those the first pass left in
   the last-level cache come first.

Update clipping needs RMS(U) before the parameter may change, which would be
a third pass over G. It is not, because U_ij = G_ij r_i c_j with
r_i² = mean(R)/R_i and c_j² = 1/C_j, so

    sum U² = mean(R) * sum_j (sum_i G²_ij / R_i) / C_j

and sum_i G²_ij / R_i needs only R, known before the chunks are visited.
Memory traffic per step: G read three times (the first two back to back, often
from cache), X read twice (once for the parameter scale RMS(X)) and written
once: 20 to 24 bytes per fp32 parameter where the bound is 12, against about 60
for the transcription. fp16/bf16 tensors are converted chunk by chunk, so they
never get a full fp32 copy.

A gradient that arrives multiplied by a loss scale s is handled by folding
1/s² into the (small) statistics and 1/s into the step size: no pass over the
gradients is spent on unscaling.

Where a C compiler is found, fp32 CPU matrices and vectors take
:mod:`._cpu_kernel` instead (the whole step of all of them in one C call
per optimizer step: the same two passes as plain loops, G read once in each;
20 bytes per parameter). Parameters of more than two dims (conv kernels) and
strided views take the same formulas as whole-tensor ops; vectors keep the
full second moment.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from . import _cpu_kernel

#: Elements per chunk on CPU: 2 MB of fp32, about a core's L2 cache (measured
#: best among 2^16..2^22 on a 2-core EPYC VM at 10M and 100M parameters).
CHUNK_ELEMS = 1 << 19
#: On accelerators the chunks only bound the scratch memory: few, large launches.
DEVICE_CHUNK_ELEMS = 1 << 24


class Workspace:
    """Scratch buffers reused across parameters and steps (one set per device).

    Not optimizer state: nothing here survives a ``state_dict`` round trip.
    """

    def __init__(self) -> None:
        self._buffers: dict[tuple[torch.device, str], Tensor] = {}

    def get(self, name: str, numel: int, device: torch.device, dtype: torch.dtype) -> Tensor:
        key = (device, f"{name}:{dtype}")
        buf = self._buffers.get(key)
        if buf is None or buf.numel() < numel:
            buf = torch.empty(numel, device=device, dtype=dtype)
            self._buffers[key] = buf
        return buf[:numel]

    def ones(self, numel: int, device: torch.device, dtype: torch.dtype) -> Tensor:
        key = (device, f"ones:{dtype}")
        buf = self._buffers.get(key)
        if buf is None or buf.numel() < numel:
            buf = self._buffers[key] = torch.ones(numel, device=device, dtype=dtype)
        return buf[:numel]


def _as_compute(x: Tensor, buf: Tensor, dtype: torch.dtype) -> Tensor:
    """``x`` in the compute dtype: itself, or converted into ``buf``."""
    if x.dtype == dtype:
        return x
    return buf[: x.shape[0]].copy_(x)


def _rows_per_chunk(t: Tensor) -> int:
    n, m = t.shape
    return max(1, min(n, (CHUNK_ELEMS if t.device.type == "cpu" else DEVICE_CHUNK_ELEMS) // m))


def _chunked(t: Tensor) -> bool:
    """Whether ``t`` takes the chunked two-pass path (contiguous matrices); other
    shapes (conv kernels, strided views) take whole-tensor ops."""
    return t.dim() == 2 and t.is_contiguous()


def _column_sums(grad: Tensor, inv_row: Tensor, workspace: Workspace) -> tuple[Tensor, Tensor]:
    """Column sums of G² and of G² / R (R's reciprocal given), over the row dim."""
    dtype = inv_row.dtype
    if not _chunked(grad):
        g2 = grad.to(dtype).square()
        return g2.sum(-2), (g2 * inv_row[..., None]).sum(-2)
    n, m = grad.shape
    k = _rows_per_chunk(grad)
    g_buf = workspace.get("g", k * m, grad.device, dtype).view(k, m)
    sq_buf = workspace.get("t", k * m, grad.device, dtype).view(k, m)
    ones = workspace.ones(k, grad.device, dtype)
    col_sq = torch.zeros(m, device=grad.device, dtype=dtype)
    col_w = torch.zeros(m, device=grad.device, dtype=dtype)
    for r in range(0, n, k):
        g = _as_compute(grad[r : r + k], g_buf, dtype)
        g2 = torch.mul(g, g, out=sq_buf[: g.shape[0]])
        col_sq.addmv_(g2.t(), ones[: g.shape[0]])  # two matrix-vector products: on CPU
        col_w.addmv_(g2.t(), inv_row[r : r + k])  # faster than one matmul with two rows
    return col_sq, col_w


def factored_second_moment_(
    grad: Tensor, row: Tensor, col: Tensor, *, beta2t: float, eps1: float, inv_scale: float, workspace: Workspace,
    use_c: bool = True,
) -> tuple[Tensor, Tensor, float]:
    """Update the factored statistics R (shape[:-1]) and C (shape[:-2] +
    shape[-1:]) in place, and return ``r, c, RMS(U)`` with
    U = (G * inv_scale) * (r ⊗ c) = G / sqrt(V̂), V̂ = R C / mean(R).

    fp32 CPU matrices take one pass of C loops over G (:mod:`._cpu_kernel`);
    otherwise G is read twice (a fused square-and-sum for R, then the chunked
    column sums). Nothing of G's size is written."""
    dtype = row.dtype
    n, m = grad.shape[-2:]
    inv_s2 = inv_scale * inv_scale
    # R_t = beta2t R + (1 - beta2t) mean_j(G² + eps1);  then the column sums
    # of G² (for C) and of G² / R_t (for RMS(U))
    if use_c and _cpu_kernel.eligible(grad) and row.is_contiguous():
        a, b = (1.0 - beta2t) * inv_s2 / m, (1.0 - beta2t) * eps1
        col_sq, col_w = _cpu_kernel.stats_(grad, row, beta=beta2t, a=a, b=b)
    else:
        row_norm = torch.linalg.vector_norm(grad, dim=-1, dtype=dtype)
        row.mul_(beta2t).addcmul_(row_norm, row_norm, value=(1.0 - beta2t) * inv_s2 / m).add_((1.0 - beta2t) * eps1)
        col_sq, col_w = _column_sums(grad, row.reciprocal(), workspace)
    # C_t = beta2t C + (1 - beta2t) mean_i(G² + eps1)
    col.mul_(beta2t).add_(col_sq, alpha=(1.0 - beta2t) * inv_s2 / n).add_((1.0 - beta2t) * eps1)
    # 1/sqrt(V̂_ij) = r_i c_j with r = sqrt(mean(R) / R), c = sqrt(1 / C)
    row_mean = row.mean(-1, keepdim=True)
    r_factor = (row / row_mean).rsqrt_()
    c_factor = col.rsqrt()
    # sum U² = mean(R) sum_j (sum_i G²_ij / R_i) / C_j   (see the module docstring)
    sum_u2 = float(((col_w / col).sum(-1, keepdim=True) * row_mean).sum()) * inv_s2
    return r_factor, c_factor, math.sqrt(sum_u2 / grad.numel())


def apply_factored_(
    param: Tensor,
    grad: Tensor,
    r_factor: Tensor,
    c_factor: Tensor,
    exp_avg: Tensor | None,
    *,
    lr: float,
    beta1: float | None,
    decay: float,
    workspace: Workspace,
    use_c: bool = True,
) -> None:
    """X <- X - decay X - (M_t or lr U), with U = G * (r ⊗ c) and, with a first
    moment, M_t = beta1 M + (1 - beta1) lr U: one pass over G and X (C loops
    for fp32 CPU matrices, else torch ops in chunks)."""
    dtype = r_factor.dtype
    r_scaled = r_factor.mul(-lr if exp_avg is None else (1.0 - beta1) * lr)  # type: ignore[operator]
    if use_c and _cpu_kernel.eligible(param, grad, exp_avg):
        _cpu_kernel.apply_(param, grad, exp_avg, r_scaled, c_factor, decay=decay, beta1=beta1 or 0.0)
        return
    r_scaled, c_factor = r_scaled[..., None], c_factor[..., None, :]
    if not (_chunked(param) and _chunked(grad)):
        _apply_rows_(param, grad.to(dtype) * c_factor, r_scaled, exp_avg, beta1=beta1, decay=decay, x_buf=None)
        return
    n, m = param.shape
    k = _rows_per_chunk(param)
    g_buf = workspace.get("g", k * m, param.device, dtype).view(k, m)
    u_buf = workspace.get("t", k * m, param.device, dtype).view(k, m)
    x_buf = workspace.get("p", k * m, param.device, dtype).view(k, m)
    for r in reversed(range(0, n, k)):  # backwards: the chunks still in cache first
        g = _as_compute(grad[r : r + k], g_buf, dtype)
        u = torch.mul(g, c_factor, out=u_buf[: g.shape[0]])
        mom = exp_avg[r : r + k] if exp_avg is not None else None
        _apply_rows_(param[r : r + k], u, r_scaled[r : r + k], mom, beta1=beta1, decay=decay, x_buf=x_buf)


def _apply_rows_(
    rows: Tensor, u: Tensor, r_i: Tensor, mom: Tensor | None, *, beta1: float | None, decay: float, x_buf: Tensor | None
) -> None:
    """The update of some rows of X: U's row factors r_i (lr and sign folded in)
    are applied here, so that U itself is formed once."""
    x = rows if rows.dtype == u.dtype else (rows.to(u.dtype) if x_buf is None else _as_compute(rows, x_buf, u.dtype))
    if decay != 0.0:
        x.add_(x, alpha=-decay)
    if mom is None:
        x.addcmul_(u, r_i)
    else:
        mom.mul_(beta1).addcmul_(u, r_i)
        x.sub_(mom)
    if x is not rows:
        rows.copy_(x)


def full_second_moment_(
    grad: Tensor, exp_avg_sq: Tensor, *, beta2t: float, eps1: float, inv_scale: float
) -> tuple[Tensor, float]:
    """Update V (vectors: the full second moment, as in Adam) in place and
    return ``U, RMS(U)`` with U = G / sqrt(V_t) of the *scaled* gradient (the
    caller folds ``inv_scale`` into the step size) and RMS(U) of the unscaled one."""
    g = grad.to(exp_avg_sq.dtype)
    # V_t = beta2t V + (1 - beta2t)(G² + eps1)
    exp_avg_sq.mul_(beta2t).addcmul_(g, g, value=(1.0 - beta2t) * inv_scale * inv_scale).add_((1.0 - beta2t) * eps1)
    u = exp_avg_sq.rsqrt().mul_(g)
    return u, float(torch.linalg.vector_norm(u)) * inv_scale / math.sqrt(u.numel())


def apply_full_(param: Tensor, u: Tensor, exp_avg: Tensor | None, *, lr: float, beta1: float | None, decay: float) -> None:
    """X <- X - decay X - (M_t or lr U), M_t = beta1 M + (1 - beta1) lr U."""
    x = param.to(u.dtype)
    if decay != 0.0:
        x.add_(x, alpha=-decay)
    if exp_avg is None:
        x.add_(u, alpha=-lr)
    else:
        exp_avg.mul_(beta1).add_(u, alpha=(1.0 - beta1) * lr)  # type: ignore[operator]
        x.sub_(exp_avg)
    if x is not param:
        param.copy_(x)

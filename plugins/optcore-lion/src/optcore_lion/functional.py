"""Lion's update as functions: :func:`lion_update`, the paper's algorithm box,
and :func:`lion`, which applies it to a step's tensors by one of two backends.

Chen et al. 2023, "Symbolic Discovery of Optimization Algorithms",
arXiv:2302.06675, Algorithm 2 (state: momentum ``m = 0``)::

    c = beta1 * m + (1 - beta1) * g       interpolate momentum and gradient
    p = p * (1 - lr * wd)                 decoupled weight decay
    p = p - lr * sign(c)                  every coordinate moves by exactly lr
    m = beta2 * m + (1 - beta2) * g       update the momentum

The backends, chosen in :func:`lion` and nowhere else:

- **torch ops**: :func:`lion_update` itself, on lists of tensors. Eagerly on
  CPU it runs over pieces of at most ``_CHUNK`` elements, so each piece stays
  in cache while the ops pass over it, and through scratch made once per step,
  so no piece allocates (fresh memory costs page faults); on accelerators, on DTensor shards
  the kernel does not take, under ``foreach=True`` and when traced by ``torch.compile``,
  over each (device, dtype) batch at once. ``compiled=True`` runs it compiled.
- **the C kernel** (:mod:`optcore_lion._cpu_kernel`): one pass over contiguous
  fp32 CPU tensors, the CPU default; checked against :func:`lion_update` by the tests.
  Over FSDP2's DTensors (``Shard(0)`` or ``Replicate()``, the gradient and momentum
  placed like the parameter) it steps each rank's local shards, as it would the
  whole tensors in one process: the update is elementwise.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from optcore.plugin import by_device_and_dtype
from torch import Tensor

from . import _cpu_kernel

Scalar = float | Tensor  # a Python number, or a 0-d tensor (a compiled step takes those as inputs)
Tensors = list[Tensor]


def lion_update(params: Tensors, grads: Tensors, exp_avgs: Tensors, *, lr: Scalar, weight_decay: Scalar,
                beta1: Scalar, beta2: Scalar, gscale: Scalar = 1.0, c: Sequence[Tensor] | None = None) -> None:
    """One Lion step, in place, on matching lists of parameters, gradients and momenta.

    ``gscale`` multiplies the gradient (``1/scale`` for a scaled loss, negative
    to maximize); it is folded into the two factors of ``g``, so the gradient
    is never rescaled in a pass of its own (``sign(c)`` would not need it, the
    momentum does). Every scalar may be a 0-d tensor: then nothing numeric is a
    constant of a compiled graph, and a changing lr or loss scale does not recompile it.
    ``c`` is scratch shaped like ``exp_avgs`` for the interpolation (new tensors when ``None``).
    """
    c = _mul(exp_avgs, beta1, out=c)                        # c = beta1 * m
    _axpy_(c, (1 - beta1) * gscale, grads)                  # c = c + (1 - beta1) * g
    if isinstance(weight_decay, Tensor) or weight_decay:
        torch._foreach_mul_(params, 1 - lr * weight_decay)  # p = p * (1 - lr * wd)
    torch._foreach_sign_(c)                                 # c = sign(c)
    _axpy_(params, -lr, c)                                  # p = p - lr * c
    torch._foreach_mul_(exp_avgs, beta2)                    # m = beta2 * m
    _axpy_(exp_avgs, (1 - beta2) * gscale, grads)           # m = m + (1 - beta2) * g


def _mul(xs: Tensors, a: Scalar, out: Sequence[Tensor] | None) -> Sequence[Tensor]:
    """``a * x`` for each ``x``, into ``out`` when given (``_foreach_mul`` has no ``out=``)."""
    if out is None:
        return torch._foreach_mul(xs, a)
    for x, o in zip(xs, out):
        torch.mul(x, a, out=o)
    return out


def _axpy_(ys: Sequence[Tensor], a: Scalar, xs: Sequence[Tensor]) -> None:
    """``y += a * x`` for each pair; ``alpha`` takes only numbers, so a 0-d tensor ``a`` multiplies."""
    if isinstance(a, Tensor):
        torch._foreach_addcmul_(ys, xs, [a] * len(xs))
    else:
        torch._foreach_add_(ys, xs, alpha=a)


_CHUNK = 1 << 18  # elements per eager CPU piece: its p, g, m and c (4 MiB in fp32) stay in cache between ops


def lion(params: Tensors, grads: Tensors, exp_avgs: Tensors, *, lr: Scalar, weight_decay: float, beta1: float,
         beta2: float, gscale: float, foreach: bool | None = None, fused: bool | None = None,
         compiled: bool | None = None) -> None:
    """Lion over a step's tensors, each by its backend (the module docstring says which).

    ``exp_avgs`` are fp32 for fp16/bf16 parameters: those are updated through
    an fp32 copy and written back rounded. A tensor the C kernel cannot take
    (``fused=True`` included; the optimizer refuses those first) goes through torch ops.
    """
    hp = dict(lr=lr, weight_decay=weight_decay, beta1=beta1, beta2=beta2, gscale=gscale)
    tracing = torch.compiler.is_compiling()  # the kernel and the pieces are eager-only
    kernel = not tracing and (fused or (fused is None and foreach is None and not compiled))
    batch = _cpu_kernel.Batch() if kernel and _cpu_kernel.load() is not None else None
    routes: dict[str, tuple[Tensors, Tensors, Tensors]] = {}
    for p, g, m in zip(params, grads, exp_avgs):
        g = g if tracing else unaliased(p, g, m)
        plain = type(p) in (Tensor, torch.nn.Parameter)  # a DTensor: its local shards, or torch ops, which know it
        local = None if batch is None else (p, g, m) if plain else _cpu_kernel.local_shards(p, g, m)
        if local is not None and batch.add(*local):  # type: ignore[union-attr]
            continue
        if plain and compiled and not tracing:
            route = "compiled"
        elif tracing or not plain or foreach or (foreach is None and p.device.type != "cpu"):
            route = "batches"
        else:
            route = "pieces"
        for bucket, t in zip(routes.setdefault(route, ([], [], [])), (p, g, m)):
            bucket.append(t)
    if batch is not None:
        batch.run(**hp)
    for route, (ps, gs, ms) in routes.items():
        if route == "compiled":
            _compiled_lion(ps, gs, ms, **hp)
        elif route == "batches":
            for batch in by_device_and_dtype(ps, gs, ms).values():
                _in_state_dtype(lion_update, *batch, **hp)
        else:
            _piecewise(ps, gs, ms, **hp)


def unaliased(p: Tensor, g: Tensor, m: Tensor | None = None) -> Tensor:
    """``g``, or a copy of it where it shares memory with the parameter or the
    momentum (torch allows ``p.grad = p.detach()``). The update writes p and m
    before its last read of g, so an aliased gradient would be read changed
    (and the C kernel reads its tensors as ``restrict``): with the copy every
    backend steps the gradient's value at the start of the step."""
    if type(g) not in (Tensor, torch.nn.Parameter) or not g.numel():  # a DTensor gradient is FSDP2's own buffer
        return g
    storage = g.untyped_storage().data_ptr()
    if storage and storage in (p.untyped_storage().data_ptr(), None if m is None else m.untyped_storage().data_ptr()):
        return g.clone()
    return g


def _in_state_dtype(update: Callable[..., None], ps: Tensors, gs: Tensors, ms: Tensors, **hp: Any) -> None:
    """``update`` on parameters and gradients in the momentum's dtype (an fp32
    copy of fp16/bf16 ones, written back rounded); one dtype per call."""
    work = [p.to(m.dtype) for p, m in zip(ps, ms)]
    update(work, [g.to(m.dtype) for g, m in zip(gs, ms)], ms, **hp)
    if work and work[0] is not ps[0]:
        if type(ps[0]) in (Tensor, torch.nn.Parameter):
            torch._foreach_copy_(ps, work)
        else:  # DTensor shards: _foreach_copy_ has no sharding rule, copy_ has
            for p, w in zip(ps, work):
                p.copy_(w)


def _piecewise(ps: Tensors, gs: Tensors, ms: Tensors, **hp: Any) -> None:
    """:func:`lion_update` over pieces of at most ``_CHUNK`` elements (:func:`_pieces`),
    each through the same scratch, made once per dtype: ``c``, and the fp32
    copies of fp16/bf16 parameters and gradients, so a piece allocates nothing."""
    scratch: dict[torch.dtype, Tensor] = {}
    for pp, pg, pm, sizes in _pieces(ps, gs, ms):
        if sizes is None:  # a non-contiguous tensor, whole
            _in_state_dtype(lion_update, pp, pg, pm, **hp)
            continue
        dtype = pm[0].dtype
        buf = scratch.get(dtype)
        if buf is None:
            buf = scratch[dtype] = torch.empty(3, _CHUNK, dtype=dtype, device=pm[0].device)
        n = sum(sizes)
        c = buf[0, :n].split_with_sizes(sizes)
        if pp[0].dtype == dtype:
            lion_update(pp, pg, pm, **hp, c=c)
            continue
        work, wgrads = buf[1, :n].split_with_sizes(sizes), buf[2, :n].split_with_sizes(sizes)
        torch._foreach_copy_(work, pp)
        torch._foreach_copy_(wgrads, pg)
        lion_update(work, wgrads, pm, **hp, c=c)
        torch._foreach_copy_(pp, work)


def _pieces(ps: Tensors, gs: Tensors, ms: Tensors) -> Iterator[tuple[Tensors, Tensors, Tensors, list[int] | None]]:
    """Flat views of the tensors in batches of at most ``_CHUNK`` elements of one
    dtype, with their sizes: a large tensor is split, small ones share a batch; a
    non-contiguous one goes whole (sizes ``None``)."""
    batch: tuple[Tensors, Tensors, Tensors] = ([], [], [])
    sizes: list[int] = []
    size, dtype = 0, (None, None)
    for p, g, m in zip(ps, gs, ms):
        if not (p.is_contiguous() and g.is_contiguous() and m.is_contiguous()):
            yield [p], [g], [m], None
            continue
        p1, g1, m1, n = p.view(-1), g.view(-1), m.view(-1), p.numel()
        for start in range(0, n, _CHUNK):
            step = min(_CHUNK, n - start)
            if sizes and (size + step > _CHUNK or (p.dtype, m.dtype) != dtype):
                yield (*batch, sizes)
                batch, sizes, size = ([], [], []), [], 0
            batch[0].append(p1[start:start + step])
            batch[1].append(g1[start:start + step])
            batch[2].append(m1[start:start + step])
            sizes.append(step)
            size, dtype = size + step, (p.dtype, m.dtype)
    if sizes:
        yield (*batch, sizes)


_compiled: Callable[..., None] | None = None


def _update_one(p: Tensor, g: Tensor, m: Tensor, scalars: Tensor) -> None:
    """:func:`lion_update` on one tensor, the scalars unpacked from one small tensor (what gets compiled)."""
    lr, weight_decay, beta1, beta2, gscale = scalars.unbind()
    _in_state_dtype(lion_update, [p], [g], [m], lr=lr, weight_decay=weight_decay, beta1=beta1, beta2=beta2,
                    gscale=gscale)


def _compiled_lion(ps: Tensors, gs: Tensors, ms: Tensors, *, lr: Scalar, weight_decay: float, beta1: float,
                   beta2: float, gscale: float) -> None:
    """:func:`lion_update` compiled with ``torch.compile(dynamic=True)``, once per
    (device, dtype, shapes class): each tensor goes in as a flat view, the five
    scalars as one tensor, so neither an lr schedule nor a loss scale recompiles.
    (Python floats would be symbolic too, but inductor's arithmetic on them fails
    guards in torch 2.13.) The first step compiles, for seconds."""
    global _compiled
    if _compiled is None:
        _compiled = torch.compile(_update_one, dynamic=True, fullgraph=True)
    scalars: dict[torch.device, Tensor] = {}
    for p, g, m in zip(ps, gs, ms):
        if p.device not in scalars:  # fp64 on CPU, as the eager backends' Python floats
            dtype = torch.float64 if p.device.type == "cpu" else torch.float32
            values = torch.tensor([0.0, weight_decay, beta1, beta2, gscale], dtype=dtype, device=p.device)
            values[0] = lr  # a float or a 0-d tensor
            scalars[p.device] = values
        if p.is_contiguous() and g.is_contiguous() and m.is_contiguous():
            p, g, m = p.view(-1), g.view(-1), m.view(-1)
        _compiled(p, g, m, scalars[p.device])

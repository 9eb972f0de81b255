"""Lion's step as :func:`torch.compile` of the pure :func:`~optcore_lion.lion.lion_update`.

One compiled function serves every parameter: each tensor goes in as a flat 1-D
view with dynamic shapes, and the five scalars (lr, weight decay, beta1, beta2,
gradient scale) as one small tensor, so nothing numeric is a constant of the
graph: a model compiles once per (device, dtype, shapes class) — dynamo keys
flat views by the rank of the tensor they view and specialises numel 1 — and
neither a learning-rate schedule nor a changing loss scale recompiles it.
(Python floats as inputs would be symbolic too, but inductor's handling of the
arithmetic between them fails guards in torch 2.13; tensors avoid that.)

Inductor fuses the update (and the fp32 round trip of fp16/bf16 parameters)
into one loop that reads ``p, g, m`` and writes ``p, m`` once, like the C
kernel, for any dtype and device inductor supports. The first step pays the
compilation (seconds; see the plugin README), later steps one guard check per tensor.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

_compiled: Callable[..., None] | None = None


def _update_one(p: Tensor, g: Tensor, m: Tensor, scalars: Tensor) -> None:
    """:func:`lion_update` on one tensor, through an fp32 copy for fp16/bf16 parameters."""
    from .lion import lion_update

    lr, weight_decay, beta1, beta2, gscale = scalars.unbind()
    work = p if p.dtype == m.dtype else p.to(m.dtype)
    lion_update(work, g.to(m.dtype), m, torch.empty_like(m), lr=lr, weight_decay=weight_decay,
                beta1=beta1, beta2=beta2, gscale=gscale)
    if work is not p:
        p.copy_(work)


def compiled() -> Callable[..., None]:
    """The compiled per-tensor update (compiled lazily, on its first call)."""
    global _compiled
    if _compiled is None:
        _compiled = torch.compile(_update_one, dynamic=True, fullgraph=True)
    return _compiled


def compiled_lion(params: list[Tensor], grads: list[Tensor], exp_avgs: list[Tensor], *, lr: float | Tensor,
                  weight_decay: float, beta1: float, beta2: float, gscale: float) -> None:
    """The compiled update over each (param, grad, momentum); flat views where contiguous."""
    step = compiled()
    scalars: dict[torch.device, Tensor] = {}
    for p, g, m in zip(params, grads, exp_avgs):
        if p.device not in scalars:  # fp64 on CPU, as the eager paths' Python floats
            dtype = torch.float64 if p.device.type == "cpu" else torch.float32
            values = torch.tensor([0.0, weight_decay, beta1, beta2, gscale], dtype=dtype, device=p.device)
            values[0] = lr  # a float or a 0-d tensor
            scalars[p.device] = values
        if p.is_contiguous() and g.is_contiguous() and m.is_contiguous():
            p, g, m = p.view(-1), g.view(-1), m.view(-1)
        step(p, g, m, scalars[p.device])

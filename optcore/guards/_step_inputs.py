"""The tensors a step is handed, judged before any backend touches them.

torch lets a gradient or a state tensor be replaced behind autograd's and
``load_state_dict``'s checks (``p.grad.data = ...``, ``p.grad.set_(...)``,
``opt.state[p][key] = ...``). Whatever backend then runs (a C kernel, torch
ops piece by piece, foreach batches, a compiled update, a fused kernel), some
of these cannot be stepped right by any of them: a gradient of another shape
(broadcast or refused halfway through a step), one that is not a real
floating-point number, a state tensor without data (``meta``) or whose
elements share memory (``torch.zeros(1).expand(n)``: one value cannot hold a
statistic per element). Each is refused here, before anything is written, by
one test shared by every optimizer's step, so that every backend refuses the
same inputs alike and steps the rest.

What a backend can step is left to it: a non-contiguous state tensor (torch
ops step it in place), a gradient or state of another floating dtype (each
backend computes in the state's dtype). Which dtypes and devices the state
itself must have is the optimizer's to say (``state_kind``): some cast or
move it, torch's own kernels need the parameter's.

The common case costs a few attribute reads per tensor (the shape, the dtype,
whether it is contiguous): this runs for every parameter of every step, and
the slower tests run only for a tensor that fails a fast one.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import Tensor

#: ``state_kind`` values: any dtype and device (the optimizer casts or moves its
#: state itself); a floating dtype on the parameter's device (computing in the
#: state's dtype); exactly the parameter's dtype and device (torch's foreach and fused ops).
STATE_KINDS = ("any", "floating", "param")


def grad_problem(p: Tensor, grad: Tensor) -> str | None:
    """Why no backend can step ``p`` with ``grad`` (a phrase about the gradient:
    "has shape ..."), or ``None``: a gradient
    must have its parameter's shape and be a real floating-point tensor where
    the parameter is one (complex where it is complex)."""
    if grad.dtype is p.dtype and grad.shape == p.shape:
        return None
    if grad.shape != p.shape:
        return (f"has shape {tuple(grad.shape)}, not the parameter's {tuple(p.shape)} (a gradient replaced "
                "through .data or .set_()); give every parameter a gradient of its own shape, or set it to None")
    if grad.is_complex() != p.is_complex() or not (grad.is_floating_point() or grad.is_complex()):
        return (f"is {grad.dtype} and the parameter {p.dtype}: a gradient is a number of the parameter's "
                f"kind; make it with backward(), or cast it with p.grad = p.grad.to({p.dtype})")
    return None


def state_problem(key: str, value: Tensor, p: Tensor, kind: str = "any") -> str | None:
    """Why no backend can step state ``value`` (stored under ``key``, of
    ``p``'s statistics' shape; a phrase about it: "is ..."), or ``None``: it must hold data, one element per
    position (no two elements in one place of memory), and with ``kind``
    ``"floating"`` or ``"param"`` a dtype and device :data:`STATE_KINDS` names."""
    usual = value.is_contiguous() and not value.is_meta
    if usual and kind == "any":
        return None
    if usual and value.device == p.device and (
            value.dtype is p.dtype if kind == "param" else value.is_floating_point() or value.is_complex()):
        return None
    if value.is_meta and not p.is_meta:
        return "is a meta tensor, which holds no values; load the optimizer's state again"
    if not value.is_contiguous() and overlaps_itself(value):
        return (f"has elements that share memory (shape {tuple(value.shape)}, strides "
                f"{value.stride()}, as torch.expand makes), so it cannot hold one value per element; store a "
                f"copy of its own (opt.state[p][{key!r}] = value.clone())")
    if kind == "any":
        return None
    if value.device != p.device:
        return (f"is on {value.device} and the parameter on {p.device}; move it with "
                f"opt.state[p][{key!r}] = value.to({str(p.device)!r})")
    if kind == "param" and value.dtype is not p.dtype:
        return (f"is {value.dtype} and this optimizer keeps it in the parameter's dtype "
                f"{p.dtype}; cast it with opt.state[p][{key!r}] = value.to({p.dtype})")
    if kind == "floating" and not (value.is_floating_point() or value.is_complex()):
        return (f"is {value.dtype}, and this optimizer's statistics are floating-point "
                f"numbers; cast it with opt.state[p][{key!r}] = value.float(), or start the optimizer fresh")
    return None


def overlaps_itself(t: Tensor) -> bool:
    """Whether two elements of ``t`` are one place in memory (an expanded or
    ``as_strided`` view): a zero stride, or strides that interleave. Exact: a
    layout the quick test cannot clear is checked element by element."""
    dims = sorted((stride, size) for size, stride in zip(t.shape, t.stride()) if size > 1)
    if not dims:
        return False
    if dims[0][0] == 0:
        return True
    reach = 0  # the furthest offset the dimensions of smaller strides reach
    for stride, size in dims:
        if stride <= reach:
            break
        reach += (size - 1) * stride
    else:
        return False
    span = 1 + sum((size - 1) * stride for stride, size in dims)
    offsets = torch.arange(span, dtype=torch.int64).as_strided(t.shape, t.stride())
    return bool(offsets.unique().numel() != t.numel())


def step_problem(p: Tensor, grad: Tensor | None, state: Iterable[tuple[str, Any]], kind: str = "any", *,
                 elementwise: bool = False) -> str | None:
    """The first reason a step cannot use ``p``'s gradient or the ``(key, value)``
    state tensors given ("its gradient ...", "its state ..."), or ``None``: for an optimizer that judges its own
    tensors where :func:`optcore.plugin.prepare_step` does not (a precision
    wrapper's inner torch optimizer). With ``elementwise`` every state tensor
    with a dimension must have ``p``'s shape; 0-d tensors and other values are
    not judged."""
    problem = None if grad is None else grad_problem(p, grad)
    if problem is not None:
        return f"its gradient {problem}"
    for key, value in state:
        if isinstance(value, Tensor) and value.dim():
            if elementwise and value.shape != p.shape:
                return (f"its state {key!r} has shape {tuple(value.shape)}, not the parameter's {tuple(p.shape)}; "
                        "the optimizer state belongs to another model: load a checkpoint of this model")
            problem = state_problem(key, value, p, kind)
            if problem is not None:
                return f"its state {key!r} {problem}"
    return None

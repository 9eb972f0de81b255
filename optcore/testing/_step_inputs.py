"""Gradients and state that no step can use, for plugins' tests of every backend.

:data:`BAD_STEP_INPUTS` names each way a tensor reaches a step behind
autograd's and ``load_state_dict``'s checks (docs/contract.md, "The step
preamble and the errors"), and :func:`assert_step_refused` holds an optimizer
to the contract for one of them: a :class:`~optcore.StepError`, and every
parameter, state value, step count and loss scale bit-identical afterwards.
The per-backend matrix (kernel, torch ops, foreach, compiled, fused) is the
plugin's own: its tests build one optimizer per backend and run every case.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import Tensor

#: what a case changes: the parameter that has a gradient, and the state the stepping optimizer keeps for it
Spoil = Callable[[Tensor, dict[str, Any]], None]


def _state_tensor(state: dict[str, Any]) -> str:
    """The key of a floating state tensor with a dimension (a statistic of the parameter)."""
    for key, value in state.items():
        if isinstance(value, Tensor) and value.dim() and value.is_floating_point():
            return key
    raise AssertionError(f"no floating state tensor with a dimension in {sorted(state)}; step once before spoiling")


def _replace_state(make: Callable[[Tensor], Tensor]) -> Spoil:
    def spoil(p: Tensor, state: dict[str, Any]) -> None:
        key = _state_tensor(state)
        state[key] = make(state[key])

    return spoil


def _overlapping(v: Tensor) -> Tensor:
    """``v``'s shape over fewer places than elements: every stride 1 (an ``as_strided`` view)."""
    flat = torch.zeros(v.numel(), dtype=v.dtype, device=v.device)
    return flat.as_strided(v.shape, (1,) * v.dim()) if v.dim() > 1 else flat[:1].expand(v.shape)


def _grad_of_shape(shape: tuple[int, ...], how: str) -> Spoil:
    def spoil(p: Tensor, state: dict[str, Any]) -> None:
        if how == "data":
            p.grad.data = torch.zeros(shape, dtype=p.grad.dtype, device=p.device)
        else:
            p.grad.set_(torch.zeros(shape, dtype=p.grad.dtype, device=p.device))

    return spoil


def _int_grad(p: Tensor, state: dict[str, Any]) -> None:
    p.grad.data = torch.ones(p.shape, dtype=torch.int64, device=p.device)


#: case name -> how it spoils ``(parameter, its state)``; each is refused by every backend with a StepError
BAD_STEP_INPUTS: dict[str, Spoil] = {
    "expanded state": _replace_state(lambda v: torch.zeros((1,) * v.dim(), dtype=v.dtype, device=v.device).expand(
        v.shape)),
    "overlapping state": _replace_state(_overlapping),
    "meta state": _replace_state(lambda v: torch.empty(v.shape, dtype=v.dtype, device="meta")),
    "gradient of fewer elements (.data)": _grad_of_shape((3,), "data"),
    "gradient of another shape (.set_)": _grad_of_shape((5, 7), "set_"),
    "integer gradient": _int_grad,
}

#: case name -> a spoil that keeps the values: every backend steps it as it steps the original
STEPPABLE_STEP_INPUTS: dict[str, Spoil] = {
    "transposed state": _replace_state(lambda v: v.t().contiguous().t() if v.dim() == 2 else v.clone()),
    "float64 state": _replace_state(lambda v: v.double()),
    "expanded gradient": lambda p, state: setattr(p, "grad", p.grad[(0,) * p.dim()].expand(p.shape)),
}


def snapshot(optimizer: Any, tensors: Iterable[Tensor]) -> Any:
    """Copies of ``tensors``, of the optimizer's state and of its loss scale, for :func:`same`."""
    state = getattr(optimizer, "optimizer", optimizer).state
    return (
        [t.detach().clone() for t in tensors],
        {id(k): copy.deepcopy({key: value for key, value in v.items()}) for k, v in state.items()},
        getattr(optimizer, "loss_scale", None),
    )


def same(a: Any, b: Any) -> bool:
    """Bit-identical: tensors of one dtype, shape, device and layout holding equal bits."""
    if isinstance(a, Tensor):
        if not (isinstance(b, Tensor) and (a.dtype, a.shape, a.device) == (b.dtype, b.shape, b.device)):
            return False
        if a.device.type == "meta":
            return True
        return a.stride() == b.stride() and torch.equal(_bits(a), _bits(b))
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return isinstance(b, (list, tuple)) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return bool(a == b)


def _bits(t: Tensor) -> Tensor:
    return t.detach().reshape(-1).clone(memory_format=torch.contiguous_format).view(torch.uint8)


def assert_step_refused(optimizer: Any, tensors: list[Tensor], spoil: Spoil, p: Tensor, state: dict[str, Any],
                        what: str = "") -> Exception:
    """``spoil(p, state)``, then ``optimizer.step()`` must raise a StepError and
    leave ``tensors`` (the parameters, and any master copies), the optimizer's
    state and its loss scale bit-identical. Returns the error."""
    from .._errors import StepError

    spoil(p, state)
    before = snapshot(optimizer, tensors)
    try:
        optimizer.step()
    except StepError as exc:
        error: Exception = exc
    else:
        raise AssertionError(f"{type(optimizer).__name__}.step() with {what or 'a bad input'} raised no StepError")
    assert same(before, snapshot(optimizer, tensors)), f"a step refused for {what} changed parameters or state"
    return error

"""The contract's step preamble: what every native ``step`` does before its update.

torch's optimizers share one (the closure under ``enable_grad``, GradScaler's
``found_inf``/``grad_scale`` handshake); optcore's native optimizers share
:func:`prepare_step`, so those, the ``scale`` check and the checks of the
gradients and state are written once and fail alike: a
:class:`optcore.StepError` that names the parameter, raised before anything
is updated (a configuration is refused earlier, with a ``ConfigError``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from .._contract import GroupSelector
from .._errors import ConfigError, StepError
from ..guards._state import state_rule
from ..guards._step_inputs import STATE_KINDS, grad_problem, state_problem, step_problem


@dataclass(frozen=True)
class PreparedStep:
    """What a step updates, once :func:`prepare_step` has passed."""

    #: what the closure returned (``None`` without one): ``step`` returns it
    loss: Any
    #: the gradients are divided by this: ``step(scale=)`` times GradScaler's ``grad_scale``
    scale: float
    #: ``(index in param_groups, group)`` of each group to update; empty when skipped, and
    #: when ``check_grads=False`` steps all groups (``param_groups`` is not read then)
    groups: list[tuple[int, dict[str, Any]]]
    #: GradScaler found inf/NaN gradients: update nothing this step
    skip: bool = False
    #: the positions in ``param_groups`` of the groups ``groups=`` selected; ``None`` for all
    indices: list[int] | None = None

    def params(self) -> Iterator[tuple[int, dict[str, Any], int, Tensor]]:
        """``(group index, group, position in the group, parameter)`` of every parameter with a gradient."""
        for index, group in self.groups:
            for i, p in enumerate(group["params"]):
                if p.grad is not None:
                    yield index, group, i, p


def where(index: int, group: dict[str, Any], i: int, p: Tensor) -> str:
    """How an error names parameter ``i`` of group ``index``: by name where the group has names."""
    names = group.get("param_names")
    name = f"{names[i]!r} " if names and i < len(names) else ""
    return f"parameter {name}(#{i} of param group {index}, shape {tuple(p.shape)})"


def prepare_step(
    optimizer: Any,
    closure: Callable[[], Any] | None = None,
    scale: float = 1.0,
    groups: GroupSelector = None,
    *,
    check_grads: bool = True,
    state_kind: str = "any",
) -> PreparedStep:
    """The start of ``optimizer.step(closure, scale, groups)``, in torch's order:

    1. the closure runs with gradients enabled (so ``scale`` applies to the gradients it produced);
    2. GradScaler's ``grad_scale`` joins ``scale`` (the class sets
       ``_step_supports_amp_scaling = True``), which must be positive and finite;
    3. ``groups`` selects param groups (by index or ``name``), all of them where
       ``supports_groups`` is false;
    4. with GradScaler's ``found_inf`` set, the step is skipped (``skip``);
    5. every gradient must be dense, of its parameter's shape and a real
       floating-point tensor (:func:`optcore.guards.grad_problem`), and every
       state tensor of a parameter must have the shape the class's
       ``state_shapes`` rule gives, hold data, and have no two elements in one
       place of memory; with ``state_kind`` ``"floating"`` it must also be a
       floating-point tensor on the parameter's device, with ``"param"`` have
       the parameter's dtype and device (:func:`optcore.guards.state_problem`).

    A wrapper whose step hands the gradients to an inner optimizer (the
    precision wrappers), which checks its own, passes ``check_grads=False``:
    step 5 is left out, and without ``groups`` neither the parameters nor
    ``param_groups`` are read, so torch.compile traces the preamble over a
    wrapper's group views.

    Any failure is a :class:`~optcore.StepError` raised before anything is
    updated; the optimizer's own checks (a kernel's needs) follow, then the update.
    """
    name = type(optimizer).__name__
    loss = None
    if closure is not None:
        with torch.enable_grad():
            loss = closure()
    grad_scale = getattr(optimizer, "grad_scale", None)
    scale = float(scale) * (float(grad_scale) if grad_scale is not None else 1.0)
    if not (math.isfinite(scale) and scale > 0):
        raise StepError(f"{name}.step: scale must be a positive finite number (the loss scale), got {scale}.")
    selected = None if groups is None else optimizer._select_groups(groups)
    if selected is not None and len(selected) != len(optimizer.param_groups) and not getattr(
            optimizer, "supports_groups", True):
        raise StepError(f"{name} steps all param groups at once (supports_groups is False); step without groups=, "
                        "or give the groups their own lr instead.")
    found_inf = getattr(optimizer, "found_inf", None)
    if found_inf is not None and float(found_inf):
        return PreparedStep(loss, scale, [], skip=True)
    if selected is None and not check_grads:
        return PreparedStep(loss, scale, [])
    positions = {id(group): index for index, group in enumerate(optimizer.param_groups)}
    chosen = [(positions[id(group)], group) for group in (optimizer.param_groups if selected is None else selected)]
    prepared = PreparedStep(loss, scale, chosen, indices=None if selected is None else [i for i, _ in chosen])
    if not check_grads:
        return prepared
    if state_kind not in STATE_KINDS:
        raise ConfigError(f"prepare_step: state_kind must be one of {STATE_KINDS}, got {state_kind!r}.")
    rule = state_rule(optimizer)
    state_of = optimizer.state
    # the usual tensors pass on a few attribute reads each; only one that fails them gets the
    # full test (grad_problem, state_problem) and a message
    floating, same = state_kind != "any", state_kind == "param"
    for index, group in chosen:
        for i, p in enumerate(group["params"]):
            grad = p.grad
            if grad is None:
                continue
            if grad.is_sparse:
                raise StepError(
                    f"{name} cannot step: the gradient of {where(index, group, i, p)} is sparse; use "
                    "nn.Embedding(sparse=False), or torch.optim.SparseAdam for those parameters.",
                    param=where(index, group, i, p),
                )
            shape = p.shape
            if grad.dtype is not p.dtype or grad.shape != shape:
                problem = grad_problem(p, grad)
                if problem is not None:
                    raise StepError(f"{name} cannot step: the gradient of {where(index, group, i, p)} {problem}.",
                                    param=where(index, group, i, p))
            state = state_of.get(p) if rule is not None else None
            if not state:
                continue
            if callable(rule):
                _check_state(name, rule, state, index, group, i, p, state_kind)
                continue
            cpu = p.is_cpu
            for key, value in state.items():
                if not isinstance(value, Tensor):
                    continue
                if value.shape != shape:
                    if value.dim():
                        raise _shape_error(name, key, value, shape, index, group, i, p)
                elif not value.is_contiguous() or value.is_meta or floating and not (
                        (value.is_cpu if cpu else value.device == p.device)
                        and (value.dtype is p.dtype if same else value.is_floating_point())):
                    _refuse_state(name, key, value, state_kind, index, group, i, p)
    return prepared


def _shape_error(name: str, key: str, value: Tensor, want: Any, index: int, group: dict[str, Any], i: int,
                 p: Tensor) -> StepError:
    return StepError(
        f"{name} cannot step: the state {key!r} of {where(index, group, i, p)} has shape "
        f"{tuple(value.shape)}, not {tuple(want)}; the optimizer state belongs to another model. Load a checkpoint "
        "of this model (or start with a fresh optimizer).",
        param=where(index, group, i, p),
    )


def _refuse_state(name: str, key: str, value: Tensor, kind: str, index: int, group: dict[str, Any], i: int,
                  p: Tensor) -> None:
    """The StepError for state of the right shape that :func:`~optcore.guards.state_problem` refuses."""
    problem = state_problem(key, value, p, kind) if value.dim() else None
    if problem is not None:
        raise StepError(f"{name} cannot step: the state {key!r} of {where(index, group, i, p)} {problem}.",
                        param=where(index, group, i, p))


def _check_state(name: str, rule: Any, state: dict[str, Any], index: int, group: dict[str, Any], i: int,
                 p: Tensor, kind: str) -> None:
    """The state keys a callable rule names, each of the shape it gives: state
    of another shape (another model's) would be read past its end by a kernel,
    or broadcast by torch ops, and state no backend can write
    (:func:`~optcore.guards.state_problem`) is refused."""
    for key, want in rule(group, p).items():
        value = state.get(key)
        if not isinstance(value, Tensor):
            continue
        if value.shape == (want if isinstance(want, tuple) else tuple(want)):
            _refuse_state(name, key, value, kind, index, group, i, p)
        elif value.dim():
            raise _shape_error(name, key, value, want, index, group, i, p)


def check_step_state(optimizer: Any, params: list[Tensor], *, owner: str | None = None) -> None:
    """A :class:`~optcore.StepError` for the first of ``params`` whose state in
    ``optimizer`` no backend can step, raised before anything changes: for a
    wrapper that hands tensors to an optimizer whose ``step`` does not call
    :func:`prepare_step` (a torch class inside a precision wrapper). A native
    optimizer judges its own state in :func:`prepare_step`; torch's classes
    need their state in the parameter's dtype and on its device, other classes
    only tensors that hold data with no two elements in one place. ``owner``
    names the wrapper in the message."""
    cls = getattr(type(optimizer), "adapted_from", type(optimizer))
    kind = "param" if cls.__module__.startswith("torch.optim") else "any"
    elementwise = state_rule(optimizer) == "elementwise"
    state = optimizer.state
    for i, p in enumerate(params):
        entry = state.get(p)
        problem = step_problem(p, None, entry.items(), kind, elementwise=elementwise) if entry else None
        if problem is not None:
            name = f"{owner or type(optimizer).__name__} ({type(optimizer).__name__})"
            raise StepError(f"{name} cannot step tensor #{i} it steps (shape {tuple(p.shape)}): {problem}.",
                            param=f"#{i}, shape {tuple(p.shape)}")

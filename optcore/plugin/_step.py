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
from .._errors import StepError
from ..guards._state import state_rule


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
) -> PreparedStep:
    """The start of ``optimizer.step(closure, scale, groups)``, in torch's order:

    1. the closure runs with gradients enabled (so ``scale`` applies to the gradients it produced);
    2. GradScaler's ``grad_scale`` joins ``scale`` (the class sets
       ``_step_supports_amp_scaling = True``), which must be positive and finite;
    3. ``groups`` selects param groups (by index or ``name``), all of them where
       ``supports_groups`` is false;
    4. with GradScaler's ``found_inf`` set, the step is skipped (``skip``);
    5. every gradient must be dense, and every state tensor of a parameter must
       have the shape the class's ``state_shapes`` rule gives.

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
    rule = state_rule(optimizer)
    for index, group, i, p in prepared.params():
        if p.grad.is_sparse:
            raise StepError(
                f"{name} cannot step: the gradient of {where(index, group, i, p)} is sparse; use "
                "nn.Embedding(sparse=False), or torch.optim.SparseAdam for those parameters.",
                param=where(index, group, i, p),
            )
        state = optimizer.state.get(p) if rule is not None else None
        if state:
            _check_state(name, rule, state, index, group, i, p)
    return prepared


def _check_state(name: str, rule: Any, state: dict[str, Any], index: int, group: dict[str, Any], i: int,
                 p: Tensor) -> None:
    """State of another shape than the rule says (another model's) would be read
    past its end by a kernel, or broadcast by torch ops: refused. Only the keys
    a callable rule names are judged (each once per step: this runs for every
    parameter, so it compares shapes without building tuples)."""
    if callable(rule):
        pairs = [(key, state.get(key), want) for key, want in rule(group, p).items()]
    else:
        pairs = [(key, value, p.shape) for key, value in state.items()]
    for key, value, want in pairs:
        if not isinstance(value, Tensor) or value.shape == (want if isinstance(want, tuple) else tuple(want)):
            continue
        if value.dim() == 0:
            continue
        raise StepError(
            f"{name} cannot step: the state {key!r} of {where(index, group, i, p)} has shape "
            f"{tuple(value.shape)}, not {tuple(want)}; the optimizer state belongs to another model. Load a checkpoint "
            "of this model (or start with a fresh optimizer).",
            param=where(index, group, i, p),
        )

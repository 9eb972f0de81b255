"""The checks a state dict gets before it loads into an optimizer.

torch checks only the number of parameters per group, so state for
``Linear(32, 32)`` loads into ``Linear(64, 64)`` and a fused step reads past
it; a state dict made by optcore also says which optimizer saved it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch import Tensor

from ._errors import ConfigError, warn_user

#: bitsandbytes' 8-bit moments: quantised floats, not integers.
_QUANTISED = ("uint8", "int8")


def check_identity(optimizer: Any, record: Mapping[str, Any]) -> None:
    spec = getattr(optimizer, "optcore_spec", None)
    if spec is None:  # made by adapt() directly (ZeroRedundancyOptimizer's shards): no name to compare
        return
    saved = f"{record.get('name')} from {record.get('provider')}"
    if (record.get("name"), record.get("provider")) != (spec.name, spec.provider):
        raise ConfigError(
            f"This state_dict was saved by {saved} {record.get('version') or ''}".rstrip()
            + f", and this optimizer is {spec.name} from {spec.provider}: one optimizer's state means nothing "
            f"to another. Build the optimizer that saved it (type {record.get('provider')}:{record.get('name')}) "
            "to resume, or skip load_state_dict to start this one fresh.",
            problems=[("optcore", f"saved by {saved}, loading into {spec.qualified}")],
        )
    if record.get("version") != (None if spec.version is None else str(spec.version)):
        warn_user(
            f"This state_dict was saved by {saved} version {record.get('version')}, and this is version "
            f"{spec.version}; it loads because its layout fits the parameters. Check the provider's changelog "
            "if the resumed run behaves differently.", UserWarning)


def check_shapes(optimizer: Any, state_dict: Mapping[str, Any], saved_shapes: Any) -> None:
    groups, state = state_dict.get("param_groups"), state_dict.get("state")
    if not isinstance(groups, list) or not isinstance(state, Mapping):
        return
    known_layout = getattr(type(optimizer), "adapted_from", type(optimizer)).__module__.startswith("torch.optim")
    position = 0
    for g, (saved, group) in enumerate(zip(groups, optimizer.param_groups)):
        for i, (index, param) in enumerate(zip(saved.get("params", ()), group["params"])):
            entry = state.get(index)
            shape = saved_shapes.get(index) if isinstance(saved_shapes, Mapping) else None
            problem = _mismatch(param, entry, shape, known_layout) if isinstance(entry, Mapping) else None
            if problem:
                raise ConfigError(
                    f"The state_dict does not fit this optimizer's parameters: parameter {position + i} (param "
                    f"group {g}, position {i}, shape {tuple(param.shape)}): {problem}. It was saved for another "
                    "model (or another parameter order); load the matching checkpoint, or skip load_state_dict "
                    "to start the optimizer fresh.",
                    problems=[(f"state[{index}]", problem)],
                )
        position += len(group["params"])


def _mismatch(param: Tensor, entry: Mapping[str, Any], saved_shape: Any, known_layout: bool) -> str | None:
    if saved_shape is not None and tuple(saved_shape) != tuple(param.shape):
        return f"the state was saved for shape {tuple(saved_shape)}"
    for key, value in entry.items():
        if not isinstance(value, Tensor) or value.dim() == 0:
            continue
        if (
            value.shape == param.shape
            and value.is_floating_point() != param.is_floating_point()
            and str(value.dtype).removeprefix("torch.") not in _QUANTISED
        ):
            return f"state {key!r} is {value.dtype} and the parameter {param.dtype} (floating vs integer)"
        # Without a saved shape, torch's own layouts are known: every state tensor
        # of the parameter's rank is its shape or broadcasts to it (Adafactor's factors).
        if saved_shape is None and known_layout and value.dim() == param.dim():
            if any(v not in (p, 1) for v, p in zip(value.shape, param.shape)):
                return f"state {key!r} has shape {tuple(value.shape)}"
    return None

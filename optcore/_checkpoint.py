"""Checkpoints: the contract's ``state_dict``/``load_state_dict`` (and copy and
pickle), and the checks a state dict passes before an optimizer loads it.

torch's ``load_state_dict`` checks only the number of parameters per group, so
state saved for ``Linear(32, 32)`` loads into ``Linear(64, 64)`` and the next
fused step reads past the end of its moments (a segfault), and state for
bigger parameters silently steps smaller ones. Loading one optimizer's state
into another (AdamW's moments into Lion) half-works the same way. These checks
run first and raise a :class:`ConfigError` naming the first parameter at fault,
so a wrong checkpoint changes nothing.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

from torch import Tensor

from ._errors import ConfigError

#: State dtypes that hold quantised floats (bitsandbytes' 8-bit moments), not integers.
_QUANTISED = ("uint8", "int8")


class CheckpointMixin:
    """The contract's checkpoint members; they read ``optcore_spec`` (set by the build)."""

    param_groups: list[dict[str, Any]]
    defaults: dict[str, Any]

    def __getstate__(self) -> dict[str, Any]:
        """Keep every attribute on copy/pickle (torch keeps only ``defaults``,
        ``state`` and ``param_groups``, which breaks classes that store more,
        e.g. LBFGS's ``_params`` or lion-pytorch's ``decoupled_wd``). A ``step``
        patched onto the instance by an LR scheduler stays behind: it is bound
        to this object, and a copy has no scheduler."""
        state = self.__dict__.copy()
        state.pop("step", None)
        return state

    def state_dict(self) -> dict[str, Any]:  # type: ignore[override]
        """torch's state dict, plus ``"optcore": {"name", "provider", "version",
        "param_shapes"}`` when built by optcore: who saved it (so loading it into
        another optimizer is an error) and the shape of every parameter with state
        (so loading it over other parameters is an error, not a crash)."""
        state_dict = super().state_dict()  # type: ignore[misc]
        spec = getattr(self, "optcore_spec", None)
        if spec is None or not isinstance(state_dict, dict) or not isinstance(state_dict.get("param_groups"), list):
            return state_dict
        shapes: dict[int, list[int]] = {}
        for saved, group in zip(state_dict["param_groups"], self.param_groups):
            for index, param in zip(saved.get("params", ()), group["params"]):
                if index in state_dict.get("state", {}):
                    shapes[index] = list(param.shape)
        # a plain str: torch's TorchVersion would not load with weights_only=True
        version = None if spec.version is None else str.__str__(spec.version)
        state_dict["optcore"] = {"name": spec.name, "provider": spec.provider, "version": version, "param_shapes": shapes}
        return state_dict

    def load_state_dict(  # type: ignore[override]
        self,
        state_dict: Mapping[str, Any],
        optimizer_overrides: Mapping[str, Any] | None = None,
    ) -> None:
        """Load ``state_dict`` once it passes the module's checks (another version
        of the same optimizer loads with a warning; a plain torch state dict, with
        no ``"optcore"`` entry, is checked against the parameters only), then replace
        hyper-parameters of every loaded group with ``optimizer_overrides`` (for
        example a new ``lr`` on resume)."""
        state_dict = check_state_dict(self, state_dict)
        super().load_state_dict(state_dict)  # type: ignore[misc]
        if optimizer_overrides:
            known = set(self.defaults) | {k for g in self.param_groups for k in g} - {"params"}
            unknown = sorted(set(optimizer_overrides) - known)
            if unknown:
                raise ConfigError(
                    f"optimizer_overrides has unknown hyper-parameter(s) {unknown}; "
                    f"this optimizer has {sorted(known - {'param_names'})}.",
                    problems=[(k, "unknown hyper-parameter") for k in unknown],
                    accepted=sorted(known),
                )
            for group in self.param_groups:
                for key, value in optimizer_overrides.items():
                    if key == "lr" and group.get("lr_scale", 1.0) != 1.0:
                        value = value * group["lr_scale"]
                    if isinstance(group.get(key), Tensor) and not isinstance(value, Tensor):
                        group[key].fill_(value)
                    else:
                        group[key] = value
            self.defaults.update({k: v for k, v in optimizer_overrides.items() if k in self.defaults})


def check_state_dict(optimizer: Any, state_dict: Mapping[str, Any]) -> Mapping[str, Any]:
    """``state_dict`` without its ``"optcore"`` record, once it is known to fit
    ``optimizer``; raise :class:`ConfigError` otherwise."""
    if not isinstance(state_dict, Mapping):
        return state_dict
    record = state_dict.get("optcore")
    if isinstance(record, Mapping):
        _check_identity(optimizer, record)
        state_dict = {k: v for k, v in state_dict.items() if k != "optcore"}
    else:
        record = {}
    _check_shapes(optimizer, state_dict, record.get("param_shapes"))
    return state_dict


def _check_identity(optimizer: Any, record: Mapping[str, Any]) -> None:
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
        warnings.warn(
            f"This state_dict was saved by {saved} version {record.get('version')}, and this is version "
            f"{spec.version}; it loads because its layout fits the parameters. Check the provider's changelog "
            "if the resumed run behaves differently.",
            UserWarning,
            stacklevel=4,
        )


def _check_shapes(optimizer: Any, state_dict: Mapping[str, Any], saved_shapes: Any) -> None:
    groups, state = state_dict.get("param_groups"), state_dict.get("state")
    if not isinstance(groups, list) or not isinstance(state, Mapping):
        return
    # torch's own classes have known state layouts (see _mismatch)
    known_layout = getattr(type(optimizer), "adapted_from", type(optimizer)).__module__.startswith("torch.optim")
    position = 0
    for g, (saved, group) in enumerate(zip(groups, optimizer.param_groups)):
        for i, (index, param) in enumerate(zip(saved.get("params", ()), group["params"])):
            where = f"parameter {position + i} (param group {g}, position {i}, shape {tuple(param.shape)})"
            entry = state.get(index)
            if isinstance(entry, Mapping):
                shape = saved_shapes.get(index) if isinstance(saved_shapes, Mapping) else None
                problem = _mismatch(param, entry, shape, known_layout)
                if problem:
                    raise ConfigError(
                        f"The state_dict does not fit this optimizer's parameters: {where}: {problem}. "
                        "It was saved for another model (or another parameter order); load the matching "
                        "checkpoint, or skip load_state_dict to start the optimizer fresh.",
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

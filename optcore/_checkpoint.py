"""The contract's ``state_dict``/``load_state_dict`` (and copy and pickle).

torch checks only the number of parameters per group: state for ``Linear(32, 32)``
loads into ``Linear(64, 64)`` and the next fused step reads past its moments (a
segfault). So the saver and the shapes are recorded, and checked before loading.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

from torch import Tensor

from ._errors import ConfigError

#: bitsandbytes' 8-bit moments: quantised floats, not integers.
_QUANTISED = ("uint8", "int8")


class CheckpointMixin:
    """Reads ``optcore_spec``, set by the build."""

    param_groups: list[dict[str, Any]]
    defaults: dict[str, Any]

    def __getstate__(self) -> dict[str, Any]:
        """Every attribute (docs/contract.md) but a ``step`` an LR scheduler bound
        to this object: a copy has no scheduler."""
        state = self.__dict__.copy()
        state.pop("step", None)
        return state

    def state_dict(self) -> dict[str, Any]:  # type: ignore[override]
        """torch's, plus ``"optcore": {"name", "provider", "version", "param_shapes"}``
        when built by optcore (the shapes of the parameters with state)."""
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
        """Another version of the saver loads with a warning; a plain torch state
        dict is checked against the parameters only."""
        if isinstance(state_dict, Mapping):
            record = state_dict.get("optcore")
            if isinstance(record, Mapping):
                _check_identity(self, record)
                state_dict = {k: v for k, v in state_dict.items() if k != "optcore"}
            _check_shapes(self, state_dict, record.get("param_shapes") if isinstance(record, Mapping) else None)
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
            stacklevel=3,
        )


def _check_shapes(optimizer: Any, state_dict: Mapping[str, Any], saved_shapes: Any) -> None:
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

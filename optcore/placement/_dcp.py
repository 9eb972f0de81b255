"""Where optcore's own entries live in a state dict, so that
``torch.distributed.checkpoint`` keeps them, and the identity check they feed.

A state dict made by optcore says which optimizer saved it (``"optcore"``:
name, provider, version, the shapes of the parameters with state).
DCP (``get_optimizer_state_dict``, ``dcp.save``/``dcp.load``) keeps only
``state`` and ``param_groups``, so the record is also written into every saved
param group, with whether the state is DCP's placeholder; an optimizer's
top-level extra entries (AdaScale's ``"adascale"``) go into the first group's
record (``"extra"``). Loading reads them back from there when the top level has
none. The contract calls :func:`add_records` when it saves, :func:`take_records`
and :func:`loaded` when it loads, and :func:`carry` for a subclass's own
``state_dict``/``load_state_dict``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

from .._errors import ConfigError, warn_user
from .._values import clean_text
from . import PLACEHOLDER, check_dcp_layout
from ._dcp_flat import RECORD, flat_record

#: a state dict's sections that are torch's (the rest is the optimizer's own)
TORCH_SECTIONS = ("state", "param_groups")
#: param group entries that say how the step runs, not what it computes: chosen
#: again for the parameters a checkpoint loads into (their device and placement)
IMPLEMENTATION_KEYS = ("fused", "foreach", "compiled", "implementation")


def add_records(optimizer: Any, state_dict: Any) -> Any:
    """torch's ``state_dict`` plus ``"optcore": {"name", "provider", "version",
    "param_shapes"}`` when ``optimizer`` was built by optcore, the record (and
    whether the state is DCP's placeholder, for the next step to start fresh
    after a resume) in each saved group too."""
    spec = getattr(optimizer, "optcore_spec", None)
    if spec is None or not isinstance(state_dict, dict) or not isinstance(state_dict.get("param_groups"), list):
        return state_dict
    shapes: dict[int, list[int]] = {}
    for saved, group in zip(state_dict["param_groups"], optimizer.param_groups):
        for index, param in zip(saved.get("params", ()), group["params"]):
            if index in state_dict.get("state", {}):
                shapes[index] = list(param.shape)
    # a plain str: torch's TorchVersion would not load with weights_only=True
    version = None if spec.version is None else str.__str__(spec.version)
    record = dict(name=spec.name, provider=spec.provider, version=version)
    state_dict[RECORD] = dict(record, param_shapes=shapes)
    fresh = bool(optimizer.__dict__.get(PLACEHOLDER, False))
    for saved in state_dict["param_groups"]:
        saved[RECORD] = dict(record, fresh=fresh)
    return state_dict


def take_records(optimizer: Any, state_dict: Mapping[str, Any]) -> tuple[Any, Mapping[str, Any] | None, dict[str, Any]]:
    """(the record, the first group's record, ``state_dict`` without records)
    after checking the record names ``optimizer``'s saver. Each saved group gets
    this optimizer's implementation choice (``fused``, ``foreach``, a plugin's
    ``compiled`` or ``implementation``): the plan made it for the parameters as
    they are now placed, which a checkpoint from one process may not fit (fused
    kernels have no DTensor rules)."""
    in_groups = group_record(state_dict)
    record = state_dict.get(RECORD, in_groups)
    if isinstance(record, Mapping):
        check_identity(optimizer, record)
    stripped = {k: v for k, v in state_dict.items() if k != RECORD}
    groups = stripped.get("param_groups")
    if isinstance(groups, list) and all(isinstance(g, Mapping) for g in groups):
        live = optimizer.param_groups if len(optimizer.param_groups) == len(groups) else [{}] * len(groups)
        stripped["param_groups"] = [
            {**{k: v for k, v in saved.items() if k != RECORD}, **{k: g[k] for k in IMPLEMENTATION_KEYS if k in g}}
            for saved, g in zip(groups, live)
        ]
    return record, in_groups, stripped


def loaded(optimizer: Any, record: Mapping[str, Any] | None) -> None:
    """After a load: the state is the checkpoint's, not DCP's placeholder, unless
    the checkpoint was saved before any step (then the next step starts fresh)."""
    optimizer.__dict__.pop(PLACEHOLDER, None)
    if record is not None and record.get("fresh") is True:
        optimizer.__dict__[PLACEHOLDER] = True


def check_identity(optimizer: Any, record: Mapping[str, Any]) -> None:
    spec = getattr(optimizer, "optcore_spec", None)
    if spec is None:  # made by adapt() directly (ZeroRedundancyOptimizer's shards): no name to compare
        return
    name, provider, version = (clean_text(record.get(k), 80) for k in ("name", "provider", "version"))
    saved = f"{name} from {provider}"
    if (record.get("name"), record.get("provider")) != (spec.name, spec.provider):
        raise ConfigError(
            f"This state_dict was saved by {saved} {version if record.get('version') else ''}".rstrip()
            + f", and this optimizer is {spec.name} from {spec.provider}: one optimizer's state means nothing "
            f"to another. Build the optimizer that saved it (type {provider}:{name}) "
            "to resume, or skip load_state_dict to start this one fresh.",
            problems=[("optcore", f"saved by {saved}, loading into {spec.qualified}")],
        )
    if record.get("version") != (None if spec.version is None else str(spec.version)):
        warn_user(
            f"This state_dict was saved by {saved} version {version}, and this is version "
            f"{spec.version}; it loads because its layout fits the parameters. Check the provider's changelog "
            "if the resumed run behaves differently.", UserWarning)


def group_record(state_dict: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The record in the first saved param group, if there is one."""
    groups = state_dict.get("param_groups")
    if isinstance(groups, list) and groups and isinstance(groups[0], Mapping):
        record = groups[0].get(RECORD) or flat_record()  # DCP's flattened dicts lose it on the way
        return record if isinstance(record, Mapping) else None
    return None


def carry_extras(state_dict: Any) -> Any:
    """``state_dict`` with its top-level entries besides ``state``,
    ``param_groups`` and the record copied into the first group's record
    (where DCP keeps them); unchanged without a group record."""
    if not isinstance(state_dict, dict) or group_record(state_dict) is None:
        return state_dict
    extra = {k: v for k, v in state_dict.items() if k not in (*TORCH_SECTIONS, RECORD)}
    if extra:
        first = state_dict["param_groups"][0]
        first[RECORD] = {**first[RECORD], "extra": extra}
    return state_dict


def lift_extras(state_dict: Any) -> Any:
    """``state_dict`` with the extra entries of its first group's record at the
    top level where it has none (a state dict that went through DCP)."""
    if not isinstance(state_dict, Mapping):
        return state_dict
    record = group_record(state_dict)
    extra = record.get("extra") if record is not None else None
    if not isinstance(extra, Mapping) or all(k in state_dict for k in extra):
        return state_dict
    return {**{k: v for k, v in extra.items() if k not in (*TORCH_SECTIONS, RECORD)}, **state_dict}


def carry(cls: type) -> None:
    """A class's own ``state_dict`` and ``load_state_dict`` (AdaScale's
    estimates, a wrapper's) wrapped so its extra entries travel in the first
    group's record and come back from it."""
    for name, wrap in (("state_dict", _carrying), ("load_state_dict", _lifting)):
        own = vars(cls).get(name)
        if own is not None and not hasattr(own, "__optcore_carried__"):
            setattr(cls, name, wrap(own))


def _carrying(state_dict: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(state_dict)
    def carrying(self: Any) -> Any:
        saved = carry_extras(state_dict(self))
        if type(self).state_dict is carrying:  # the class's own, not a base class's called by it
            check_dcp_layout(self, saved)
        if self.__dict__.get(PLACEHOLDER, False) and group_record(saved) is not None:
            for group in saved["param_groups"]:  # a wrapper's placeholder state is its inner optimizer's
                group[RECORD] = {**group[RECORD], "fresh": True}
        return saved

    carrying.__optcore_carried__ = True  # type: ignore[attr-defined]
    return carrying


def _lifting(load_state_dict: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(load_state_dict)
    def lifting(self: Any, state_dict: Any, *args: Any, **kwargs: Any) -> Any:
        record = group_record(state_dict) if isinstance(state_dict, Mapping) else None
        result = load_state_dict(self, lift_extras(state_dict), *args, **kwargs)
        loaded(self, record)
        return result

    lifting.__optcore_carried__ = True  # type: ignore[attr-defined]
    return lifting

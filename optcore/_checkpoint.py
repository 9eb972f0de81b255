"""The checks a state dict gets before it loads into an optimizer, and where
optcore's own entries live in it.

torch checks only the number of parameters per group, so state for
``Linear(32, 32)`` loads into ``Linear(64, 64)`` and a fused step reads past
it; a state dict made by optcore also says which optimizer saved it. The
tensors are judged by :mod:`optcore.guards` against the live parameters.

``torch.distributed.checkpoint`` (DCP: ``get_optimizer_state_dict``,
``dcp.save``/``dcp.load``) keeps only ``state`` and ``param_groups``, so the
identity record is also written into every saved param group (``"optcore"``),
and an optimizer's top-level extra entries (AdaScale's ``"adascale"``) into
the first group's record (``"extra"``); loading reads them back from there
when the top level has none.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

#: the key of optcore's record, at the top level and in each saved param group
RECORD = "optcore"
#: a state dict's sections that are torch's (the rest is the optimizer's own)
TORCH_SECTIONS = ("state", "param_groups")
#: param group entries that say how the step runs, not what it computes: chosen
#: again for the parameters a checkpoint loads into (their device and placement)
IMPLEMENTATION_KEYS = ("fused", "foreach", "compiled", "implementation")

from ._errors import ConfigError, warn_user
from .placement import flat_record
from ._values import clean_text


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

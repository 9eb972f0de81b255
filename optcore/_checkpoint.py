"""The checks a state dict gets before it loads into an optimizer.

torch checks only the number of parameters per group, so state for
``Linear(32, 32)`` loads into ``Linear(64, 64)`` and a fused step reads past
it; a state dict made by optcore also says which optimizer saved it. The
tensors are judged by :mod:`optcore.guards` against the live parameters.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ._errors import ConfigError, warn_user
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


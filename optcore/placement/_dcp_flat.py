"""optcore's records through DCP's flattened optimizer state dicts.

``StateDictOptions(flatten_optimizer_state_dict=True)`` (torchtitan's choice)
files each param group entry under every parameter's name
(``param_groups.<fqn>.<key>``), so the identity record each saved group
carries (``"optcore"``, with a plugin's extra state such as AdaScale's
estimator) is saved. On load, ``_unflatten_optim_state_dict`` rebuilds the
groups from the keys the *live* groups have, and the live groups never have a
record: the identity check and the extra state would be skipped without a
word. :func:`flat_record` finds the first group's record (identity and extra
state) in the flattened dict ``set_optimizer_state_dict`` was given, where
``optcore._checkpoint`` looks for it when the groups it loads have none.
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Mapping
from typing import Any

#: the key of optcore's record, at the top level and in each saved param group
RECORD = "optcore"


def flat_record() -> Mapping[str, Any] | None:
    """Inside DCP's ``set_optimizer_state_dict`` with a flattened state dict:
    the record saved with the first param group of the optimizer it loads
    (``param_groups.<fqn>.optcore`` of that group's first parameter), which
    the unflattened dict handed to ``load_state_dict`` lacks; else ``None``."""
    frame = frame_of(dcp_code("_load_optim_state_dict"), start=0)
    if frame is None:
        return None
    info, flat, optim = (frame.f_locals.get(k) for k in ("info", "state_dict", "optim"))
    mapping = getattr(info, "fqn_param_mapping", None)
    if not getattr(info, "flatten_optimizer_state_dict", False) or not isinstance(flat, Mapping) or mapping is None:
        return None
    groups = getattr(optim, "param_groups", None) or [{"params": ()}]
    for p in groups[0]["params"]:
        for fqn in mapping.get(p, ()):
            record = flat.get(f"param_groups.{fqn}.{RECORD}")
            if isinstance(record, Mapping):
                return record
    return None


def dcp_code(name: str) -> Any:
    """The code object of ``torch.distributed.checkpoint.state_dict``'s function
    ``name`` (``None`` before DCP is imported). torch wraps some of them in
    ``torch.no_grad()``, whose wrapper code every no_grad-decorated function
    shares: the frame to look for runs the function's own code."""
    function = getattr(sys.modules.get("torch.distributed.checkpoint.state_dict"), name, None)
    return getattr(inspect.unwrap(function), "__code__", None) if function is not None else None


def frame_of(code: Any, start: int, depth: int = 12) -> Any:
    """The frame running ``code`` among ``depth`` frames from ``start`` frames
    above the caller (0: the caller itself), or ``None``."""
    frame = sys._getframe(start + 1)
    for _ in range(depth):
        if frame is None or code is None:
            return None
        if frame.f_code is code:
            return frame
        frame = frame.f_back
    return None

"""The precision keys of an optimizer config, read and written in one place.

The dtype the parameters need comes from the build plan
(:attr:`optcore.BuildPlan.param_dtype`); ``--precision`` on the command line
is written as the fp16 plugin's shorthand keys (``precision``,
``memory_efficient``), which the plugin rewrites into its wrapper form.
"""

from __future__ import annotations

from typing import Any

import torch

from optcore import OptcoreError, plan

from .._config import typed_config

def param_dtype(optimizer_cfg: Any) -> torch.dtype | None:
    """The dtype the model must be converted to before building ``optimizer_cfg``
    (a precision wrapper steps half-precision parameters), or None: what the
    build plan says, so compare knows no precision vocabulary of its own."""
    try:
        return plan(optimizer_cfg).param_dtype
    except OptcoreError:
        return None  # the build reports a bad config with its own message


def with_precision(optimizer_cfg: Any, precision: str, memory_efficient: bool = False) -> dict[str, Any]:
    """``optimizer_cfg`` trained in ``precision`` ("fp32", "bf16", "fp16"): the
    half precisions through the precision wrapper (fp32 master copies unless
    ``memory_efficient``)."""
    cfg = typed_config(optimizer_cfg)
    if precision != "fp32":
        cfg["precision"] = precision
        if memory_efficient:
            cfg["memory_efficient"] = True
    return cfg

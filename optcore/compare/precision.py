"""The precision keys of an optimizer config, read and written in one place.

``precision`` / ``memory_efficient`` select the fp16/bf16 wrappers of the
optcore-fp16 plugin; the model's parameters must be converted to that half
dtype before the optimizer is built. (The plugin owns this vocabulary; these
two functions are all of compare's knowledge of it.)
"""

from __future__ import annotations

from typing import Any

import torch

from optcore import resolve

from .._config import optimizer_config

_HALF = {"fp16": torch.float16, "float16": torch.float16, "bf16": torch.bfloat16, "bfloat16": torch.bfloat16}


def param_dtype(optimizer_cfg: Any) -> torch.dtype | None:
    """The half dtype the model must be converted to before building
    ``optimizer_cfg`` (precision wrappers step half-precision parameters), or None."""
    try:
        cfg = optimizer_config(optimizer_cfg)
        precision = cfg.get("precision")
        if precision is None:
            spec = resolve(cfg["type"])
            if spec.is_wrapper and "precision" in spec.schema.model_fields:
                precision = spec.schema.model_fields["precision"].default
    except Exception:  # noqa: BLE001 - the build reports a bad config with its own message
        return None
    return _HALF.get(str(precision).lower())


def with_precision(optimizer_cfg: Any, precision: str, memory_efficient: bool = False) -> dict[str, Any]:
    """``optimizer_cfg`` trained in ``precision`` ("fp32", "bf16", "fp16"): the
    half precisions through the precision wrapper (fp32 master copies unless
    ``memory_efficient``)."""
    cfg = optimizer_config(optimizer_cfg)
    if precision != "fp32":
        cfg["precision"] = precision
        if memory_efficient:
            cfg["memory_efficient"] = True
    return cfg

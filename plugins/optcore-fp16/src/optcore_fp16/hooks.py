"""The precision shorthand, as a config rewrite (hook ``optcore_rewrite_config``).

``{"type": "AdamW", "lr": 3e-4, "precision": "fp16", "memory_efficient": false,
"loss_scaler": {...}}`` becomes the wrapper form
``{"type": "optcore-fp16:FP16Optimizer", "optimizer": {"type": "AdamW", "lr": 3e-4},
"precision": "fp16", "loss_scaler": {...}}`` before the core resolves anything,
so the shorthand and the wrapper form are one road, and the precision
vocabulary lives here only (:class:`~optcore_fp16.schemas.PrecisionOptions`).
"""

from __future__ import annotations

from typing import Any

from optcore import ConfigError
from optcore.plugin import hookimpl, validate_hparams

from .schemas import PrecisionOptions

#: The shorthand keys this plugin owns in an optimizer config.
KEYS = tuple(PrecisionOptions.model_fields)
_DISTRIBUTION = "optcore-fp16"


@hookimpl
def optcore_rewrite_config(config: dict[str, Any]) -> dict[str, Any] | None:
    """The wrapper form of a config with precision keys; ``None`` without them."""
    given = {k: config[k] for k in KEYS if k in config}
    if not given:
        return None
    if "optimizer" in config:
        return None  # the wrapper form (API.md): precision and loss_scaler are the wrapper's own options
    name = str(config.get("type"))
    rest = {k: v for k, v in config.items() if k not in KEYS}
    opts = validate_hparams(PrecisionOptions, {k: v for k, v in given.items() if v is not None}, f"{name} (precision options)")
    precision = opts["precision"]
    if precision in (None, "fp32"):
        stray = [k for k in ("memory_efficient", "loss_scaler") if given.get(k) not in (None, False)]
        if stray:
            raise ConfigError(
                f"{name}: {' and '.join(stray)} only apply to half-precision training; add "
                "precision='fp16' (or 'bf16'), or remove them.",
                problems=[(k, "needs precision fp16 or bf16") for k in stray],
                target=name,
            )
        return rest
    wrapper = "MemoryEfficientFP16Optimizer" if opts["memory_efficient"] else "FP16Optimizer"
    out: dict[str, Any] = {"type": f"{_DISTRIBUTION}:{wrapper}", "optimizer": rest, "precision": precision}
    if given.get("loss_scaler") is not None:
        out["loss_scaler"] = given["loss_scaler"]
    return out


@hookimpl
def optcore_config_keys() -> dict[str, Any]:
    """JSON Schema of the shorthand keys (an object schema), for exported config-file schemas."""
    return PrecisionOptions.model_json_schema()


"""Every accepted spelling of a config (a mapping, a pydantic model, a Hydra
``DictConfig``, a type name, ``{"optimizer": {...}}``), turned into one plain dict.
Files are the applications' to read (:mod:`optcore.files`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ._errors import ConfigError
from ._literals import parse_optim_args


def to_plain(config: Any) -> Any:
    """DictConfig and pydantic models, recursively, as dicts and lists."""
    if type(config).__module__.startswith("omegaconf"):
        from omegaconf import OmegaConf

        return OmegaConf.to_container(config, resolve=True)
    if hasattr(config, "model_dump") and callable(config.model_dump):
        return config.model_dump(exclude_none=False)
    if isinstance(config, Mapping):
        return {str(k): to_plain(v) for k, v in config.items()}
    if isinstance(config, (list, tuple)):
        return type(config)(to_plain(v) for v in config) if isinstance(config, tuple) else [to_plain(v) for v in config]
    return config


def typed_config(
    config: Any, what: str = "optimizer", nested: tuple[str, ...] = ("optimizer",), example: str = "{'type': 'AdamW', 'lr': 3e-4}"
) -> dict[str, Any]:
    """``config`` as a fresh dict with a ``type`` key; a mapping without one is
    unwrapped at one of the ``nested`` keys (``{"lr_scheduler": {...}}``)."""
    if isinstance(config, (str, type)) or (
        callable(config) and not isinstance(config, Mapping) and not hasattr(config, "model_dump")
    ):
        return {"type": config}
    plain = to_plain(config)
    if not isinstance(plain, Mapping):
        raise ConfigError(
            f"An {what} config must be a mapping with a 'type' key (or a type name), got "
            f"{type(config).__name__}: {config!r}.",
            problems=[("<config>", "not a mapping")],
        )
    plain = dict(plain)
    if "type" not in plain:
        for key in nested:
            if isinstance(plain.get(key), (Mapping, str)):
                return typed_config(plain[key], what, nested, example)
        raise ConfigError(
            f"The {what} config has no 'type' key: say which {what} to build, e.g. "
            f"{example}. Keys given: {sorted(plain)}.",
            problems=[("type", "missing")],
        )
    return plain


def merge_kwargs(cfg: dict[str, Any], key: str) -> None:
    """Pop ``cfg[key]`` (an ``optim_args`` string or a mapping) into ``cfg``."""
    extra = cfg.pop(key, None)
    if not extra:
        return
    if isinstance(extra, str):
        extra = parse_optim_args(extra)
    elif isinstance(extra, Mapping):
        extra = dict(to_plain(extra))
    else:
        raise ConfigError(
            f"{key} must be a 'key=value, ...' string or a mapping, got {extra!r}.",
            problems=[(key, "bad type")],
        )
    clash = sorted(set(extra) & set(cfg))
    if clash:
        raise ConfigError(
            f"{clash} given both in {key} and as keys of the config; keep one.",
            problems=[(k, "given twice") for k in clash],
        )
    cfg.update(extra)


"""Every accepted spelling of a config, turned into one plain dict.

Accepted: a mapping, a pydantic model, an OmegaConf/Hydra ``DictConfig``, a
plain string (the type name), and the nested form ``{"optimizer": {...}}``.
Files (JSON, YAML, TOML) are read by :func:`load_config_file`. Nothing is ever
``eval``-ed.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ._errors import ConfigError

#: Keys of an optimizer config that the core interprets instead of the schema.
WRAPPER_KEYS = ("precision", "memory_efficient", "loss_scaler")
BUILD_KEYS = ("type", "param_groups", "optim_args", "no_decay")


def to_plain(config: Any) -> Any:
    """Recursively convert DictConfig / pydantic models into dicts and lists."""
    cls = type(config)
    if cls.__module__.startswith("omegaconf"):
        from omegaconf import OmegaConf

        return OmegaConf.to_container(config, resolve=True)
    if hasattr(config, "model_dump") and callable(config.model_dump):
        return config.model_dump(exclude_none=False)
    if isinstance(config, Mapping):
        return {str(k): to_plain(v) for k, v in config.items()}
    if isinstance(config, (list, tuple)) and not isinstance(config, str):
        return type(config)(to_plain(v) for v in config) if isinstance(config, tuple) else [to_plain(v) for v in config]
    return config


def optimizer_config(config: Any, what: str = "optimizer") -> dict[str, Any]:
    """The optimizer config as a fresh dict with a ``type`` key."""
    if isinstance(config, str) or isinstance(config, type) or callable(config) and not isinstance(config, Mapping) and not hasattr(config, "model_dump"):
        return {"type": config}
    plain = to_plain(config)
    if not isinstance(plain, Mapping):
        raise ConfigError(
            f"An {what} config must be a mapping with a 'type' key (or a type name), got "
            f"{type(config).__name__}: {config!r}.",
            problems=[("<config>", "not a mapping")],
        )
    plain = dict(plain)
    if "type" not in plain and what in plain and isinstance(plain[what], (Mapping, str)):
        return optimizer_config(plain[what], what)
    if "type" not in plain:
        raise ConfigError(
            f"The {what} config has no 'type' key: say which {what} to build, e.g. "
            f"{{'type': 'AdamW', 'lr': 3e-4}}. Keys given: {sorted(plain)}.",
            problems=[("type", "missing")],
        )
    return plain


def load_config_file(path: str | Path) -> Any:
    """Read a JSON, YAML or TOML file into plain Python data."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"Cannot read config file {str(path)!r}: {exc.strerror or exc}.") from None
    suffix = path.suffix.lower()
    try:
        if suffix == ".json":
            return json.loads(text)
        if suffix in (".yaml", ".yml"):
            import yaml

            return yaml.safe_load(text)
        if suffix == ".toml":
            import tomllib

            return tomllib.loads(text)
    except Exception as exc:  # parse errors of any of the three formats
        raise ConfigError(f"Cannot parse {str(path)!r}: {exc}") from None
    raise ConfigError(f"Unknown config file type {suffix!r} for {str(path)!r}: use .json, .yaml/.yml or .toml.")

"""Every accepted spelling of a config (a mapping, a pydantic model, a Hydra
``DictConfig``, a type name, ``{"optimizer": {...}}``, a plugin's shorthand),
turned into plain dicts. Files are the applications' to read (:mod:`optcore.files`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ._errors import ConfigError
from ._literals import parse_optim_args
from ._values import as_flag, short_repr
from .guards import check_nesting
from .layerwise import layer_decay_value


def to_plain(config: Any) -> Any:
    """DictConfig and pydantic models, recursively, as dicts and lists; within
    the limits of config files (:func:`optcore.guards.check_nesting`)."""
    check_nesting(config)
    return _plain(config)


def _plain(config: Any) -> Any:
    if type(config).__module__.startswith("omegaconf"):
        from omegaconf import OmegaConf

        return _converted(lambda: OmegaConf.to_container(config, resolve=True))
    if hasattr(config, "model_dump") and callable(config.model_dump):
        return _converted(lambda: config.model_dump(exclude_none=False))
    if isinstance(config, Mapping):
        return {str(k): _plain(v) for k, v in config.items()}
    if isinstance(config, (list, tuple)):
        return type(config)(_plain(v) for v in config) if isinstance(config, tuple) else [_plain(v) for v in config]
    return config


def _converted(convert: Any) -> Any:
    try:
        plain = convert()
    except RecursionError:
        raise ConfigError("The config nests too deep to convert to plain data.", problems=[("<config>", "nested too deep")]) from None
    check_nesting(plain)
    return plain


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



#: Keys about the parameters, not the optimizer: a wrapper hands them inward.
PARAM_KEYS = ("param_groups", "no_decay", "layer_decay", "optim_args")
MAX_CHAIN = 8


def chain(config: Any, rewrite_hook: Any = None) -> list[dict[str, Any]]:
    """The configs of the optimizers ``config`` describes, outermost wrapper
    first: each after the hook plugins' rewrites (``rewrite_hook``: pluggy's
    ``optcore_rewrite_config`` caller), a wrapper's ``optimizer`` (API.md: a
    mapping with both ``type`` and ``optimizer`` is a wrapper) unpacked into the
    next, the parameter keys handed to the innermost, its ``optim_args`` merged."""
    links = [_rewritten(typed_config(config), rewrite_hook)]
    while "optimizer" in links[-1]:
        if len(links) == MAX_CHAIN:
            raise ConfigError(
                f"The config nests wrappers more than {MAX_CHAIN} deep; if you did not write that, a hook plugin "
                f"rewrites its own output (chain: {[link['type'] for link in links]}).",
                problems=[("optimizer", "nested too deep")],
            )
        outer = links[-1]
        inner = _rewritten(typed_config(outer.pop("optimizer")), rewrite_hook)
        for key in PARAM_KEYS:
            if key in outer and key in inner:
                raise ConfigError(
                    f"{key!r} is given both on {getattr(outer['type'], '__name__', outer['type'])} and on its "
                    "inner optimizer; keep one.",
                    problems=[(key, "given twice")],
                )
            if key in outer:
                inner[key] = outer.pop(key)
        links.append(inner)
    merge_kwargs(links[-1], "optim_args")
    if "no_decay" in links[-1]:
        links[-1]["no_decay"] = no_decay_flag(links[-1]["no_decay"])
    if links[-1].get("layer_decay") is not None:
        links[-1]["layer_decay"] = layer_decay_value(links[-1]["layer_decay"])
    if "param_groups" in links[-1]:
        links[-1]["param_groups"] = _group_list(links[-1]["param_groups"])
    return links


def _group_list(value: Any) -> list[Any]:
    """``param_groups`` as a list of mappings (``None``: none); the entries' keys are :mod:`._group_rules`'."""
    if value is None:
        return []
    if isinstance(value, (list, tuple)) and all(isinstance(g, Mapping) for g in value):
        return list(value)
    raise ConfigError(
        "param_groups must be a list of {'params': '<regex over parameter names>', <hyper-parameter>: <value>} "
        f"mappings, got {short_repr(value)}.",
        problems=[("param_groups", "not a list of mappings")],
    )


def no_decay_flag(value: Any) -> bool:
    """Never judged by truthiness: ``"false"`` is false."""
    try:
        return as_flag(value, "no_decay")
    except ValueError as exc:
        raise ConfigError(
            f"{exc}: it says whether biases and normalisation weights get weight_decay=0 (default true).",
            problems=[("no_decay", "must be true or false")],
        ) from None


def _rewritten(config: dict[str, Any], hook: Any) -> dict[str, Any]:
    """``config`` after each ``optcore_rewrite_config`` plugin had its turn, seeing the previous one's result."""
    for impl in reversed(hook.get_hookimpls() if hook is not None else []):  # pluggy's order: last registered first
        result = impl.function(**({"config": config} if "config" in impl.argnames else {}))
        if result is None:
            continue
        if not isinstance(result, dict) or "type" not in result:
            raise ConfigError(
                f"Hook plugin {impl.plugin_name!r} rewrote the config into {result!r}, which is not an optimizer "
                "config (a dict with 'type'); report this to the plugin's authors."
            )
        config = result
    return config

"""Param groups from a model or tensors. Each named parameter gets, weakest
first: the no-decay default (API.md), ``layer_decay`` (:mod:`.layerwise`), hook
plugins' policies, the config's regex ``param_groups`` (:mod:`._group_rules`); equal overrides share a group.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch import Tensor, nn

from ._config import no_decay_flag
from ._errors import ConfigError
from ._group_rules import lr_scale_value, match
from .layerwise import assign_layers, refuse_ungroupable

_NORM_TYPES: tuple[type, ...] = (
    nn.modules.normalization.LayerNorm,
    nn.modules.normalization.GroupNorm,
    nn.modules.batchnorm._NormBase,
    nn.modules.normalization.LocalResponseNorm,
) + ((nn.RMSNorm,) if hasattr(nn, "RMSNorm") else ())


def _no_decay_names(model: nn.Module) -> set[str]:
    """Custom norms (LlamaRMSNorm, T5LayerNorm, ...) are known by their class name."""
    return {
        f"{module_name}.{name}" if module_name else name
        for module_name, module in model.named_modules()
        for name, _ in module.named_parameters(recurse=False)
        if name == "bias"
        or name.endswith("_bias")
        or isinstance(module, _NORM_TYPES)
        or "norm" in type(module).__name__.lower()
    }


def _no_decay_by_name(name: str) -> bool:
    """The same judgement from a name alone (a dict of name -> tensor)."""
    parts = name.lower().split(".")
    return parts[-1] == "bias" or any("norm" in p or p in {"ln", "ln_f"} or p.startswith("ln_") for p in parts[:-1])


def _named_params(params_or_model: Any, leaf_only: bool = True) -> tuple[list[tuple[Any, Tensor]], set[str] | None]:
    """(named trainable tensors, names not to decay or None when unnamed)."""
    if isinstance(params_or_model, nn.Module):
        named = [(n, p) for n, p in params_or_model.named_parameters() if p.requires_grad]
        return named, _no_decay_names(params_or_model)
    if isinstance(params_or_model, Tensor):
        params_or_model = [params_or_model]
    if isinstance(params_or_model, Mapping):
        items = list(params_or_model.items())
        for name, p in items:
            _check_tensor(p, f"params[{name!r}]", leaf_only)
        named = [(str(n), p) for n, p in items if p.requires_grad]
        return named, {n for n, _ in named if _no_decay_by_name(n)}
    try:
        items = list(params_or_model)
    except TypeError:
        raise ConfigError(
            f"Cannot build an optimizer over a {type(params_or_model).__name__}: pass an nn.Module, an "
            "iterable of tensors, a list of param-group dicts, or a dict of name -> tensor."
        ) from None
    if items and all(isinstance(i, tuple) and len(i) == 2 and isinstance(i[0], str) for i in items):
        return _named_params(dict(items), leaf_only)
    for i, p in enumerate(items):
        _check_tensor(p, f"params[{i}]", leaf_only)
    return [(None, p) for p in items if p.requires_grad], None


def _check_tensor(p: Any, where: str, leaf_only: bool = True) -> None:
    if not isinstance(p, Tensor):
        raise ConfigError(
            f"{where} is a {type(p).__name__}, not a tensor; pass model.parameters(), a model, "
            "or param-group dicts with 'params' lists of tensors.",
            problems=[(where, "not a tensor")],
        )
    if leaf_only and not (p.is_leaf or p.retains_grad):
        raise ConfigError(
            f"{where} is not a leaf tensor; optimizers update leaf tensors (detach it first), or non-leaf "
            "ones that retain their grad with differentiable=True (autograd through the step, as torch allows)."
        )


def _dedup(named: list[tuple[str | None, Tensor]]) -> list[tuple[str | None, Tensor]]:
    """Each tensor once, under its first name (a tied weight is one parameter)."""
    first: dict[int, tuple[str | None, Tensor]] = {}
    for n, p in named:
        first.setdefault(id(p), (n, p))
    return list(first.values())


def build_param_groups(
    params_or_model: Any,
    param_groups: list[Mapping[str, Any]] | None = None,
    *,
    weight_decay: float | None = None,
    no_decay: Any = True,
    policies: list[Mapping[str, Any]] | None = None,
    leaf_only: bool = True,
    rules: tuple[tuple[str, object, str], ...] = (),
    owner: str = "",
    layer_decay: float | None = None,
) -> list[dict[str, Any]]:
    """``weight_decay`` is the optimizer's: no no-decay group unless it is
    non-zero. ``leaf_only=False`` is for ``differentiable=True``. ``rules``: what
    the class ``owner`` takes of each parameter (``_torch_facts.PARAM_RULES``); ``layer_decay``: :mod:`.layerwise`."""
    if isinstance(params_or_model, (list, tuple)) and params_or_model and all(
        isinstance(g, Mapping) for g in params_or_model
    ):
        if param_groups:
            raise ConfigError("Give either explicit param-group dicts or regex 'param_groups' in the config, not both.")
        if layer_decay is not None:
            refuse_ungroupable(explicit_groups=True)
        groups = []
        for i, group in enumerate(params_or_model):
            if "params" not in group:
                raise ConfigError(
                    f"param group {i} has no 'params' key.", problems=[(f"param_groups[{i}]", "no params")]
                )
            settings = {k: v for k, v in group.items() if k != "params"}
            if "lr_scale" in settings:
                settings["lr_scale"] = lr_scale_value(settings["lr_scale"], f"param group {i} lr_scale")
            tensors = [p for _, p in _dedup(_named_params(group["params"], leaf_only)[0])]
            if tensors:
                groups.append({**settings, "params": tensors})
        if not groups:
            raise ConfigError("No trainable parameters: every parameter has requires_grad=False.")
        check_param_rules(owner, rules, groups, params_or_model)
        return groups

    named, no_decay_names = _named_params(params_or_model, leaf_only)
    named = _dedup(named)
    if not named:
        raise ConfigError(
            "No trainable parameters: the model or list is empty, or every parameter has requires_grad=False."
        )
    if (param_groups or policies) and no_decay_names is None:
        raise ConfigError(
            "'param_groups' select parameters by name, but the parameters were given without names; "
            "pass the model (nn.Module) or a dict of name -> tensor."
        )
    layered = assign_layers(params_or_model, named, layer_decay, no_decay_names is not None) if layer_decay else None
    no_decay_names = set(layered.no_decay) if layered and layered.no_decay is not None else no_decay_names  # timm's rule
    no_decay = no_decay if isinstance(no_decay, bool) else no_decay_flag(no_decay)  # a plan parsed it already
    decay_split = bool(no_decay and weight_decay and no_decay_names is not None)
    names = [n for n, _ in named if n is not None]
    per_name = match(names, list(param_groups or []), list(policies or [])) if names else [{} for _ in named]
    buckets: dict[tuple[Any, ...], dict[str, Any]] = {}
    for (name, p), matched in zip(named, per_name):
        no_decay_here = decay_split and name in no_decay_names  # type: ignore[operator]
        overrides: dict[str, Any] = {"weight_decay": 0.0} if no_decay_here else {}
        if layered is not None:
            overrides.update(layered.overrides(name, bool(no_decay) and name in no_decay_names))  # type: ignore[operator,arg-type]
        overrides.update(matched)
        key = tuple(sorted((k, _hashable(v)) for k, v in overrides.items()))
        buckets.setdefault(key, {"overrides": overrides, "params": []})["params"].append(p)

    groups = []
    taken = {b["overrides"]["name"] for b in buckets.values() if "name" in b["overrides"]}
    split = {(): "decay", (("weight_decay", 0.0),): "no_decay"} if decay_split else {}
    for i, (key, bucket) in enumerate(buckets.items()):
        group = {**bucket["overrides"], "params": bucket["params"]}
        if "name" not in group and len(buckets) > 1:  # unique: not a name the config gave, nor another default
            wanted = (split.get(key), f"group{i}", *(f"group{i}_{k}" for k in range(len(taken))))
            group["name"] = next(n for n in wanted if n is not None and n not in taken)
            taken.add(group["name"])
        groups.append(group)
    check_param_rules(owner, rules, groups, params_or_model)
    return groups


def _hashable(v: Any) -> Any:
    if isinstance(v, list):
        return tuple(_hashable(x) for x in v)
    if isinstance(v, dict):
        return tuple(sorted((k, _hashable(x)) for k, x in v.items()))
    return v


def check_param_rules(owner: str, rules: Any, groups: list[dict[str, Any]], params_or_model: Any) -> None:
    """Refuse by name the parameters that break what ``owner`` takes of each one, before its constructor would."""
    order = {id(p): (i, p) for i, p in enumerate(p for g in groups for p in g["params"])}
    broken = [(text, [p for _, p in order.values() if _value(p, attr) != wanted]) for attr, wanted, text in rules]
    if not (broken := [(text, bad) for text, bad in broken if bad]):
        return
    named = params_or_model if isinstance(params_or_model, (nn.Module, Mapping)) else {}
    names = {id(p): repr(n) for n, p in _named_params(named, False)[0]}

    def shown(p: Tensor) -> str:
        return f"{names.get(id(p), f'#{order[id(p)][0]}')} ({str(p.dtype)[6:]}, shape {tuple(p.shape)})"

    lines = [f"{len(bad)} of the {len(order)} parameters break{'s' * (len(bad) == 1)} '{text}': "
             + ", ".join(map(shown, bad[:8])) + f", and {len(bad) - 8} more" * (len(bad) > 8) for text, bad in broken]
    raise ConfigError(
        f"{owner} takes {'; '.join(t for t, _ in broken)}: a constraint on the parameters it is given, not on a "
        "hyper-parameter value.\n" + "\n".join(lines) + f"\nGive {owner} only the parameters it takes and put the "
        f"others in another optimizer (e.g. AdamW), or leave them out. `optcore show {owner}` lists what it takes.",
        problems=[("params", f"{len(bad)} break '{text}'") for text, bad in broken], target=owner,
    )


def _value(p: Tensor, attr: str) -> Any:
    value = getattr(p, attr)
    return value() if callable(value) else value

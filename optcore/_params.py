"""Turning a model (or tensors) into param groups.

Policies are applied to every named parameter from weakest to strongest: the
no-decay default (biases and normalisation weights get ``weight_decay=0``, as
the Hugging Face Trainer does), then policies contributed by hook plugins, then
the config's own ``param_groups`` (regexes over parameter names). Parameters
with the same resulting overrides share a group, in order of first appearance.
A parameter matched by two of the config's regexes is an error, not a silent
pick, and so is a regex that matches no trainable parameter (a typo or a
config written for another model would otherwise change nothing, silently);
a group marked ``"optional": true`` may match nothing.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

import torch
from torch import Tensor, nn

from ._errors import ConfigError
from ._values import as_finite, as_flag, short_repr

#: Keys a param-group override may carry besides hyper-parameters.
GROUP_META_KEYS = frozenset({"name", "lr_scale", "params"})
#: Keys of a ``param_groups`` regex entry that only steer the matching.
MATCH_KEYS = frozenset({"optional"})

def no_decay_flag(value: Any) -> bool:
    """The config's ``no_decay`` switch as a bool: ``True``/``False`` or
    ``"true"``/``"false"``, never judged by truthiness (``"false"`` is a
    non-empty string); anything else is a :class:`ConfigError`."""
    try:
        return as_flag(value, "no_decay")
    except ValueError as exc:
        raise ConfigError(
            f"{exc}: it says whether biases and normalisation weights get weight_decay=0 (default true).",
            problems=[("no_decay", "must be true or false")],
        ) from None


def lr_scale_value(value: Any, where: str = "lr_scale") -> float:
    """A group's ``lr_scale`` as a finite, non-negative float (booleans,
    ``nan`` and ``inf`` are a :class:`ConfigError`)."""
    try:
        scale = as_finite(value, where)
    except ValueError as exc:
        raise ConfigError(
            f"{exc}: lr_scale multiplies the group's lr, write e.g. 0.1.", problems=[(where, "not a finite number")]
        ) from None
    if scale < 0:
        raise ConfigError(f"{where} must be >= 0, got {short_repr(value)}.", problems=[(where, "negative")])
    return scale


_NORM_TYPES: tuple[type, ...] = (
    nn.modules.normalization.LayerNorm,
    nn.modules.normalization.GroupNorm,
    nn.modules.batchnorm._NormBase,
    nn.modules.normalization.LocalResponseNorm,
) + ((nn.RMSNorm,) if hasattr(nn, "RMSNorm") else ())


def _is_norm_module(module: nn.Module) -> bool:
    # Custom norms (LlamaRMSNorm, T5LayerNorm, ...) are recognised by name.
    return isinstance(module, _NORM_TYPES) or "norm" in type(module).__name__.lower()


def _no_decay_names(model: nn.Module) -> set[str]:
    """Names of parameters that should not be decayed: biases and the
    parameters of normalisation layers."""
    names: set[str] = set()
    for module_name, module in model.named_modules():
        for param_name, _ in module.named_parameters(recurse=False):
            full = f"{module_name}.{param_name}" if module_name else param_name
            if param_name == "bias" or param_name.endswith("_bias") or _is_norm_module(module):
                names.add(full)
    return names


def _no_decay_by_name(name: str) -> bool:
    parts = name.lower().split(".")
    return parts[-1] in {"bias"} or any("norm" in p or p in {"ln", "ln_f"} or p.startswith("ln_") for p in parts[:-1])


def _named_params(
    params_or_model: Any, leaf_only: bool = True
) -> tuple[list[tuple[str | None, Tensor]], set[str] | None, bool]:
    """(named trainable tensors, names not to decay, whether names are real)."""
    if isinstance(params_or_model, nn.Module):
        named = [(n, p) for n, p in params_or_model.named_parameters() if p.requires_grad]
        return named, _no_decay_names(params_or_model), True
    if isinstance(params_or_model, Tensor):
        params_or_model = [params_or_model]
    if isinstance(params_or_model, Mapping):
        items = list(params_or_model.items())
        for name, p in items:
            _check_tensor(p, f"params[{name!r}]", leaf_only)
        named = [(str(n), p) for n, p in items if p.requires_grad]
        return named, {n for n, _ in named if _no_decay_by_name(n)}, True
    try:
        items = list(params_or_model)
    except TypeError:
        raise ConfigError(
            f"Cannot build an optimizer over a {type(params_or_model).__name__}: pass an nn.Module, an "
            "iterable of tensors, a list of param-group dicts, or a dict of name -> tensor."
        ) from None
    if items and all(isinstance(i, tuple) and len(i) == 2 and isinstance(i[0], str) for i in items):
        return _named_params(dict(items), leaf_only)
    named = []
    for i, p in enumerate(items):
        _check_tensor(p, f"params[{i}]", leaf_only)
        if p.requires_grad:
            named.append((None, p))
    return named, None, False


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
    seen: set[int] = set()
    out = []
    for n, p in named:
        if id(p) not in seen:
            seen.add(id(p))
            out.append((n, p))
    return out


def _explicit_groups(groups: list[Mapping[str, Any]], leaf_only: bool = True) -> list[dict[str, Any]]:
    out = []
    for i, group in enumerate(groups):
        if "params" not in group:
            raise ConfigError(f"param group {i} has no 'params' key.", problems=[(f"param_groups[{i}]", "no params")])
        settings = {k: v for k, v in group.items() if k != "params"}
        if "lr_scale" in settings:
            settings["lr_scale"] = lr_scale_value(settings["lr_scale"], f"param group {i} lr_scale")
        named, _, _ = _named_params(group["params"], leaf_only)
        tensors = [p for _, p in _dedup(named)]
        if tensors:
            out.append({**settings, "params": tensors})
    return out


def build_param_groups(
    params_or_model: Any,
    param_groups: list[Mapping[str, Any]] | None = None,
    *,
    weight_decay: float | None = None,
    no_decay: Any = True,
    policies: list[Mapping[str, Any]] | None = None,
    leaf_only: bool = True,
) -> list[dict[str, Any]]:
    """Param groups for ``params_or_model`` (see the module docstring).

    ``weight_decay`` is the optimizer's value: the no-decay group is made only
    when it is non-zero. ``param_groups`` are ``{"params": "<regex>", ...}``
    overrides; ``policies`` are hook-contributed overrides (weaker).
    ``no_decay`` is the config's switch as given (checked by
    :func:`no_decay_flag`: ``"false"`` is false). ``leaf_only=False`` accepts
    non-leaf tensors (an optimizer built with ``differentiable=True``).
    """
    if isinstance(params_or_model, (list, tuple)) and params_or_model and all(
        isinstance(g, Mapping) for g in params_or_model
    ):
        if param_groups:
            raise ConfigError("Give either explicit param-group dicts or regex 'param_groups' in the config, not both.")
        groups = _explicit_groups(list(params_or_model), leaf_only)
        if not groups:
            raise ConfigError("No trainable parameters: every parameter has requires_grad=False.")
        return groups

    named, no_decay_names, has_names = _named_params(params_or_model, leaf_only)
    named = _dedup(named)
    if not named:
        raise ConfigError(
            "No trainable parameters: the model or list is empty, or every parameter has requires_grad=False."
        )
    regexes = _compile(param_groups or [], "param_groups")
    weak = _compile(policies or [], "plugin policy")
    if (regexes or weak) and not has_names:
        raise ConfigError(
            "'param_groups' select parameters by name, but the parameters were given without names; "
            "pass the model (nn.Module) or a dict of name -> tensor."
        )

    no_decay = no_decay_flag(no_decay)
    decay_split = bool(no_decay and weight_decay and no_decay_names is not None)
    used = [False] * len(regexes)
    buckets: dict[tuple[Any, ...], dict[str, Any]] = {}
    for name, p in named:
        overrides: dict[str, Any] = {}
        label = None
        if decay_split and name in no_decay_names:  # type: ignore[operator]
            overrides["weight_decay"] = 0.0
            label = "no_decay"
        for pattern, values in weak:
            if name is not None and pattern.search(name):
                overrides.update(values)
        matched = [i for i, (pattern, _) in enumerate(regexes) if name is not None and pattern.search(name)]
        if len(matched) > 1:
            raise ConfigError(
                f"Parameter {name!r} matches more than one param_groups regex: "
                f"{[short_repr(regexes[i][0].pattern) for i in matched]}. Make the regexes exclusive "
                "(e.g. anchor them with ^ and $).",
                problems=[("param_groups", f"{name} matched twice")],
            )
        if matched:
            used[matched[0]] = True
            overrides.update(regexes[matched[0]][1])
        key = tuple(sorted((k, _hashable(v)) for k, v in overrides.items()))
        bucket = buckets.setdefault(key, {"overrides": overrides, "params": [], "label": label})
        bucket["params"].append(p)
    _check_all_used(param_groups or [], regexes, used, [n for n, _ in named if n is not None])

    groups = []
    for i, bucket in enumerate(buckets.values()):
        group = {**bucket["overrides"], "params": bucket["params"]}
        if "name" not in group and len(buckets) > 1:
            group["name"] = bucket["label"] or ("decay" if decay_split and i == 0 else f"group{i}")
        groups.append(group)
    return groups


def _check_all_used(
    entries: list[Mapping[str, Any]], regexes: list[tuple[re.Pattern[str], dict[str, Any]]], used: list[bool],
    names: list[str],
) -> None:
    """A ``param_groups`` regex that selects nothing is an error, naming a few
    parameter names to write the regex against (``"optional": true`` allows it)."""
    unused = [
        i for i, hit in enumerate(used) if not hit and not as_flag(entries[i].get("optional", False), "optional")
    ]
    if not unused:
        return
    shown = ", ".join(names[:8]) + (f", ... ({len(names)} in all)" if len(names) > 8 else "")
    patterns = ", ".join(f"param_groups[{i}].params={short_repr(regexes[i][0].pattern)}" for i in unused)
    raise ConfigError(
        f"{patterns} matches no trainable parameter, so its settings would change nothing. The parameter names "
        f"are: {shown}. Fix the regex (it is searched in each name, e.g. '^head\\.'), drop the group, or mark it "
        "\"optional\": true to allow a group that matches nothing on this model.",
        problems=[(f"param_groups[{i}].params", "matches no parameter") for i in unused],
    )


def _hashable(v: Any) -> Any:
    if isinstance(v, list):
        return tuple(_hashable(x) for x in v)
    if isinstance(v, dict):
        return tuple(sorted((k, _hashable(x)) for k, x in v.items()))
    return v


def _compile(groups: Iterable[Mapping[str, Any]], what: str) -> list[tuple[re.Pattern[str], dict[str, Any]]]:
    out = []
    for i, group in enumerate(groups):
        if not isinstance(group, Mapping) or not isinstance(group.get("params"), str):
            raise ConfigError(
                f"{what}[{i}] must be a mapping with 'params': '<regex over parameter names>' and the "
                f"hyper-parameters to override, got {short_repr(group)}.",
                problems=[(f"{what}[{i}]", "bad entry")],
            )
        try:
            pattern = re.compile(group["params"])
        except re.error as exc:
            raise ConfigError(
                f"{what}[{i}].params {short_repr(group['params'])} is not a valid regex: {exc}.",
                problems=[(f"{what}[{i}].params", str(exc))],
            ) from None
        except (RecursionError, OverflowError) as exc:  # a pathological pattern
            raise ConfigError(
                f"{what}[{i}].params {short_repr(group['params'])} cannot be compiled ({type(exc).__name__}); "
                "write a simpler regex.",
                problems=[(f"{what}[{i}].params", type(exc).__name__)],
            ) from None
        values = {k: v for k, v in group.items() if k != "params" and k not in MATCH_KEYS}
        if "lr_scale" in values:
            values["lr_scale"] = lr_scale_value(values["lr_scale"], f"{what}[{i}].lr_scale")
        if "optional" in group:
            try:
                as_flag(group["optional"], f"{what}[{i}].optional")
            except ValueError as exc:
                raise ConfigError(f"{exc}.", problems=[(f"{what}[{i}].optional", "must be true or false")]) from None
        out.append((pattern, values))
    return out


def all_params(groups: list[Mapping[str, Any]]) -> list[torch.Tensor]:
    return [p for g in groups for p in g["params"]]


def validate_group_specs(param_groups: Iterable[Mapping[str, Any]] | None) -> None:
    """Check a config's regex ``param_groups`` without any parameters at hand:
    each a mapping with a valid ``params`` regex, and no regex given twice (a
    parameter it matches would be matched twice, and one that matches nothing
    is an error too, so a repeated regex can never build)."""
    compiled = _compile(param_groups or [], "param_groups")
    seen: dict[str, int] = {}
    for i, (pattern, _) in enumerate(compiled):
        if pattern.pattern in seen:
            raise ConfigError(
                f"param_groups[{seen[pattern.pattern]}] and param_groups[{i}] have the same regex "
                f"{pattern.pattern!r}: every parameter it matches would be in two groups. Merge them into one entry.",
                problems=[(f"param_groups[{i}].params", "given twice")],
            )
        seen[pattern.pattern] = i

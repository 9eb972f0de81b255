"""The config's regex ``param_groups``, hook policies and ``lr_scale``: checked
from the config alone (``optcore check``) and against parameter names.

A parameter two regexes match is an error, not a silent pick; so is a regex that
matches nothing (a typo would change nothing) unless it is ``"optional": true``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ._errors import ConfigError
from ._values import as_finite, as_flag, clean_text, short_repr
from .guards import PatternError, compile_pattern

Rule = tuple[Any, dict[str, Any]]  # an RE2 pattern: .search and .pattern as re's

GROUP_META_KEYS = frozenset({"name", "lr_scale", "params", "param_names", "optimizer"})  # param_names: torch's own
#: Keys that only steer the matching.
MATCH_KEYS = frozenset({"optional"})


def lr_scale_value(value: Any, where: str = "lr_scale") -> float:
    try:
        scale = as_finite(value, where)
    except ValueError as exc:
        raise ConfigError(
            f"{exc}: lr_scale multiplies the group's lr, write e.g. 0.1.", problems=[(where, "not a finite number")]
        ) from None
    if scale < 0:
        raise ConfigError(f"{where} must be >= 0, got {short_repr(value)}.", problems=[(where, "negative")])
    return scale


def compile_rules(groups: Iterable[Mapping[str, Any]], what: str) -> list[Rule]:
    out = []
    for i, group in enumerate(groups):
        if not isinstance(group, Mapping) or not isinstance(group.get("params"), str):
            raise ConfigError(
                f"{what}[{i}] must be a mapping with 'params': '<regex over parameter names>' and the "
                f"hyper-parameters to override, got {short_repr(group)}.",
                problems=[(f"{what}[{i}]", "bad entry")],
            )
        if not isinstance(group.get("name", ""), str):
            raise ConfigError(
                f"{what}[{i}].name names the group and must be a string, got {short_repr(group['name'])}.",
                problems=[(f"{what}[{i}].name", "not a string")],
            )
        try:
            pattern = compile_pattern(group["params"])
        except PatternError as exc:
            where, why = f"{what}[{i}].params", clean_text(exc.why, 200)
            if not exc.unsupported:
                raise ConfigError(f"{where} {short_repr(group['params'])} is not a valid regex: {why}.", problems=[(where, why)]) from None
            raise ConfigError(
                f"{where} {short_repr(group['params'])} is a regex the linear-time matcher (RE2) does not take: {why}. "
                "Backreferences and lookahead/lookbehind ((?=, (?!, (?<=, (?<!) can make matching take exponential "
                "time, so they are refused; write the regex without them (anchor with ^ and $; \\Z is written $).",
                problems=[(where, f"not supported by RE2: {why}")],
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


def match(names: list[str], param_groups: list[Mapping[str, Any]], policies: list[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """What the policies, then the config's ``param_groups``, set for each of
    ``names``: all names in one call, so the rules compile once and a model's
    size never adds a trip between modules."""
    rules, weak = _unique(compile_rules(param_groups, "param_groups")), compile_rules(policies, "plugin policy")
    used = [False] * len(rules)
    out = []
    for name in names:
        overrides: dict[str, Any] = {}
        for pattern, values in weak:
            if pattern.search(name):
                overrides.update(values)
        matched = [i for i, (pattern, _) in enumerate(rules) if pattern.search(name)]
        if len(matched) > 1:
            raise ConfigError(
                f"Parameter {name!r} matches more than one param_groups regex: "
                f"{[short_repr(rules[i][0].pattern) for i in matched]}. Make the regexes exclusive "
                "(e.g. anchor them with ^ and $).",
                problems=[("param_groups", f"{name} matched twice")],
            )
        if matched:
            used[matched[0]] = True
            overrides.update(rules[matched[0]][1])
        out.append(overrides)
    unused = [i for i, hit in enumerate(used) if not hit and not as_flag(param_groups[i].get("optional", False), "optional")]
    if unused:
        shown = ", ".join(names[:8]) + (f", ... ({len(names)} in all)" if len(names) > 8 else "")
        patterns = ", ".join(f"param_groups[{i}].params={short_repr(rules[i][0].pattern)}" for i in unused)
        raise ConfigError(
            f"{patterns} matches no trainable parameter, so its settings would change nothing. The parameter names "
            f"are: {shown}. Fix the regex (it is searched in each name, e.g. '^head\\.'), drop the group, or mark it "
            "\"optional\": true to allow a group that matches nothing on this model.",
            problems=[(f"param_groups[{i}].params", "matches no parameter") for i in unused],
        )
    return out


def check_config(param_groups: Iterable[Mapping[str, Any]] | None) -> None:
    """The regex groups without parameters at hand: what :func:`match` would reject before matching."""
    _unique(compile_rules(param_groups or [], "param_groups"))


def _unique(rules: list[Rule]) -> list[Rule]:
    """A regex given twice can never build: what it matches is matched twice."""
    seen: dict[str, int] = {}
    for i, (pattern, _) in enumerate(rules):
        if pattern.pattern in seen:
            raise ConfigError(
                f"param_groups[{seen[pattern.pattern]}] and param_groups[{i}] have the same regex "
                f"{pattern.pattern!r}: every parameter it matches would be in two groups. Merge them into one entry.",
                problems=[(f"param_groups[{i}].params", "given twice")],
            )
        seen[pattern.pattern] = i
    return rules

"""Validating hyper-parameters against a schema, and deriving a schema from a signature.

Validation collects *every* problem into one :class:`ConfigError`, with the
accepted fields and, for a misspelt field, the closest ones.
"""

from __future__ import annotations

import difflib
import inspect
import math
import types
import typing
from collections.abc import Mapping
from typing import Annotated, Any, get_type_hints

from pydantic import BaseModel, ValidationError, create_model

from ._errors import ConfigError
from ._fields import Finite, FiniteFloat, Flag, HParams, Integer, Literalish, NonFiniteFloat, Numberish, StrictBool
from ._values import clean_text, short_repr


def _admits_bool(annotation: Any) -> bool:
    """False for number types (and unions of them): pydantic reads ``True`` as ``1``."""
    while typing.get_origin(annotation) is Annotated:
        annotation = typing.get_args(annotation)[0]
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return any(_admits_bool(a) for a in typing.get_args(annotation))
    return annotation is bool or not (isinstance(annotation, type) and issubclass(annotation, (int, float)))


def _boolean_numbers(schema: type[BaseModel], values: Mapping[str, Any]) -> list[tuple[str, str]]:
    fields = schema.model_fields
    by_alias = {info.alias: info for info in fields.values() if isinstance(info.alias, str)}
    problems = []
    for key, value in values.items():
        info = (fields.get(key) or by_alias.get(key)) if isinstance(key, str) else None
        boolish = isinstance(value, bool) or (isinstance(value, str) and value.strip().lower() in ("true", "false"))
        if info is not None and boolish and not _admits_bool(info.annotation):
            problems.append((key, f"a boolean is not a number; write a number (got {short_repr(value)})"))
    return problems


def _field_names(schema: type[BaseModel]) -> list[str]:
    names: list[str] = []
    for name, info in schema.model_fields.items():
        names.append(name)
        if isinstance(info.alias, str) and info.alias != name:
            names.append(info.alias)
    return names


def _fields_at(schema: type[BaseModel], path: tuple[Any, ...]) -> list[str]:
    model: Any = schema
    for part in path:
        info = getattr(model, "model_fields", {}).get(part)
        candidates = [] if info is None else [info.annotation, *typing.get_args(info.annotation)]
        model = next((c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)), None)
    return [] if model is None else _field_names(model)


#: Other libraries' spellings of well-known hyper-parameters, to answer an unknown field.
ALIASES: dict[str, str] = {
    alias: name
    for name, aliases in {
        "weight_decay": "wd weight_decay_rate l2 l2_reg decay",
        "lr": "learning_rate lr_rate step_size",
        "eps": "epsilon adam_epsilon",
        "betas": "beta1 beta2 beta_1 beta_2 b1 b2 adam_beta1 adam_beta2",
        "momentum": "mom momentum_factor",
        "nesterov": "use_nesterov nesterov_momentum",
        "amsgrad": "amsbound",
        "decoupled_weight_decay": "decoupled",
    }.items()
    for alias in aliases.split()
}
#: Well-known hyper-parameters: when one is not a field, say so, not a far-fetched close name.
KNOWN_FIELDS = frozenset(ALIASES.values()) | frozenset(
    {"dampening", "maximize", "foreach", "fused", "capturable", "differentiable", "centered", "alpha", "rho",
     "lr_decay", "momentum_decay", "initial_accumulator_value", "clip_threshold", "relative_step"}
)


def _suggestion(field: str, accepted: list[str], target: str) -> str:
    canonical = ALIASES.get(field, field)
    family = {canonical, *(alias for alias, name in ALIASES.items() if name == canonical)} - {field}
    same = [name for name in accepted if name in family]
    if same:
        return f"unknown field; did you mean {' or '.join(map(repr, same))}?"
    if canonical in KNOWN_FIELDS:
        spelled = f"{field!r}" if canonical == field else f"{field!r} ({canonical})"
        return f"unknown field: {target} has no {spelled}"
    close = difflib.get_close_matches(field, accepted, n=3, cutoff=0.6)
    return "unknown field" + (f"; did you mean {' or '.join(map(repr, close))}?" if close else "")


def _problem(err: Any, schema: type[BaseModel], target: str) -> tuple[str, str]:
    loc = err.get("loc", ())
    field = ".".join(clean_text(str(p), 80) for p in loc) or "<config>"
    kind = err.get("type")
    if kind == "extra_forbidden":
        nested = _fields_at(schema, tuple(loc[:-1]))
        return field, _suggestion(str(loc[-1]), nested, target if len(loc) == 1 else field)
    if kind == "missing":
        return field, "required: this field has no default, set it"
    msg = clean_text(str(err.get("msg", "invalid value")), 300).removeprefix("Value error, ")
    return field, f"{msg} (got {short_repr(err.get('input'))})"


def validate_hparams(
    schema: type[BaseModel],
    values: Mapping[str, Any],
    target: str,
    problems: list[tuple[str, str]] | None = None,
) -> dict[str, Any]:
    """The keyword arguments to build ``target`` with, or one :class:`ConfigError`
    naming every bad field. ``problems``: ``(field, message)`` pairs the caller
    found itself, which replace the schema's for the same field.
    """
    found = list(problems or [])
    found += [p for p in _boolean_numbers(schema, values) if p[0] not in {f for f, _ in found}]
    model = None
    try:
        model = schema.model_validate(dict(values))
    except ValidationError as exc:
        given = {field for field, _ in found}
        found += [p for p in (_problem(e, schema, target) for e in exc.errors()) if p[0] not in given]
    except (TypeError, AttributeError, KeyError, IndexError, ArithmeticError) as exc:
        # a hand-written validator that raised something pydantic does not collect
        found.append(("<config>", f"{type(exc).__name__}: {clean_text(str(exc), 300)}"))
    if found:
        accepted = _field_names(schema)
        lines = [f"Invalid configuration for {target}:"]
        lines += [f"  - {field}: {msg}" for field, msg in found]
        lines.append(f"Accepted fields: {', '.join(accepted) or '(none)'}.")
        lines.append(f"Run `optcore show {target.split(' ')[0]}` for types, defaults and constraints.")
        raise ConfigError("\n".join(lines), problems=found, accepted=accepted, target=target) from None
    return {name: getattr(model, name) for name in type(model).model_fields}


def validate_groups(
    schema: type[BaseModel], hparams: Mapping[str, Any], groups: list[tuple[str, Mapping[str, Any]]]
) -> list[dict[str, Any]]:
    """Each ``(label, overrides)`` group's overrides, validated over ``hparams``
    (so cross-field rules see the group's whole setting): its keys only."""
    out = []
    for label, overrides in groups:
        merged = validate_hparams(schema, {**hparams, **overrides}, label) if overrides else {}
        out.append({k: merged[k] for k in overrides})
    return out


def _strict(annotation: Any, default: Any = inspect.Parameter.empty) -> Any:
    """A signature's annotation with optcore's value rules (:mod:`._values`),
    member by member through unions, tuples and lists."""
    if annotation is float:
        return NonFiniteFloat if isinstance(default, float) and not math.isfinite(default) else FiniteFloat
    if annotation is bool:
        return Flag
    if annotation is int:
        return Integer
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if not args:
        return annotation
    try:
        if origin in (typing.Union, types.UnionType):
            # inside a union a bool member is strict: 1 stays a number, "true" was parsed by Literalish
            members = tuple(StrictBool if a is bool else _strict(a, default) for a in args)
            return typing.Union[members]  # noqa: UP007 (a runtime tuple of members)
        if origin is tuple:
            return tuple[tuple(a if a is Ellipsis else _strict(a) for a in args)]  # type: ignore[misc]
        if origin is list:
            return list[_strict(args[0])]  # type: ignore[misc]
    except TypeError:  # a construct that cannot be rebuilt from its parts
        return annotation
    return annotation


def _annotation_for(default: Any, annotation: Any) -> Any:
    if annotation is not inspect.Parameter.empty and annotation is not Any:
        return Annotated[_strict(annotation, default), Literalish]
    if default is inspect.Parameter.empty or default is None:
        return Annotated[Any, Literalish]
    kind = type(default)
    if kind in (bool, float):
        return _strict(kind, default)
    if kind is int:
        return Annotated[int | Annotated[float, Finite], Numberish]
    if kind is tuple:
        if default and all(type(x) in (int, float) for x in default) and any(type(x) is float for x in default):
            return Annotated[tuple[FiniteFloat, ...], Literalish]
        return Annotated[tuple, Literalish]
    return Annotated[Any, Literalish]


def schema_from_signature(
    target: Any,
    name: str | None = None,
    skip: tuple[str, ...] = ("params",),
    *,
    fields: Mapping[str, Any] | None = None,
    base: type[HParams] = HParams,
    doc: str | None = None,
) -> type[HParams]:
    """A schema from ``target.__init__``'s signature: one field per named
    parameter, typed by ``fields[name]`` if given, else by its annotation or
    default (``**kwargs`` adds none); ``base`` may add validators."""
    init = target.__init__ if isinstance(target, type) else target
    try:
        hints = get_type_hints(init, include_extras=True)
    except Exception:  # unresolvable forward references: judge each field by its default
        hints = {}
    drop_first = "params" in skip  # optimizers: the first argument is the params, whatever its name
    typed: dict[str, Any] = {}
    params = list(inspect.signature(init).parameters.values())
    if isinstance(target, type) and params and params[0].name == "self":
        params = params[1:]
    for i, param in enumerate(params):
        if param.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
            continue
        if param.name in skip or (drop_first and i == 0 and param.default is inspect.Parameter.empty):
            continue  # the params argument itself
        annotation = hints.get(param.name, param.annotation)
        if isinstance(annotation, str):  # an unresolved string annotation says nothing pydantic can use
            annotation = inspect.Parameter.empty
        typ = (fields or {}).get(param.name) or _annotation_for(param.default, annotation)
        typed[param.name] = (typ, ... if param.default is inspect.Parameter.empty else param.default)
    model_name = f"{name or getattr(target, '__name__', 'Optimizer')}Config"
    try:
        model = create_model(model_name, __base__=base, __doc__=doc, **typed)
        model.model_json_schema()  # Callable and other non-JSON types fail here, not in `optcore schema`
        return model
    except Exception:  # an annotation pydantic cannot handle: accept any value, keep the names and given types
        loose = {k: (v[0] if k in (fields or {}) else Annotated[Any, Literalish], v[1]) for k, v in typed.items()}
        return create_model(model_name, __base__=base, __doc__=doc, **loose)

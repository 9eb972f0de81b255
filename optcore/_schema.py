"""Hyper-parameter schemas: pydantic models that validate every field.

Each optimizer has a schema, written by hand (built-ins, plugins) or derived
from its ``__init__`` signature. Validation collects *every* problem into one
:class:`ConfigError` that also lists the accepted fields and, for a misspelt
field, the closest ones. Strings that stand for tuples or numbers (``"(0.9,
0.98)"``, ``"1e-4"``) are parsed with :func:`ast.literal_eval`, which accepts
literals only: nothing from a config is ever executed.
"""

from __future__ import annotations

import ast
import difflib
import inspect
from collections.abc import Mapping
from typing import Annotated, Any, get_type_hints

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, WrapValidator, create_model

from ._errors import ConfigError


def parse_literal(value: Any) -> Any:
    """Turn a config string that spells a Python literal into its value.

    ``"(0.9, 0.98)"`` -> ``(0.9, 0.98)``, ``"[1, 2]"`` -> ``[1, 2]``,
    ``"1e-4"`` -> ``0.0001``, ``"true"`` -> ``True``, ``"none"`` -> ``None``.
    Anything else is returned unchanged (pydantic then reports it).
    """
    if not isinstance(value, str):
        return value
    text = value.strip()
    lowered = text.lower()
    if lowered in {"true", "false"}:
        return lowered == "true"
    if lowered in {"none", "null"}:
        return None
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return value


def _split_top_level(text: str, sep: str = ",") -> list[str]:
    parts, depth, current = [], 0, []
    for ch in text:
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        if ch == sep and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(ch)
    parts.append("".join(current))
    return [p.strip() for p in parts if p.strip()]


def parse_optim_args(text: str) -> dict[str, Any]:
    """Parse a Hugging Face ``optim_args`` string: ``"rank=64, betas=(0.9,0.99)"``."""
    result: dict[str, Any] = {}
    for item in _split_top_level(text):
        key, sep, raw = item.partition("=")
        if not sep or not key.strip().isidentifier():
            raise ConfigError(
                f"optim_args item {item!r} is not of the form key=value; write e.g. "
                "'rank=64, betas=(0.9, 0.99)'.",
                problems=[("optim_args", f"bad item {item!r}")],
            )
        result[key.strip()] = parse_literal(raw.strip())
    return result


# Field types shared by schemas, so constraints read the same everywhere.
Literalish = BeforeValidator(parse_literal)
def _keep_tensor_lr(value: Any, handler: Any) -> Any:
    """A 0-dim floating tensor stays a tensor (torch.compile + LR schedulers rely
    on it: the scheduler fills it in place, so the compiled step is not recompiled)."""
    import torch

    if isinstance(value, torch.Tensor):
        if value.ndim != 0 or not value.is_floating_point():
            raise ValueError(f"a tensor learning rate must be a 0-dim floating tensor, got shape {tuple(value.shape)} {value.dtype}")
        if not bool(value >= 0):
            raise ValueError(f"learning rate must be >= 0, got {value.item()}")
        return value
    return handler(value)


LR = Annotated[float, Field(ge=0.0, description="learning rate"), Literalish, WrapValidator(_keep_tensor_lr)]
Beta = Annotated[float, Field(ge=0.0, lt=1.0), Literalish]
Betas = Annotated[tuple[Beta, Beta], Field(description="coefficients of the running averages"), Literalish]
Eps = Annotated[float, Field(ge=0.0, description="term added for numerical stability"), Literalish]
WeightDecay = Annotated[float, Field(ge=0.0, description="weight decay coefficient"), Literalish]
Momentum = Annotated[float, Field(ge=0.0, description="momentum factor"), Literalish]
Flag = Annotated[bool, Literalish]
OptionalFlag = Annotated[bool | None, Literalish]


class HParams(BaseModel):
    """Base class of hyper-parameter schemas: unknown fields are errors, and
    string values that spell literals are parsed first."""

    model_config = ConfigDict(
        extra="forbid",
        arbitrary_types_allowed=True,
        validate_default=False,
        populate_by_name=True,
    )


def _field_names(schema: type[BaseModel]) -> list[str]:
    names: list[str] = []
    for name, info in schema.model_fields.items():
        names.append(name)
        if isinstance(info.alias, str) and info.alias != name:
            names.append(info.alias)
    return names


def _fields_at(schema: type[BaseModel], path: tuple[Any, ...]) -> list[str]:
    """The field names of the (nested) model at ``path``, for suggestions."""
    import typing

    model: Any = schema
    for part in path:
        info = getattr(model, "model_fields", {}).get(part)
        if info is None:
            return []
        candidates = [info.annotation, *typing.get_args(info.annotation)]
        model = next((c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)), None)
        if model is None:
            return []
    return _field_names(model)


def validate_hparams(schema: type[BaseModel], values: Mapping[str, Any], target: str) -> dict[str, Any]:
    """Validate ``values`` against ``schema`` and return the keyword arguments
    to build ``target`` with, or raise one :class:`ConfigError` naming every bad
    field, what was wrong, and the accepted fields."""
    try:
        model = schema.model_validate(dict(values))
    except ValidationError as exc:
        accepted = _field_names(schema)
        problems: list[tuple[str, str]] = []
        for err in exc.errors():
            field = ".".join(str(p) for p in err["loc"]) or "<config>"
            if err["type"] == "extra_forbidden":
                nested = _fields_at(schema, err["loc"][:-1])
                close = difflib.get_close_matches(str(err["loc"][-1]), nested, n=3, cutoff=0.5)
                msg = "unknown field" + (f"; did you mean {' or '.join(map(repr, close))}?" if close else "")
            else:
                msg = f"{err['msg']} (got {err.get('input')!r})"
            problems.append((field, msg))
        lines = [f"Invalid configuration for {target}:"]
        lines += [f"  - {field}: {msg}" for field, msg in problems]
        lines.append(f"Accepted fields: {', '.join(accepted) or '(none)'}.")
        lines.append(f"Run `optcore show {target}` for types, defaults and constraints.")
        raise ConfigError("\n".join(lines), problems=problems, accepted=accepted, target=target) from None
    return {name: getattr(model, name) for name in type(model).model_fields}


def _annotation_for(default: Any, annotation: Any) -> Any:
    if annotation is not inspect.Parameter.empty and annotation is not Any:
        return Annotated[annotation, Literalish]
    if default is inspect.Parameter.empty or default is None:
        return Annotated[Any, Literalish]
    kind = type(default)
    if kind is bool:
        return Flag
    if kind is float or kind is int:
        return Annotated[float | int, Literalish] if kind is int else Annotated[float, Literalish]
    if kind is tuple:
        return Annotated[tuple, Literalish]
    return Annotated[Any, Literalish]


def schema_from_signature(
    target: Any, name: str | None = None, skip: tuple[str, ...] = ("params",), drop_first: bool | None = None
) -> type[HParams]:
    """Derive a schema from ``target.__init__``'s signature: one field per
    keyword parameter, typed by its annotation (or the type of its default),
    required where there is no default. ``**kwargs`` is not accepted
    blindly: a class that takes arbitrary keywords gets exactly its named ones."""
    init = target.__init__ if isinstance(target, type) else target
    sig = inspect.signature(init)
    try:
        hints = get_type_hints(init, include_extras=True)
    except Exception:  # unresolvable forward references: judge each field by its default
        hints = {}
    if drop_first is None:
        drop_first = "params" in skip  # optimizers: the first argument is the params, whatever its name
    fields: dict[str, Any] = {}
    params = list(sig.parameters.values())
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
        typ = _annotation_for(param.default, annotation)
        if param.default is inspect.Parameter.empty:
            fields[param.name] = (typ, ...)
        else:
            fields[param.name] = (typ, param.default)
    model_name = f"{name or getattr(target, '__name__', 'Optimizer')}Config"
    try:
        model = create_model(model_name, __base__=HParams, **fields)
        model.model_json_schema()  # Callable and other non-JSON types fail here, not in `optcore schema`
        return model
    except Exception:  # an annotation pydantic cannot handle: accept any value, keep the names
        loose = {k: (Annotated[Any, Literalish], v[1]) for k, v in fields.items()}
        return create_model(model_name, __base__=HParams, **loose)

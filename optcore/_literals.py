"""Config strings that spell Python literals (``"(0.9, 0.98)"``, ``"1e-4"``) and
Hugging Face's ``optim_args``; without pydantic, because command lines and
trainers give strings before any schema is known. :func:`ast.literal_eval`
accepts literals only: nothing from a config is executed.
"""

from __future__ import annotations

import ast
from typing import Any

from ._errors import ConfigError


def parse_literal(value: Any) -> Any:
    """The value a config string spells (``"true"`` and ``"none"`` too); anything
    else unchanged, for pydantic to report."""
    if not isinstance(value, str):
        return value
    text = value.strip()
    words = {"true": True, "false": False, "none": None, "null": None}
    if text.lower() in words:
        return words[text.lower()]
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return value


def _split_top_level(text: str) -> list[str]:
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        depth += (ch in "([{") - (ch in ")]}")
        if ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
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

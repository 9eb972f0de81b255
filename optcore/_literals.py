"""Config strings that spell Python literals: ``"(0.9, 0.98)"``, ``"1e-4"``, and
Hugging Face's ``optim_args`` (``"rank=64, betas=(0.9,0.99)"``).

Its own module, without pydantic, because configs from command lines and
trainers are strings before any schema is known (``merge_kwargs``, the
argparse flags). Parsing uses :func:`ast.literal_eval`, which accepts
literals only: nothing from a config is ever executed.
"""

from __future__ import annotations

import ast
from typing import Any

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

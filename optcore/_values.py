"""What a config value means, and how it appears in a message.

Two rules hold everywhere a config is read (schemas, param groups, wrappers):

- a hyper-parameter is a finite real number; ``True`` is not ``1.0``, and
  ``inf``/``nan`` are not learning rates (the first step would leave
  non-finite parameters);
- a switch is a boolean, or the string ``"true"``/``"false"``; it is never
  judged by truthiness (``"false"`` is a non-empty string, hence truthy).

Messages echo what a user or a plugin wrote, but escaped and cut
(:func:`clean_text`, :func:`short_repr`). This module imports nothing heavy.
"""

from __future__ import annotations

import math
import reprlib
from typing import Any

#: characters of a value's repr shown in a message before it is cut
REPR_LIMIT = 80


def clean_text(text: Any, limit: int = 120) -> str:
    """``text`` (or ``str(text)``) with control characters and terminal escape
    codes escaped (``\\x1b``, ``\\n``), so that a name cannot restyle or rewrite
    the user's terminal, and cut to ``limit`` characters, saying how long it
    was, so that a 10 MB value does not make a 10 MB message."""
    text = text if isinstance(text, str) else str(text)
    out = "".join(ch if ch.isprintable() else ascii(ch)[1:-1] for ch in text[: limit + 1])
    if len(text) > limit:
        out = out[:limit] + f"…({len(text)} chars)"
    return out


class _Repr(reprlib.Repr):
    def __init__(self, limit: int) -> None:
        super().__init__()
        self.maxlevel, self.maxlist, self.maxtuple, self.maxdict, self.maxset = 3, 8, 8, 12, 8
        self.maxstring = self.maxother = self.maxlong = limit

    def repr_str(self, x: str, level: int) -> str:
        if len(x) <= self.maxstring:
            return repr(x)
        return repr(x[: self.maxstring]) + f"…({len(x)} chars)"

    def repr_int(self, x: int, level: int) -> str:
        if x.bit_length() < 3 * self.maxlong:  # cheap: no decimal conversion of a huge int
            text = repr(x)
            if len(text) <= self.maxlong:
                return text
        return f"<int of {x.bit_length()} bits>"


def short_repr(value: Any, limit: int = REPR_LIMIT) -> str:
    """``repr(value)`` for a message: long strings cut to ``limit`` characters
    with ``…(N chars)``, containers to their first few items, control
    characters escaped. Never raises (a broken ``__repr__`` is named instead)."""
    try:
        text = _Repr(limit).repr(value)
    except Exception:  # a user object whose __repr__ fails must not hide the real error
        return f"<{type(value).__name__} object>"
    return clean_text(text, 2 * limit + 40)


def as_flag(value: Any, field: str) -> bool:
    """``value`` as a boolean switch: ``True``/``False`` or the strings
    ``"true"``/``"false"`` (any case); anything else is a ``ValueError``
    saying what to write."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    raise ValueError(f"{field} must be true or false, got {short_repr(value)}")


def as_finite(value: Any, field: str) -> float:
    """``value`` as a finite real number (an int or float, or a string that
    spells one); booleans, ``inf`` and ``nan`` are a ``ValueError``."""
    original = value
    if isinstance(value, str):
        try:
            value = float(value.strip())
        except ValueError:
            raise ValueError(f"{field} must be a number, got {short_repr(original)}") from None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{field} must be a number, got {short_repr(original)}")
    try:
        number = float(value)
    except OverflowError:
        raise ValueError(f"{field} is too large: {short_repr(original)}") from None
    if not math.isfinite(number):
        raise ValueError(f"{field} must be a finite number, got {short_repr(original)}")
    return number

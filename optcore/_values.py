"""What a config value means, and how it appears in a message.

A hyper-parameter is a finite real number (``True`` is not ``1.0``; an ``inf``
lr leaves non-finite parameters after one step); a switch is a boolean or
``"true"``/``"false"``, never judged by truthiness.
"""

from __future__ import annotations

import math
import reprlib
from typing import Any


def clean_text(text: Any, limit: int = 120) -> str:
    """``str(text)`` with control characters escaped (a name cannot restyle the
    user's terminal) and cut to ``limit`` characters (a 10 MB value does not
    make a 10 MB message)."""
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


def short_repr(value: Any, limit: int = 80) -> str:
    """``repr(value)`` for a message: cut like :func:`clean_text`, containers to
    their first few items; never raises (a broken ``__repr__`` is named instead)."""
    try:
        text = _Repr(limit).repr(value)
    except Exception:  # a user object whose __repr__ fails must not hide the real error
        return f"<{type(value).__name__} object>"
    return clean_text(text, 2 * limit + 40)


def as_flag(value: Any, field: str) -> bool:
    """``value`` as a switch: a bool or ``"true"``/``"false"`` (any case), else ``ValueError``."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    raise ValueError(f"{field} must be true or false, got {short_repr(value)}")


def as_finite(value: Any, field: str) -> float:
    """``value`` (a number, or a string that spells one) as a finite float, else ``ValueError``."""
    try:
        if isinstance(value, bool) or not isinstance(value, (int, float, str)):
            raise ValueError
        number = float(value.strip() if isinstance(value, str) else value)
    except ValueError:
        raise ValueError(f"{field} must be a number, got {short_repr(value)}") from None
    except OverflowError:
        raise ValueError(f"{field} is too large: {short_repr(value)}") from None
    if not math.isfinite(number):
        raise ValueError(f"{field} must be a finite number, got {short_repr(value)}")
    return number

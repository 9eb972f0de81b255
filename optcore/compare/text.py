"""How text from outside (a shared storage, a results.json) is shown: as text, never as markup.

A stored config name such as ``[bold]x[/`` would restyle a rich table (or stop it with a
``MarkupError``), ``\\x1b[2J`` would clear the user's terminal, and ``$\\frac$`` would stop
matplotlib's mathtext; every string that came from a record passes through one of these
on its way to the screen or a plot.
"""

from __future__ import annotations

from typing import Any

from .._values import clean_text


def shown(value: Any, limit: int = 200) -> str:
    """``value`` for a rich markup string: control characters escaped, cut to ``limit``, brackets escaped."""
    from rich.markup import escape

    return escape(clean_text(value, limit))


def label(value: Any, limit: int = 80) -> str:
    """``value`` for a matplotlib text: control characters escaped, cut to ``limit``, no mathtext."""
    return clean_text(value, limit).replace("$", r"\$")

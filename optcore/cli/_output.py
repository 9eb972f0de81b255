"""Output helpers shared by the subcommands: a rich console on a terminal,
plain aligned text when the output is a file or a pipe, or when rich (the
``cli`` extra) is not installed: ``list``, ``show``, ``check`` and ``schema``
work in a plain ``pip install optcore``."""

from __future__ import annotations

import re
import sys
from collections.abc import Sequence
from typing import Any

#: the rich markup the subcommands write, dropped from plain output
_MARKUP = re.compile(r"\[/?(?:bold|dim|red|yellow|green)\]")


def has_rich() -> bool:
    try:
        import rich  # noqa: F401
    except ImportError:
        return False
    return True


def console() -> Any:
    """rich's console on a terminal where rich is installed; else :class:`PlainConsole`."""
    if sys.stdout.isatty() and has_rich():
        from rich.console import Console

        return Console(soft_wrap=False)
    return PlainConsole()


def table(title: str, columns: Sequence[str]) -> Any:
    """A table the console of :func:`console` prints: rich's, or a :class:`PlainTable`."""
    if sys.stdout.isatty() and has_rich():
        from rich.table import Table

        out = Table(title=title)
        for col in columns:
            out.add_column(col, overflow="fold")
        return out
    return PlainTable(title, list(columns))


class PlainTable:
    def __init__(self, title: str, columns: list[str]) -> None:
        self.title, self.columns, self.rows = title, columns, []  # type: list[Sequence[str]]

    def add_row(self, *cells: str) -> None:
        self.rows.append(cells)


class PlainConsole:
    """``print`` for the subcommands' rich markup and tables, as plain text: every
    line whole (no wrapping at 80 columns), markup dropped."""

    def print(self, obj: Any = "", **_: Any) -> None:
        if isinstance(obj, PlainTable):
            print(obj.title)
            print(plain_table(obj.columns, obj.rows))
        else:
            print(_MARKUP.sub("", str(obj)))


def plain_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Columns padded to their widest cell, two spaces apart; no cell is cut."""
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(str(c).ljust(w) for c, w in zip(row, widths)).rstrip() for row in [header, *rows]]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)

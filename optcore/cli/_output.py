"""Output helpers shared by the subcommands: a rich console on a terminal,
plain aligned text when the output is a file or a pipe, or when rich (the
``cli`` extra) is not installed: ``list``, ``show``, ``check`` and ``schema``
work in a plain ``pip install optcore``.

A table fits the width it is printed in, as rich's do: rich's to the terminal;
a plain one to ``COLUMNS`` where that is set, else to the terminal, its widest
columns wrapped first (words kept whole where they fit). A plain table piped or
written to a file, with ``COLUMNS`` unset, keeps every row on one line, for
``grep`` and ``awk``.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
import textwrap
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


def table(title: str, columns: Sequence[str], whole: Sequence[int] = ()) -> Any:
    """A table the console of :func:`console` prints: rich's, or a :class:`PlainTable`;
    the columns numbered in ``whole`` are never wrapped (a name a reader looks up)."""
    if sys.stdout.isatty() and has_rich():
        from rich.table import Table

        out = Table(title=title)
        for i, col in enumerate(columns):
            out.add_column(col, overflow="fold", no_wrap=i in whole)
        return out
    return PlainTable(title, list(columns), whole)


def plain_width() -> int | None:
    """The width plain output fits: ``COLUMNS`` where it is set, else the
    terminal's; ``None`` for a pipe or a file (every row on one line)."""
    env = os.environ.get("COLUMNS", "").strip()
    if env.isdigit() and int(env) > 0:
        return int(env)
    return shutil.get_terminal_size().columns if sys.stdout.isatty() else None


def fit_text(text: str) -> str:
    """``text`` wrapped to :func:`plain_width` where plain output is printed at a
    width (rich's console wraps on its own); a word longer than the width (a
    path) stays whole, so that it can be copied."""
    width = None if sys.stdout.isatty() and has_rich() else plain_width()
    if width is None:
        return text
    return "\n".join(
        "\n".join(textwrap.wrap(line, width, break_long_words=False, break_on_hyphens=False)) or line
        for line in text.splitlines()
    )


class PlainTable:
    def __init__(self, title: str, columns: list[str], whole: Sequence[int] = ()) -> None:
        self.title, self.columns, self.rows = title, columns, []  # type: list[Sequence[str]]
        self.whole = tuple(whole)

    def add_row(self, *cells: str) -> None:
        self.rows.append(cells)


class PlainConsole:
    """``print`` for the subcommands' rich markup and tables, as plain text: every
    line whole (no wrapping at 80 columns), markup dropped."""

    def print(self, obj: Any = "", **_: Any) -> None:
        if isinstance(obj, PlainTable):
            print(obj.title)
            print(plain_table(obj.columns, obj.rows, plain_width(), obj.whole))
        else:
            print(_MARKUP.sub("", str(obj)))


def plain_table(header: Sequence[str], rows: Sequence[Sequence[str]], width: int | None = None,
                whole: Sequence[int] = ()) -> str:  # fmt: skip
    """Columns padded to their widest cell, two spaces apart; no cell is cut.
    Within ``width``, the widest columns but those in ``whole`` narrow first and
    their cells wrap onto the row's next lines, as rich's ``overflow="fold"`` does."""
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    if width is not None:
        _narrow(widths, width - 2 * (len(widths) - 1), whole, [[str(c) for c in r] for r in [header, *rows]])
    lines = []
    for row in [header, *rows]:
        cells = [_fold(str(c), w) for c, w in zip(row, widths)]
        for k in range(max(map(len, cells))):
            lines.append("  ".join((c[k] if k < len(c) else "").ljust(w) for c, w in zip(cells, widths)).rstrip())
        if row is header:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


#: a column narrows to no fewer characters than this (fewer, where its widest cell is narrower)
_MIN_COLUMN = 6


def _narrow(widths: list[int], room: int, whole: Sequence[int], rows: Sequence[Sequence[str]]) -> None:
    """Narrows one column by one character at a time until ``widths`` sum to
    ``room`` (``rows[0]`` is the header) (or every column that may narrow is at its floor), each time the
    column whose narrowing adds the fewest lines to the table (the widest of
    those): a column with a few long cells gives way before one of many."""
    # a column keeps its header's longest word whole, and its cells' words of up to _MIN_COLUMN + 2 characters
    words = [max((len(word) for row in rows for word in row[i].split()), default=0) for i in range(len(widths))]
    floors = [w if i in whole else min(w, max(_MIN_COLUMN, min(words[i], _MIN_COLUMN + 2),
                                              *map(len, rows[0][i].split() or [""])))
              for i, w in enumerate(widths)]  # fmt: skip
    lengths = [[len(c) for c in row] for row in rows]

    def lines(ws: list[int]) -> int:  # about what _fold makes: a cell of n characters takes ceil(n / w) lines
        return sum(max(-(-n // w) if n else 1 for n, w in zip(row, ws)) for row in lengths)

    while sum(widths) > room:
        narrowable = [i for i in range(len(widths)) if widths[i] > floors[i]]
        if not narrowable:
            return
        i = min(narrowable, key=lambda i: (lines([w - (j == i) for j, w in enumerate(widths)]), -widths[i]))
        widths[i] -= 1


#: where a cell may break besides spaces: after a name's separators (``torch:``, ``optcore-``, ``a, b``)
_BREAKS = re.compile(r".*?(?:[:,/_-]+|\s+|$)")


def _fold(cell: str, width: int) -> list[str]:
    """``cell`` as lines of at most ``width`` characters, broken after a space or
    a separator (``:``, ``,``, ``/``, ``_``, ``-``) where it can be, and a longer
    piece cut at the width, as rich's ``overflow="fold"`` does."""
    if len(cell) <= width:
        return [cell]
    lines: list[str] = []
    line = ""
    for piece in (p for p in _BREAKS.findall(cell) if p):
        if len((line + piece).rstrip()) <= width:
            line += piece
            continue
        if line.strip():
            lines.append(line.rstrip())
        line = piece.lstrip()
        while len(line.rstrip()) > width:
            lines.append(line[:width])
            line = line[width:]
    if line.strip():
        lines.append(line.rstrip())
    return lines or [""]

"""Output helpers shared by the subcommands: a rich console on a terminal,
plain aligned text when the output is a file or a pipe."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def console() -> Any:
    from rich.console import Console

    return Console(soft_wrap=False)


def plain_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Columns padded to their widest cell, two spaces apart; no cell is cut."""
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(str(c).ljust(w) for c, w in zip(row, widths)).rstrip() for row in [header, *rows]]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)

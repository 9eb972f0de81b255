"""``optcore list`` fits the width it is printed in: COLUMNS (or the terminal) for
plain output, the console's for rich's; piped with COLUMNS unset, each row stays
on one line (tests/cli/test_cli_files.py::test_list_piped_is_not_cut)."""

from __future__ import annotations

import io

import pytest

import optcore
from optcore.cli import main
from optcore.cli import _list, _output


def _cells(out: str) -> list[list[str]]:
    """The rows of the plain table in ``out``, each cell's wrapped lines joined
    (spaces dropped), read by the columns the dashes under the header mark."""
    lines = out.splitlines()
    rule = next(i for i, line in enumerate(lines) if line.startswith("----"))
    spans, at = [], 0
    for dashes in lines[rule].split("  "):
        spans.append((at, at + len(dashes)))
        at += len(dashes) + 2
    rows: list[list[str]] = []
    for line in lines[rule + 1:]:
        if not line.strip() or line.startswith(("flags, sharding:", "Not listed:", "Not loaded:")):
            break
        parts = [line[a:b].strip() if a < len(line) else "" for a, b in spans]
        if parts[0]:
            rows.append(parts)
        else:  # a wrapped cell's next line
            rows[-1] = [c + p for c, p in zip(rows[-1], parts)]
    return rows


@pytest.mark.parametrize("flags", [[], ["--all"]])
def test_plain_list_fits_100_columns_and_keeps_every_name(monkeypatch, capsys, flags):
    monkeypatch.setenv("COLUMNS", "100")
    assert main(["list", *flags]) == 0
    out = capsys.readouterr().out
    too_wide = [line for line in out.splitlines() if len(line) > 100]
    assert not too_wide, too_wide[:3]
    rows = {r[3]: r for r in _cells(out)}  # by "select with"
    specs = optcore.list_optimizers(all=bool(flags), ask_packages=bool(flags))
    assert len(rows) == len(specs)
    for spec in specs:
        row = rows[spec.qualified.replace(" ", "")]
        assert row[0] == spec.name and row[1] == spec.source  # the name column is never folded
        assert row[4] == ",".join(s.qualified for s in spec.shadowed).replace(" ", "")


def test_plain_list_without_a_width_keeps_each_row_on_one_line(monkeypatch, capsys):
    monkeypatch.delenv("COLUMNS", raising=False)
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    assert max(map(len, out.splitlines())) > 100  # nothing wrapped: grep finds a row by any of its cells
    assert all(len(r) == 6 and r[0] for r in _cells(out))


def test_rich_list_fits_a_console_of_100_columns(monkeypatch, capsys):
    pytest.importorskip("rich")
    from rich.console import Console

    buf = io.StringIO()
    monkeypatch.setattr(_output.sys.stdout, "isatty", lambda: True, raising=False)  # rich's table and console
    monkeypatch.setattr(_list, "console", lambda: Console(file=buf, width=100, color_system=None, soft_wrap=False))
    assert main(["list"]) == 0
    text = buf.getvalue()
    assert "┃ name" in text  # rich's table, not the plain one
    too_wide = [line for line in text.splitlines() if len(line) > 100]
    assert not too_wide, too_wide[:3]
    for spec in optcore.list_optimizers():
        assert f"│ {spec.name} " in text, spec.name  # the name column is never folded


def test_a_cell_folds_after_its_separators_first():
    assert _output._fold("pytorch_optimizer:AdaBelief", 20) == ["pytorch_optimizer:", "AdaBelief"]
    assert _output._fold("optimi:SGD, torch:SGD", 12) == ["optimi:SGD,", "torch:SGD"]
    assert _output._fold("MemoryEfficientFP16Optimizer", 10) == ["MemoryEffi", "cientFP16O", "ptimizer"]
    table = _output.plain_table(["name", "where"], [["a", "x" * 30]], width=20, whole=[0])
    assert max(map(len, table.splitlines())) <= 20 and "".join(table.split()).count("x") == 30

"""The size of optcore's core (issue 10's measure): lines per module, total and
code lines (no blank, comment-only or docstring lines).

    python benchmarks/core_size.py              # optcore/*.py: the core modules
    python benchmarks/core_size.py FILES...     # any files

The core is ``optcore/*.py``; the subsystems (``schedulers/``, ``compare/``,
``integrations/``, ``testing/``, ``cli/``, ``kernels/``, ``files/``) are
packages of their own and not counted.
"""

from __future__ import annotations

import ast
import io
import sys
import tokenize
from pathlib import Path

SKIP = (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER)


def _docstring_lines(tree: ast.AST) -> set[int]:
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
                lines.update(range(first.lineno, (first.end_lineno or first.lineno) + 1))
    return lines


def sizes(path: Path) -> tuple[int, int]:
    """(total lines, code lines) of one Python file."""
    source = path.read_text()
    docs = _docstring_lines(ast.parse(source))
    code = {
        line
        for tok in tokenize.generate_tokens(io.StringIO(source).readline)
        if tok.type not in SKIP
        for line in range(tok.start[0], tok.end[0] + 1)
        if line not in docs
    }
    return len(source.splitlines()), len(code)


def main(argv: list[str]) -> None:
    paths = [Path(a) for a in argv] or sorted((Path(__file__).resolve().parents[1] / "optcore").glob("*.py"))
    total = code = 0
    for path in paths:
        t, c = sizes(path)
        total, code = total + t, code + c
        print(f"{t:6d} {c:6d}  {path.name}")
    print(f"{total:6d} {code:6d}  total (lines, code lines)")


if __name__ == "__main__":
    main(sys.argv[1:])

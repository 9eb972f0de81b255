"""mkdocs hooks (``hooks:`` in mkdocs.yml): the parts of the site that come from code.

* ``on_config``: ask optcore's registry for every installed optimizer and
  scheduler (``docs/gen_reference.py``) and put their pages under "Reference"
  in the navigation. A repository plugin that cannot be described is a warning,
  so ``mkdocs build --strict`` fails rather than publish a reference without it;
  a third-party package that fails to import is only noted on the index page.
* ``on_files``: add those pages to the build (they are never written to docs/).
* ``on_page_markdown``: expand the markers hand-written pages use to quote the
  repository instead of copying it, so the pages cannot drift from the code:

  ``<!-- optcore:include PATH -->``                  the whole file
  ``<!-- optcore:include PATH::Name -->``            one top-level function or class
  ``<!-- optcore:include PATH::Class.method -->``    one method
  ``<!-- optcore:outline PATH::Class -->``           a class with method bodies elided
  ``<!-- optcore:tree DIR -->``                      the files of a folder
  ``<!-- optcore:cli-help [COMMAND] -->``            ``optcore [COMMAND] --help``
  ``<!-- optcore:conformance-checks -->``            the conformance kit's checks
  ``<!-- optcore:compare-plot -->``                  docs/img/compare.png, if present

  PATH is relative to the repository root. A marker that names a missing file
  or symbol stops the build with an error that says which.

  A page is read as a plain file too (on a code host, where a marker is an
  invisible comment): the line right after an ``include``, ``outline`` or
  ``tree`` marker may be a link to the file or folder it quotes, by its path
  relative to the page (``[lion.py](../plugins/optcore-lion/src/optcore_lion/lion.py)``).
  The build checks that the link names what the marker quotes, and drops it,
  since the quoted block carries the path in its title.
"""

from __future__ import annotations

import ast
import contextlib
import importlib.util
import io
import logging
import os
import re
import sys
from pathlib import Path
from typing import Any

from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
COMPARE_PLOT = DOCS / "img" / "compare.png"
log = logging.getLogger("mkdocs.hooks.optcore")

_spec = importlib.util.spec_from_file_location("optcore_docs_gen_reference", DOCS / "gen_reference.py")
gen = importlib.util.module_from_spec(_spec)  # type: ignore[arg-type]
sys.modules[_spec.name] = gen  # dataclasses look their module up there
_spec.loader.exec_module(gen)  # type: ignore[union-attr]

_reference: Any = None
_LANGS = {".py": "python", ".toml": "toml", ".md": "markdown", ".yaml": "yaml", ".yml": "yaml", ".json": "json"}
_SKIP_DIRS = {"__pycache__", "build", "dist", ".pytest_cache", ".hypothesis"}


# -------------------------------------------------------------------- events
def on_config(config: Any) -> Any:
    global _reference
    _reference = gen.reference_pages(Path(config["docs_dir"]))
    for qualified, source, error in _reference.skipped:
        if source in ("package",):
            log.info("reference: left out %s (%s): %s", qualified, source, error)
        else:  # a provider this repository ships (or torch) must be documented
            log.warning("reference: cannot describe %s (%s): %s", qualified, source, error)
    nav = config["nav"]
    if nav is not None:
        entry = {"Reference": _reference.nav()}
        for i, item in enumerate(nav):
            if isinstance(item, dict) and "Reference" in item:
                nav[i] = entry
                break
        else:
            nav.append(entry)
    return config


def on_files(files: Any, config: Any) -> Any:
    for page in _reference.pages:
        if files.get_file_from_path(page.path) is not None:
            raise PluginError(f"docs/{page.path} exists, but the reference pages are generated: delete the file.")
        files.append(File.generated(config, page.path, content=page.markdown))
    return files


_MARKER = re.compile(r"<!--\s*optcore:([\w-]+)\s*(.*?)\s*-->(?:\n(?P<link>\[[^\]\n]+\]\((?P<target>[^)\s]+)\))[ \t]*$)?",
                     re.MULTILINE)
#: the markers that quote a file or folder, whose plain-file link the build checks
_QUOTING = ("include", "outline", "tree")


def source_link_target(page_src_uri: str, target: str) -> str:
    """The repository path (``plugins/optcore-lion/pyproject.toml``) that a link
    ``target`` on the page ``page_src_uri`` (relative to docs/) names."""
    page_dir = (DOCS / page_src_uri).parent
    return Path(os.path.relpath((page_dir / target).resolve(), ROOT)).as_posix()


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    depth = page.file.src_uri.count("/")

    def expand(match: re.Match[str]) -> str:
        kind, arg = match.group(1), match.group(2)
        where = f"{page.file.src_uri}: <!-- optcore:{kind} {arg} -->"
        handler = _HANDLERS.get(kind)
        if handler is None:
            raise PluginError(f"{where}: unknown marker; known: {', '.join(sorted(_HANDLERS))}")
        if match.group("link"):
            quoted = arg.partition("::")[0].strip().rstrip("/")
            linked = source_link_target(page.file.src_uri, match.group("target"))
            if kind not in _QUOTING or linked != quoted:
                raise PluginError(f"{where}: the link under it names {linked!r}, not what it quotes ({quoted!r})")
        try:
            return handler(arg, depth)
        except PluginError as exc:
            raise PluginError(f"{where}: {exc}") from exc

    return _MARKER.sub(expand, markdown)


# ------------------------------------------------------------------- markers
def _source_path(rel: str) -> Path:
    path = (ROOT / rel).resolve()
    if ROOT not in path.parents or not path.is_file():
        raise PluginError(f"no file {rel!r} under the repository root")
    return path


def _find(tree: ast.Module, dotted: str) -> ast.AST:
    node: Any = tree
    for part in dotted.split("."):
        body = getattr(node, "body", [])
        found = [n for n in body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and n.name == part]
        found += [n for n in body if isinstance(n, (ast.Assign, ast.AnnAssign))
                  and part in [t.id for t in (n.targets if isinstance(n, ast.Assign) else [n.target])
                               if isinstance(t, ast.Name)]]
        if not found:
            raise PluginError(f"no {part!r} in {dotted!r}")
        node = found[0]
    return node


def _start(node: Any) -> int:
    """First line of a definition, decorators included (1-based)."""
    return min([node.lineno, *(d.lineno for d in getattr(node, "decorator_list", []))])


def _segment(lines: list[str], node: Any) -> list[str]:
    return lines[_start(node) - 1 : node.end_lineno]


def _dedent(block: list[str]) -> str:
    indent = min((len(line) - len(line.lstrip()) for line in block if line.strip()), default=0)
    return "\n".join(line[indent:] for line in block)


def _is_docstring(node: Any) -> bool:
    return isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)


def _outline(lines: list[str], cls: ast.ClassDef) -> list[str]:
    """The class with its attributes and docstrings, each method's body replaced by ``...``."""
    out = lines[_start(cls) - 1 : cls.body[0].lineno - 1]  # decorators and the class line
    for i, node in enumerate(cls.body):
        if i and not lines[_start(node) - 2].strip():
            out.append("")  # keep the blank line that separated it in the source
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            out += lines[node.lineno - 1 : node.end_lineno]
            continue
        first = node.body[0]
        if first.lineno == node.lineno:  # a one-line def
            out += _segment(lines, node)
            continue
        out += lines[_start(node) - 1 : first.lineno - 1]  # decorators and signature
        pad = " " * first.col_offset
        if _is_docstring(first):
            doc = lines[first.lineno - 1 : first.end_lineno]
            summary = first.value.value.strip().splitlines()[0]  # type: ignore[attr-defined]
            out += doc if len(doc) == 1 else [f'{pad}"""{summary} ..."""']
        out.append(pad + "...")
    return out


def _quote(arg: str, outline: bool = False) -> str:
    rel, _, symbol = arg.partition("::")
    path = _source_path(rel.strip())
    text = path.read_text(encoding="utf-8")
    title = rel.strip()
    if symbol:
        lines = text.splitlines()
        node = _find(ast.parse(text), symbol.strip())
        if outline:
            if not isinstance(node, ast.ClassDef):
                raise PluginError(f"{symbol!r} is not a class")
            text = _dedent(_outline(lines, node))
        else:
            text = _dedent(_segment(lines, node))
        title = f"{rel.strip()} ({symbol.strip()}{', outline' if outline else ''})"
    lang = _LANGS.get(path.suffix, "text")
    return gen.fenced(text.rstrip("\n"), f'{lang} title="{title}"')


def _include(arg: str, depth: int) -> str:
    return _quote(arg)


def _outline_marker(arg: str, depth: int) -> str:
    return _quote(arg, outline=True)


def _tree(arg: str, depth: int) -> str:
    base = (ROOT / arg).resolve()
    if ROOT not in base.parents or not base.is_dir():
        raise PluginError(f"no folder {arg!r} under the repository root")
    entries = []
    for path in sorted(base.rglob("*")):
        rel = path.relative_to(base)
        if path.is_dir() or any(p in _SKIP_DIRS or p.endswith(".egg-info") for p in rel.parts) \
                or path.suffix in (".pyc", ".so"):
            continue
        entries.append(rel.as_posix())
    return gen.fenced("\n".join([f"{arg.rstrip('/')}/", *(f"  {e}" for e in entries)]), "text")


def _cli_help(arg: str, depth: int) -> str:
    from optcore.cli import build_parser

    old = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "100"  # argparse wraps to the terminal; pin it so builds are reproducible
    try:
        parser = build_parser()
        if arg:
            choices = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction").choices
            if arg not in choices:
                log.info("optcore %s is not in this build of optcore; its help is left out", arg)
                return (f'!!! note "`optcore {arg}` is not installed here"\n\n'
                        f"    The optcore that built this site has no `{arg}` command; "
                        f"`optcore {arg} --help` lists its options where it is installed.")
            parser = choices[arg]
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            parser.print_help()
    finally:
        if old is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = old
    return gen.fenced(f"$ optcore {arg + ' ' if arg else ''}--help\n" + buf.getvalue().rstrip(), "text")


def _conformance_checks(arg: str, depth: int) -> str:
    import inspect

    from optcore.testing import CHECKS

    rows = ["| check | what it asserts |", "|---|---|"]
    for name, fn in CHECKS.items():
        doc = " ".join((inspect.getdoc(fn) or "").split("\n\n", 1)[0].split())
        rows.append(f"| `{name}` | {gen.escape(doc)} |")
    return "\n".join(rows)


def _compare_plot(arg: str, depth: int) -> str:
    if COMPARE_PLOT.exists():
        rel = "../" * depth + "img/compare.png"
        return f"![Loss curves of the default `optcore compare` run]({rel})"
    log.info("docs/img/compare.png is absent: the compare plot is left out of this build")
    return ('!!! note "No plot in this build"\n\n'
            "    The loss curves of the default `optcore compare` run go here once `docs/img/compare.png` "
            "exists: run `optcore compare` and copy the PNG it writes there.")


_HANDLERS = {
    "include": _include,
    "outline": _outline_marker,
    "tree": _tree,
    "cli-help": _cli_help,
    "conformance-checks": _conformance_checks,
    "compare-plot": _compare_plot,
}

"""Reading a config file (JSON, YAML, TOML) within limits.

A config file is small, hand-written data; one that is not must fail at once
with one :class:`ConfigError` saying which limit it broke and by how much,
instead of exhausting time, memory or the stack later:

- the file's size (``MAX_BYTES``) and encoding (UTF-8);
- the nesting depth (``MAX_DEPTH``) and the number of values (``MAX_NODES``)
  *after* YAML aliases are expanded: the "billion laughs" file is a few
  hundred bytes whose nine aliases of aliases stand for 10^9 values. The YAML
  node graph is composed first (linear in the file), its expanded size is
  counted on the graph (memoised, so counting is linear too) and only then is
  it turned into Python objects;
- a recursive alias (``&a [*a]``), which no config can mean.

YAML is read with ``SafeLoader`` (plain data only, nothing is ever constructed
from a tag).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ._errors import ConfigError

#: largest config file read (configs are kilobytes)
MAX_BYTES = 4 * 1024 * 1024
#: deepest nesting of lists/mappings
MAX_DEPTH = 64
#: most values (scalars, lists, mappings) once YAML aliases are expanded
MAX_NODES = 200_000


class _LimitError(Exception):
    """A limit broken while reading: turned into a ConfigError naming the file."""


def _size(n: int) -> str:
    return f"{n / 1024 / 1024:.1f} MiB" if n >= 1024 * 1024 else f"{n} bytes"


def read_config_file(
    path: str | Path, *, max_bytes: int = MAX_BYTES, max_depth: int = MAX_DEPTH, max_nodes: int = MAX_NODES
) -> Any:
    """The plain data of a JSON, YAML or TOML file (see the module docstring)."""
    path = Path(path)
    shown = repr(str(path))
    suffix = path.suffix.lower()
    if suffix not in (".json", ".yaml", ".yml", ".toml"):
        raise ConfigError(f"Unknown config file type {suffix!r} for {shown}: use .json, .yaml/.yml or .toml.")
    try:
        with path.open("rb") as f:
            raw = f.read(max_bytes + 1)
    except OSError as exc:
        raise ConfigError(f"Cannot read config file {shown}: {exc.strerror or exc}.") from None
    if len(raw) > max_bytes:
        size = path.stat().st_size if path.is_file() else len(raw)
        raise ConfigError(
            f"Config file {shown} is too large: {_size(size)}, over the limit of {_size(max_bytes)} "
            "(max_bytes). A config holds settings, not data: keep large data in its own file.",
            problems=[("<file>", f"{size} bytes > {max_bytes}")],
        )
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise ConfigError(
            f"Config file {shown} is not UTF-8 text: byte 0x{raw[exc.start]:02x} at offset {exc.start} "
            f"(line {line}) cannot be decoded. Save the file as UTF-8.",
            problems=[("<file>", "not UTF-8")],
        ) from None
    try:
        if suffix in (".yaml", ".yml"):
            return _load_yaml(text, max_depth, max_nodes)
        if suffix == ".json":
            data = json.loads(text)
        else:
            import tomllib

            data = tomllib.loads(text)
        _check_shape(data, max_depth, max_nodes)
        return data
    except _LimitError as exc:
        raise ConfigError(f"Config file {shown} {exc}", problems=[("<file>", str(exc))]) from None
    except RecursionError:
        raise ConfigError(
            f"Config file {shown} is nested too deeply to parse (limit {max_depth} levels, max_depth).",
            problems=[("<file>", "nested too deeply")],
        ) from None
    except MemoryError:
        raise
    except Exception as exc:  # parse errors of any of the three formats
        from ._values import clean_text

        raise ConfigError(f"Cannot parse {shown}: {clean_text(str(exc), 600)}") from None


def _too_deep(max_depth: int) -> _LimitError:
    return _LimitError(f"nests lists/mappings more than {max_depth} levels deep (limit max_depth={max_depth}).")


def _too_many(count: int, max_nodes: int, aliases: bool) -> _LimitError:
    why = " once its YAML aliases are expanded (a 'billion laughs' file?)" if aliases else ""
    return _LimitError(f"holds more than {max_nodes} values{why}: at least {count} (limit max_nodes={max_nodes}).")


def _check_shape(data: Any, max_depth: int, max_nodes: int) -> None:
    """Depth and value count of parsed JSON/TOML data (no sharing there)."""
    stack = [(data, 1)]
    count = 0
    while stack:
        value, depth = stack.pop()
        count += 1
        if count > max_nodes:
            raise _too_many(count, max_nodes, aliases=False)
        if isinstance(value, (dict, list)):
            if depth > max_depth:
                raise _too_deep(max_depth)
            stack.extend((v, depth + 1) for v in (value.values() if isinstance(value, dict) else value))


def _load_yaml(text: str, max_depth: int, max_nodes: int) -> Any:
    import yaml

    class Loader(yaml.SafeLoader):
        """SafeLoader that refuses to compose deeper than ``max_depth``
        (PyYAML's composer recurses once per level)."""

        level = 0

        def compose_node(self, parent: Any, index: Any) -> Any:
            self.level += 1
            try:
                if self.level > max_depth + 1:
                    raise _too_deep(max_depth)
                return super().compose_node(parent, index)
            finally:
                self.level -= 1

    loader = Loader(text)
    try:
        root = loader.get_single_node()
        if root is None:
            return None
        _check_graph(root, max_depth, max_nodes)
        return loader.construct_document(root)
    finally:
        loader.dispose()


def _children(node: Any) -> list[Any]:
    import yaml

    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    return []


def _check_graph(root: Any, max_depth: int, max_nodes: int) -> None:
    """Expanded size and depth of a YAML node graph, and no cycles.

    An alias is the very node its anchor names, so the graph is a DAG whose
    expansion can be exponential in its size; each node's expanded size is
    computed once (iterative post-order, so a deep graph cannot overflow the
    stack), and a node met again while it is still open is a recursive alias.
    """
    size: dict[int, int] = {}
    depth: dict[int, int] = {}
    open_: set[int] = set()
    stack: list[tuple[Any, bool]] = [(root, False)]
    while stack:
        node, finished = stack.pop()
        key = id(node)
        if finished:
            kids = _children(node)
            size[key] = 1 + sum(size[id(k)] for k in kids)
            depth[key] = 1 + max((depth[id(k)] for k in kids), default=0) if _is_collection(node) else 0
            open_.discard(key)
            if size[key] > max_nodes:
                raise _too_many(size[key], max_nodes, aliases=True)
            if depth[key] > max_depth:
                raise _too_deep(max_depth)
            continue
        if key in size:
            continue
        if key in open_:
            mark = node.start_mark
            raise _LimitError(
                f"has a recursive YAML alias: the value at line {mark.line + 1}, column {mark.column + 1} contains "
                "itself, so it has no finite value. Remove the alias that refers back to its own anchor."
            )
        open_.add(key)
        stack.append((node, True))
        stack.extend((k, False) for k in _children(node))


def _is_collection(node: Any) -> bool:
    import yaml

    return isinstance(node, (yaml.SequenceNode, yaml.MappingNode))

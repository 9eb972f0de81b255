"""YAML within limits: the expanded size of a node graph, counted before any
Python object is made.

The "billion laughs" file is a few hundred bytes whose nine aliases of aliases
stand for 10^9 values. The YAML node graph is composed first (linear in the
file), its expanded size is counted on the graph (memoised, so counting is
linear too) and only then is it turned into Python objects. YAML is read with
``SafeLoader`` (plain data only, nothing is ever constructed from a tag).
"""

from __future__ import annotations

from typing import Any

from ._limits import LimitError, too_deep, too_many


def load_yaml(text: str, max_depth: int, max_nodes: int) -> Any:
    import yaml

    class Loader(yaml.SafeLoader):
        """SafeLoader that refuses to compose deeper than ``max_depth``
        (PyYAML's composer recurses once per level)."""

        level = 0

        def compose_node(self, parent: Any, index: Any) -> Any:
            self.level += 1
            try:
                if self.level > max_depth + 1:
                    raise too_deep(max_depth)
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
                raise too_many(size[key], max_nodes, aliases=True)
            if depth[key] > max_depth:
                raise too_deep(max_depth)
            continue
        if key in size:
            continue
        if key in open_:
            mark = node.start_mark
            raise LimitError(
                f"has a recursive YAML alias: the value at line {mark.line + 1}, column {mark.column + 1} contains "
                "itself, so it has no finite value. Remove the alias that refers back to its own anchor."
            )
        open_.add(key)
        stack.append((node, True))
        stack.extend((k, False) for k in _children(node))


def _is_collection(node: Any) -> bool:
    import yaml

    return isinstance(node, (yaml.SequenceNode, yaml.MappingNode))

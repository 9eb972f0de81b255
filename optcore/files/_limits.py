"""The limits a config file is read within, and the errors that name them.

Shared by the JSON/TOML check here and the YAML graph check of :mod:`._yaml`.
"""

from __future__ import annotations

from typing import Any

from ..guards import MAX_DEPTH, MAX_NODES  # the limits of a config given as Python data too

#: largest config file read (configs are kilobytes)
MAX_BYTES = 4 * 1024 * 1024
__all__ = ["MAX_BYTES", "MAX_DEPTH", "MAX_NODES", "LimitError", "check_shape", "too_deep", "too_many"]


class LimitError(Exception):
    """A limit broken while reading: turned into a ConfigError naming the file."""



def too_deep(max_depth: int) -> LimitError:
    return LimitError(f"nests lists/mappings more than {max_depth} levels deep (limit max_depth={max_depth}).")


def too_many(count: int, max_nodes: int, aliases: bool) -> LimitError:
    why = " once its YAML aliases are expanded (a 'billion laughs' file?)" if aliases else ""
    return LimitError(f"holds more than {max_nodes} values{why}: at least {count} (limit max_nodes={max_nodes}).")


def check_shape(data: Any, max_depth: int, max_nodes: int) -> None:
    """Depth and value count of parsed JSON/TOML data (no sharing there)."""
    stack = [(data, 1)]
    count = 0
    while stack:
        value, depth = stack.pop()
        count += 1
        if count > max_nodes:
            raise too_many(count, max_nodes, aliases=False)
        if isinstance(value, (dict, list)):
            if depth > max_depth:
                raise too_deep(max_depth)
            stack.extend((v, depth + 1) for v in (value.values() if isinstance(value, dict) else value))

"""How deep and how large a config given as Python data may be: the limits
config files are read within (:mod:`optcore.files`), for every entry point.

A config 2,000 levels deep would end in ``RecursionError`` wherever it is
walked, and a list that contains itself would never end; both are refused
here, by one walk without recursion.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .._errors import ConfigError

#: deepest nesting of lists/mappings
MAX_DEPTH = 64
#: most values (scalars, lists, mappings), shared ones counted each time they are reached
MAX_NODES = 200_000


def check_nesting(config: Any, what: str = "The config") -> None:
    """A :class:`ConfigError` if ``config`` nests lists/mappings more than
    :data:`MAX_DEPTH` deep, holds more than :data:`MAX_NODES` values, or contains itself."""
    stack: list[tuple[Any, int, bool]] = [(config, 1, False)]
    on_path: set[int] = set()
    count = 0
    while stack:
        value, depth, leaving = stack.pop()
        if leaving:
            on_path.discard(id(value))
            continue
        count += 1
        if count > MAX_NODES:
            raise ConfigError(
                f"{what} holds more than {MAX_NODES:,} values (limit max_nodes={MAX_NODES}); an optimizer config "
                "holds a few dozen. Check what built it.",
                problems=[("<config>", "too many values")],
            )
        if type(value).__module__.startswith("omegaconf"):
            continue  # converted (and then walked) by to_plain
        if isinstance(value, (Mapping, list, tuple)):
            if id(value) in on_path:
                raise ConfigError(
                    f"{what} contains itself (a {type(value).__name__} inside one of its own values), so it has no "
                    "end; give plain nested mappings and lists.",
                    problems=[("<config>", "contains itself")],
                )
            if depth > MAX_DEPTH:
                raise ConfigError(
                    f"{what} nests lists/mappings more than {MAX_DEPTH} levels deep (limit max_depth={MAX_DEPTH}, "
                    "as for config files); an optimizer config is a few levels deep.",
                    problems=[("<config>", "nested too deep")],
                )
            on_path.add(id(value))
            stack.append((value, depth, True))
            children = value.values() if isinstance(value, Mapping) else value
            stack.extend((child, depth + 1, False) for child in children)

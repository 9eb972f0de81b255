"""Reading a config file (JSON, YAML, TOML) within limits: :func:`load_config_file`.

A subsystem for the applications (``optcore check``/``show``, ``compare``,
``train``, ``memory``), not part of the core: the core takes a config as
data (API.md), and import-linter keeps the core from importing this package.

A config file is small, hand-written data; one that is not must fail at once
with one :class:`ConfigError` saying which limit it broke and by how much,
instead of exhausting time, memory or the stack later:

- the file's size (``MAX_BYTES``) and encoding (UTF-8);
- the nesting depth (``MAX_DEPTH``) and the number of values (``MAX_NODES``),
  for YAML *after* its aliases are expanded (:mod:`._yaml`);
- a recursive alias (``&a [*a]``), which no config can mean.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .._errors import ConfigError
from .._values import clean_text
from ._limits import MAX_BYTES, MAX_DEPTH, MAX_NODES, LimitError, check_shape
from ._yaml import load_yaml

__all__ = ["MAX_BYTES", "MAX_DEPTH", "MAX_NODES", "load_config_file"]


def _has_yaml() -> bool:
    try:
        import yaml  # noqa: F401
    except ImportError:
        return False
    return True


def _size(n: int) -> str:
    return f"{n / 1024 / 1024:.1f} MiB" if n >= 1024 * 1024 else f"{n} bytes"


def load_config_file(
    path: str | Path, *, max_bytes: int = MAX_BYTES, max_depth: int = MAX_DEPTH, max_nodes: int = MAX_NODES
) -> Any:
    """The plain data of a JSON, YAML or TOML file.

    Size, encoding, nesting depth and (alias-expanded) value count are
    limited, so a hostile or broken file is one :class:`ConfigError` at once;
    ``max_bytes``, ``max_depth`` and ``max_nodes`` raise or lower the limits.
    """
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
    if suffix in (".yaml", ".yml") and not _has_yaml():
        raise ConfigError(
            f"Reading {shown} needs PyYAML, which is not installed: pip install 'optcore[yaml]' "
            "(or write the config as JSON or TOML, which need nothing more).",
            problems=[("<file>", "PyYAML is not installed")],
        )
    try:
        if suffix in (".yaml", ".yml"):
            return load_yaml(text, max_depth, max_nodes)
        if suffix == ".json":
            data = json.loads(text)
        else:
            import tomllib

            data = tomllib.loads(text)
        check_shape(data, max_depth, max_nodes)
        return data
    except LimitError as exc:
        raise ConfigError(f"Config file {shown} {exc}", problems=[("<file>", str(exc))]) from None
    except RecursionError:
        raise ConfigError(
            f"Config file {shown} is nested too deeply to parse (limit {max_depth} levels, max_depth).",
            problems=[("<file>", "nested too deeply")],
        ) from None
    except MemoryError:
        raise
    except Exception as exc:  # parse errors of any of the three formats
        # line by line, as the parser wrote it (YAML's caret under the column), each line cleaned
        lines = str(exc).replace('"<unicode string>"', shown).splitlines()
        detail = "\n".join(clean_text(line, 200) for line in lines[:12]) + ("\n..." if len(lines) > 12 else "")
        raise ConfigError(f"Cannot parse {shown}: {detail}", problems=[("<file>", "cannot be parsed")]) from None

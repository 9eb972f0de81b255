"""Config files that cannot be configs fail at once with one ConfigError that
names the limit and the size, instead of exhausting the stack, memory or time."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from optcore import ConfigError
from optcore.files import load_config_file

LAUGHS = "\n".join(
    [f'a: &a [{", ".join(["lol"] * 9)}]']
    + [f"{b}: &{b} [{', '.join(['*' + a] * 9)}]" for a, b in zip("abcdefgh", "bcdefghi")]
)


def write(tmp_path: Path, name: str, content: str | bytes) -> Path:
    path = tmp_path / name
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    return path


def test_plain_files_still_load(tmp_path):
    data = {"optimizer": {"type": "AdamW", "lr": 0.001}, "lr_scheduler": {"type": "cosine"}}
    assert load_config_file(write(tmp_path, "c.json", json.dumps(data))) == data
    yaml = "optimizer: {type: AdamW, lr: 0.001}\nlr_scheduler: {type: cosine}\n"
    assert load_config_file(write(tmp_path, "c.yaml", yaml)) == data
    toml = '[optimizer]\ntype = "AdamW"\nlr = 0.001\n[lr_scheduler]\ntype = "cosine"\n'
    assert load_config_file(write(tmp_path, "c.toml", toml)) == data
    shared = "base: &b {type: AdamW, lr: 0.001}\noptimizer: *b\n"  # an ordinary alias is fine
    assert load_config_file(write(tmp_path, "s.yml", shared))["optimizer"] == {"type": "AdamW", "lr": 0.001}
    assert load_config_file(write(tmp_path, "bom.json", b"\xef\xbb\xbf{}")) == {}


def test_billion_laughs_is_refused_before_it_expands(tmp_path):
    with pytest.raises(ConfigError) as info:
        load_config_file(write(tmp_path, "laughs.yaml", LAUGHS))
    message = str(info.value)
    assert "max_nodes=200000" in message and "aliases" in message and "laughs.yaml" in message


@pytest.mark.parametrize("text", ["a: &a [*a]\n", "optimizer: &o\n  type: AdamW\n  again: *o\n"])
def test_recursive_alias_is_a_config_error(tmp_path, text):
    with pytest.raises(ConfigError, match="recursive YAML alias"):
        load_config_file(write(tmp_path, "r.yaml", text))


def test_non_utf8_is_a_config_error(tmp_path):
    for name in ("b.yaml", "b.json", "b.toml"):
        with pytest.raises(ConfigError, match=r"not UTF-8 text: byte 0xff at offset 7 \(line 2\)"):
            load_config_file(write(tmp_path, name, b"type=1\n\xff\n"))


@pytest.mark.parametrize(
    ("name", "content"),
    [("d.json", "[" * 100_000 + "]" * 100_000), ("d.yaml", "a: " + "[" * 100_000 + "]" * 100_000),
     ("d.toml", "a = " + "[" * 100_000 + "]" * 100_000), ("m.json", "[" * 70 + "]" * 70),
     ("m.yaml", "a: " + "[" * 70 + "]" * 70)],
)
def test_deep_nesting_is_a_config_error(tmp_path, name, content):
    with pytest.raises(ConfigError, match="deep"):
        load_config_file(write(tmp_path, name, content))


def test_size_and_count_limits_name_the_limit(tmp_path):
    big = write(tmp_path, "big.json", json.dumps({"x": "y" * (5 * 1024 * 1024)}))
    with pytest.raises(ConfigError, match=r"too large: 5\.0 MiB, over the limit of 4\.0 MiB \(max_bytes\)"):
        load_config_file(big)
    many = write(tmp_path, "many.json", json.dumps(list(range(300_000))))
    with pytest.raises(ConfigError, match="max_nodes=200000"):
        load_config_file(many)
    assert len(load_config_file(many, max_nodes=400_000)) == 300_000
    with pytest.raises(ConfigError, match="max_depth=2"):
        load_config_file(write(tmp_path, "n.yaml", "a: {b: {c: 1}}\n"), max_depth=2)


def test_unreadable_and_unknown_files_are_config_errors(tmp_path):
    with pytest.raises(ConfigError, match="Cannot read"):
        load_config_file(tmp_path / "missing.yaml")
    with pytest.raises(ConfigError, match="Unknown config file type"):
        load_config_file(write(tmp_path, "c.ini", "x"))
    with pytest.raises(ConfigError, match="Cannot parse"):
        load_config_file(write(tmp_path, "c.yaml", "a: [1\n"))
    with pytest.raises(ConfigError, match="Cannot parse"):
        load_config_file(write(tmp_path, "two.yaml", "a: 1\n---\nb: 2\n"))


def test_a_parse_error_keeps_the_parsers_lines_and_names_the_file(tmp_path):
    """YAML points at the column with a caret on the next line: the lines stay
    lines (not escaped ``\\n``), each cleaned of control characters."""
    path = write(tmp_path, "c.yaml", "lr: [1e-3\n")
    with pytest.raises(ConfigError) as info:
        load_config_file(path)
    lines = str(info.value).splitlines()
    assert lines[0] == f"Cannot parse {str(path)!r}: while parsing a flow sequence"
    assert f"in {str(path)!r}, line 1, column 5:" in lines[1] and lines[3].strip() == "^"
    assert "\\n" not in str(info.value) and "<unicode string>" not in str(info.value)


def test_optcore_check_answers_a_billion_laughs_file_at_once(tmp_path):
    path = write(tmp_path, "laughs.yaml", LAUGHS)
    result = subprocess.run(
        [sys.executable, "-m", "optcore.cli", "check", str(path)], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 1 and "max_nodes" in result.stderr

"""Fuzzed input files for the CLI (issue 40): configs for ``optcore check`` and
``optcore memory --config``, ``--hf-config`` files, and a ``results.json`` that
``compare report`` reads back. Each is crafted junk (bytes that are not UTF-8,
JSON, YAML and TOML of odd shapes and values, escape sequences, huge numbers):
the command answers with a status or an OptcoreError, nothing else escapes, and
nothing it prints holds a raw escape character."""

from __future__ import annotations

import contextlib
import io
import json
import math
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import optcore
from optcore.cli import main
from optcore.compare.records import read_results

LEAF = st.sampled_from([
    None, True, 0, -1, 2**70, 1e-3, -1e9, math.inf, math.nan, "", "AdamW", "Lion", "os:system", "./evil.py:f",
    "\x1b[2J\x1b]0;t\x07", "[bold]x[/", "x" * 3000, "cosine", "optimizer", "type", "lr",
])  # fmt: skip
KEYS = st.sampled_from(["type", "lr", "name", "optimizer", "configs", "param_groups", "lr_scheduler", "params",
                        "betas", "precision", "fallback", "results", "rows", "task", "\x1b[31m", ""])
DATA = st.recursive(LEAF, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(KEYS, inner, max_size=4),
                    max_leaves=12)  # fmt: skip


def _text(data, suffix: str) -> str:
    if suffix == ".json":
        return json.dumps(data)
    if suffix == ".yaml":
        import yaml

        return yaml.safe_dump(data)
    return "\n".join(f"{k!s} = {json.dumps(v)}" for k, v in data.items()) if isinstance(data, dict) else str(data)


CONTENT = st.one_of(
    st.tuples(DATA, st.sampled_from([".json", ".yaml", ".toml"])).map(lambda d: (_text(*d).encode("utf-8",
                                                                                                    "surrogatepass"), d[1])),
    st.tuples(st.binary(max_size=200), st.sampled_from([".json", ".yaml", ".toml"])),
    st.tuples(st.sampled_from([b"&a [*a]", b"a: &a [*a, *a]\nb: *a", b"[" * 5000, b'{"a": 1e999}', b"\xef\xbb\xbf{}",
                               b"!!python/object/apply:os.system ['true']"]), st.just(".yaml")),
)  # fmt: skip


def _run(argv: list[str]) -> str:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main(argv)
        except optcore.OptcoreError:
            pass
        except SystemExit as exc:  # argparse's usage error: a status, as main's own returns are
            assert isinstance(exc.code, int)
    printed = out.getvalue() + err.getvalue()
    assert "\x1b" not in printed and "\x07" not in printed, printed[:300]
    return printed


@settings(max_examples=60, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])  # fmt: skip
@given(content=CONTENT)
def test_a_fuzzed_config_file_is_checked_or_refused(content):
    raw, suffix = content
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / f"config{suffix}"
        path.write_bytes(raw)
        _run(["check", str(path)])
        _run(["memory", "--params", "1000", "--config", str(path)])


@settings(max_examples=40, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])  # fmt: skip
@given(data=DATA, garbage=st.binary(max_size=100))
def test_a_fuzzed_results_file_is_read_or_refused_by_name(data, garbage):
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "results.json"
        for raw in (json.dumps(data).encode(), garbage):
            path.write_bytes(raw)
            try:
                read_results(path)
            except optcore.ConfigError as exc:
                assert "results.json" in str(exc) and "\x1b" not in str(exc)


@pytest.mark.parametrize("config", [
    {"model_type": "llama", "num_hidden_layers": 10**9, "hidden_size": 8, "intermediate_size": 8,
     "num_attention_heads": 1, "vocab_size": 10},
    {"model_type": "llama", "hidden_size": "\x1b[2J"}, {"model_type": "\x1b]0;t\x07"}, {"auto_map": {"AutoConfig": "evil.C"}},
    [], "x",
])  # fmt: skip
def test_a_crafted_hf_config_is_refused_at_once(tmp_path, config):
    pytest.importorskip("transformers")
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    printed = _run(["memory", "--hf-config", str(path), "--optimizers", "AdamW"])
    assert "error" in printed.lower()

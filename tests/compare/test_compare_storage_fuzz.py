"""Fuzzers over the records a shared storage holds (issue 40): crafted trial attributes,
results and sweep settings go into the record models directly (many examples) and into a
real SQLite storage through ``compare report`` (fewer). Only OptcoreError subclasses
escape, nothing the models let through breaks the code past them, and the report
prints no raw escape character and no stored text as markup."""

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
from test_compare_storage import ENTRY, _craft, _meta, _result  # the crafted storages of the unit tests

import optcore
from optcore.cli import main
from optcore.compare import records

optuna = pytest.importorskip("optuna")

NASTY = st.sampled_from([
    None, True, 0, -1, 2**70, 1.5, math.nan, math.inf, -math.inf, "", "x" * 30_000, "[bold]x[/", "[/]", "\x1b[2J",
    "\x1b]0;t\x07", "$\\frac$", "warmup", "défaults", [], [None], {}, {"entries": 1}, [[1, 2, 3]], {"a": {"b": {}}},
])  # fmt: skip
JSONISH = st.recursive(NASTY | st.text(max_size=20) | st.floats(), lambda inner: st.lists(inner, max_size=3)
                       | st.dictionaries(st.text(max_size=8), inner, max_size=3), max_leaves=8)  # fmt: skip
TRIAL = {"phase": "defaults", "config": "AdamW", "slot": 0, "seed": 0, "lr": 0.01, "entry": ENTRY}


def _mutated(base: dict, draw_ops: list) -> dict:
    """``base`` with keys dropped or set to crafted values (nested keys by ``a.b``)."""
    out = json.loads(json.dumps(base))
    for key, value in draw_ops:
        holder, _, leaf = out, None, key
        if "." in key:
            top, leaf = key.split(".", 1)
            holder = out.get(top) if isinstance(out.get(top), dict) else out
        if value == "<drop>":
            holder.pop(leaf, None)
        else:
            holder[leaf] = value
    return out


def _ops(keys: list[str]) -> st.SearchStrategy:
    return st.lists(st.tuples(st.sampled_from(keys), st.just("<drop>") | JSONISH), min_size=1, max_size=4)


CASES = [
    (records.TrialRecord, TRIAL, ["phase", "config", "slot", "seed", "lr", "point", "entry", "entry.name",
                                  "entry.optimizer", "study", "pruned_at", "extra"]),
    (records.RunResult, _result(), ["name", "status", "final", "best", "best_step", "losses", "val_losses", "error",
                                    "warnings", "isolation", "jobs", "config", "built", "peak_rss", "lr"]),
    (records.SweepRecord, _meta(), ["format", "task", "task.spec", "steps", "seeds", "lr_sweep", "lrs", "entries",
                                    "spaces", "protocol", "protocol.trials", "protocol.sampler", "summary", "target"]),
]  # fmt: skip


@pytest.mark.parametrize(("model", "base", "keys"), CASES, ids=[c[0].__name__ for c in CASES])
def test_crafted_records_are_accepted_within_bounds_or_refused_by_name(model, base, keys):
    @settings(max_examples=150, deadline=None, derandomize=True)
    @given(ops=_ops(keys))
    def check(ops):
        raw = _mutated(base, ops)
        try:
            record = records.parse(model, raw, "study 's', key 'k'")
        except optcore.OptcoreError as exc:
            assert "study 's', key 'k'" in str(exc) and "\x1b" not in str(exc)
            return
        plain = records.plain(record)
        json.dumps(plain, allow_nan=False)  # finite numbers only: what passed is JSON the reports can use
        assert len(json.dumps(plain)) < 10 * len(json.dumps(raw, default=str)) + 10_000

    check()


def test_a_crafted_storage_gives_a_report_or_a_refusal_never_a_traceback(monkeypatch):
    from optcore.compare import report, scoreboard

    for module, name in ((report, "plot_curves"), (report, "plot_sweep"), (scoreboard, "plot_profile")):
        monkeypatch.setattr(module, name, lambda *a, **k: None)  # what is stored and printed, not drawn
    shown = "[b]AdamW[/b]"  # a valid name that is markup: it must print as written
    entry = {**ENTRY, "name": shown}
    good = {**TRIAL, "config": shown, "entry": entry}

    @settings(max_examples=12, deadline=None, derandomize=True,
              suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])  # fmt: skip
    @given(where=st.sampled_from(["optcore", "result", "meta"]), ops=st.data())
    def check(where, ops):
        meta, attrs, result = _meta(entries=[entry]), {**good, "slot": 1}, _result(shown)
        if where == "optcore":
            attrs = _mutated(attrs, ops.draw(_ops(CASES[0][2])))
        elif where == "result":
            result = _mutated(result, ops.draw(_ops(CASES[1][2])))
        else:
            meta = _mutated(meta, ops.draw(_ops(CASES[2][2])))
        with tempfile.TemporaryDirectory() as folder:
            url = f"sqlite:///{Path(folder) / 's.db'}"
            _craft(url, meta, [(good, _result(shown)), (attrs, result)])
            out, err = io.StringIO(), io.StringIO()
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                rc = main(["compare", "report", "--storage", url, "--study", "s", "--out", str(Path(folder) / "r")])
        text = out.getvalue() + err.getvalue()
        assert rc in (0, 1) and "Traceback" not in text and "\x1b" not in text and "\x07" not in text
        if rc == 0:
            assert shown in text  # printed as text, not taken for bold
        else:
            assert "Bad stored record (study 's', key 'optcore')" in err.getvalue()

    check()

"""``optcore compare --seeds``, ``--lr-sweep`` / ``--lrs`` and ``--budget``."""

from __future__ import annotations

import json
import statistics

import pytest

import optcore
from optcore.cli import main
from optcore.compare import sweep


def _compare(tmp_path, *extra: str, names: str = "AdamW,torch:SGD", steps: int = 3) -> dict:
    out = tmp_path / "out"
    rc = main(["compare", "--optimizers", names, "--steps", str(steps), "--in-process", "--quiet",
               "--out", str(out), *extra])  # fmt: skip
    assert rc == 0
    return json.loads((out / "results.json").read_text())


def _row(name: str, final: float | None, sd: float | None) -> dict:
    return {"name": name, "final": final, "final_sd": sd}


def test_overlapping_spreads_are_a_tie_and_separate_ones_are_ranked():
    rows = sweep.rank([_row("b", 2.10, 0.02), _row("a", 2.00, 0.01), _row("c", 2.11, 0.02), _row("x", None, None)])
    assert [(r["name"], r["rank"]) for r in rows] == [("a", "1"), ("b", "2="), ("c", "2="), ("x", "-")]
    assert rows[1]["tie_with"] == ["c"]
    assert sweep.ranking_line(rows) == "a > b = c (tie)"
    one_seed = sweep.rank([_row("b", 2.10, None), _row("a", 2.00, None)])  # no spread: strict order
    assert [r["rank"] for r in one_seed] == ["1", "2"]


def test_seeds_give_mean_and_spread(tmp_path):
    doc = _compare(tmp_path, "--seeds", "0,1,2")
    assert doc["settings"]["seeds"] == [0, 1, 2] and len(doc["results"]) == 6
    for row in doc["rows"]:
        finals = [r["final"] for r in doc["results"] if r["name"] == row["name"]]
        assert sorted(r["seed"] for r in doc["results"] if r["name"] == row["name"]) == [0, 1, 2]
        assert row["n_seeds"] == 3 and len(set(finals)) == 3  # the seeds differ
        assert row["final"] == pytest.approx(statistics.fmean(finals))
        assert row["final_sd"] == pytest.approx(statistics.stdev(finals))


def test_seeds_table_shows_spread_and_ties(tmp_path, capsys):
    _compare(tmp_path, "--seeds", "0,1", names="AdamW,adamw")  # the same optimizer twice: a tie
    printed = capsys.readouterr().out
    assert "±" in printed and "(tie)" in printed and "1=" in printed


def test_sweep_grid_is_a_3x_log_grid_around_the_own_lr():
    entry = {"name": "a", "optimizer": {"type": "AdamW", "lr": 1e-2}}
    assert sweep.sweep_lrs(entry, 3, None) == [0.00333, 0.01, 0.03]
    assert sweep.sweep_lrs(entry, 5, None) == [0.00111, 0.00333, 0.01, 0.03, 0.09]
    assert sweep.sweep_lrs({"name": "b", "optimizer": {"type": "Adam"}}, 3, None) == [0.000333, 0.001, 0.003]  # default
    assert sweep.sweep_lrs(entry, None, [1e-3, 3e-3]) == [1e-3, 3e-3]
    assert sweep.sweep_lrs(entry, None, None) == [None]


def test_lr_sweep_picks_the_best_lr_and_plots_the_sweep(tmp_path):
    doc = _compare(tmp_path, "--lr-sweep", "--seeds", "0,1", names="AdamW")
    (row,) = doc["rows"]
    assert len(doc["results"]) == 6 and row["swept"]
    means = {s["lr"]: s["mean"] for s in row["sweep"]}
    assert sorted(means) == [0.00333, 0.01, 0.03]
    assert row["lr"] == min(means, key=means.get) and row["final"] == min(means.values())
    for r in doc["results"]:
        assert r["config"]["optimizer"]["lr"] == r["lr"]  # each run really ran at its lr
    assert (tmp_path / "out" / "lr_sweep.png").read_bytes()[:4] == b"\x89PNG"


def test_explicit_lrs(tmp_path):
    doc = _compare(tmp_path, "--lrs", "1e-3,1e-2", names="AdamW")
    assert sorted(r["lr"] for r in doc["results"]) == [1e-3, 1e-2]
    with pytest.raises(optcore.ConfigError, match="positive"):
        sweep.parse_lrs("1e-3,-1")


@pytest.mark.parametrize(("text", "seconds"), [("90s", 90), ("10m", 600), ("1h", 3600), ("1h30m", 5400), ("45", 45)])
def test_durations(text, seconds):
    assert sweep.parse_duration(text) == seconds


def test_bad_duration():
    with pytest.raises(optcore.ConfigError, match="90s, 10m or 1h"):
        sweep.parse_duration("ten minutes")


def test_budget_cuts_the_runs_that_would_not_fit_and_says_which():
    runs = sweep.plan([{"name": "a", "optimizer": {"type": "AdamW", "lr": 1e-2}},
                       {"name": "b", "optimizer": {"type": "SGD", "lr": 0.1}}], [0, 1])  # fmt: skip
    assert [(r.config, r.seed) for r in runs] == [("a", 0), ("b", 0), ("a", 1), ("b", 1)]  # one of each first
    budget = sweep.Budget(25.0)
    spent = 0.0
    for run, wall in zip(runs, (10.0, 12.0, 10.0, 12.0)):
        if budget.allows(run, spent):
            budget.record(run, wall)
            spent += wall
    assert spent <= 25.0 and [(r.config, r.seed) for r in budget.cut] == [("a", 1), ("b", 1)]
    assert budget.describe_cuts() == "cut 2 runs to stay within 25 s: a (seed 1); b (seed 1)"


def test_budget_from_the_cli(tmp_path, capsys):
    doc = _compare(tmp_path, "--seeds", "0,1,2", "--budget", "0.5s", names="AdamW,torch:SGD", steps=3)
    assert len(doc["results"]) < doc["planned_runs"] == 6 and doc["cut"].startswith("cut ")
    assert "Budget" in capsys.readouterr().out

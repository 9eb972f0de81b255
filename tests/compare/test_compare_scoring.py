"""optcore.compare.scoring: time to target, AlgoPerf targets, performance profiles and the score,
against hand-computed cases, AlgoPerf's own procedure (re-derived here with numpy) and properties."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import optcore
from optcore.cli import main
from optcore.compare import scoreboard, scoring

INF = math.inf


# ------------------------------------------------------------------ time to target
def test_time_to_target_is_the_first_evaluation_at_or_below_the_target():
    steps, losses, seconds = [0, 10, 20, 30], [3.0, 2.5, 2.0, 2.2], [0.0, 1.0, 2.1, 3.3]
    hit = scoring.time_to_target(steps, losses, 2.2, seconds)
    assert (hit.steps, hit.seconds, hit.reached) == (20, 2.1, True)
    assert scoring.time_to_target(steps, losses, 2.5, seconds).steps == 10  # equal counts as reached
    assert scoring.time_to_target(steps, losses, 3.5).steps == 0  # met before training
    assert scoring.time_to_target(steps, losses, 2.2).seconds is None  # no times recorded


def test_a_miss_and_a_diverged_run():
    miss = scoring.time_to_target([0, 10, 20], [3.0, 2.5, 2.1], 2.0, [0.0, 1.0, 2.0])
    assert (miss.steps, miss.seconds, miss.reached) == (None, None, False)
    diverged = scoring.time_to_target([0, 10, 20], [3.0, None, None], 2.0)
    assert not diverged.reached
    assert scoring.time_to_target([0, 10, 20], [3.0, math.nan, 1.0], 2.0).steps == 20  # a NaN point is skipped


def test_time_to_target_refuses_ragged_or_unordered_curves():
    with pytest.raises(ValueError, match="one step and one loss"):
        scoring.time_to_target([0, 10], [1.0], 1.0)
    with pytest.raises(ValueError, match="one time"):
        scoring.time_to_target([0, 10], [1.0, 0.5], 1.0, [0.0])
    with pytest.raises(ValueError, match="step order"):
        scoring.time_to_target([10, 0], [1.0, 0.5], 1.0)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.none(), st.floats(0.0, 5.0)), min_size=1, max_size=12), st.floats(0.0, 5.0))
def test_time_to_target_is_the_first_index_at_or_below(losses, target):
    steps = [10 * i for i in range(len(losses))]
    seconds = [0.5 * s for s in steps]
    hit = scoring.time_to_target(steps, losses, target, seconds)
    first = next((i for i, v in enumerate(losses) if v is not None and v <= target), None)
    assert hit.steps == (None if first is None else steps[first])
    assert hit.seconds == (None if first is None else seconds[first])


# ------------------------------------------------------------------ targets
def test_share_zero_is_algoperfs_best_median_of_each_references_best_losses():
    # A: median(1.0, 1.2, 1.1) = 1.1; B: median(0.9, 2.0, failed=inf) = 2.0
    assert scoring.reference_target({"A": [1.0, 1.2, 1.1], "B": [0.9, 2.0, None]}, share=0) == (1.1, "A")
    assert scoring.reference_target({"A": [2.0], "B": [1.5]}, share=0) == (1.5, "B")  # one seed: the best run
    assert scoring.reference_target({"A": [None], "B": []}, share=0) is None


def test_the_default_target_is_the_loss_three_in_four_configs_reach():
    best = {"A": [1.0], "B": [1.2, 1.4, 1.3], "C": [1.5], "D": [2.0], "E": [1.1]}  # medians 1.0 1.3 1.5 2.0 1.1
    # ceil(0.75 x 5) = 4: the 4th lowest median, C's 1.5; A, E, B and C are at or below it, D is not
    assert scoring.REACH_SHARE == 0.75 and scoring.reference_target(best) == (1.5, "C")
    assert scoring.reference_target(best, share=1.0) == (2.0, "D")  # every config's best: the worst one
    assert scoring.reference_target(best, share=0.5) == (1.3, "B")  # ceil(2.5) = 3
    assert scoring.reference_target({f"c{i}": [float(i)] for i in range(10)}, share=0.7) == (6.0, "c6")  # 7, not 8
    with pytest.raises(ValueError, match=r"in \[0, 1\]"):
        scoring.reference_target(best, share=1.5)


def test_the_default_target_when_configs_diverge_tie_or_stand_alone():
    diverged = [None, math.nan, math.inf]
    assert scoring.reference_target({"A": [None], "B": [math.nan], "C": [math.inf, None], "D": []}) is None
    # a config that failed on half of its seeds or more has no median: it neither sets nor loosens the target
    assert scoring.reference_target({"A": [1.0], "B": [2.0], "X": [0.5, None], "Y": diverged}) == (2.0, "B")
    assert scoring.reference_target({"only": [3.0, 2.0, None]}) == (3.0, "only")  # one config: its own median
    assert scoring.reference_target({"only": [1.7]}, share=0) == (1.7, "only")
    # ties: one loss, named by the first name in order, whatever the mapping's order
    tied = {"B": [1.0], "A": [1.0], "C": [1.0], "D": [3.0]}
    assert scoring.reference_target(tied) == (1.0, "C")  # ceil(3) = 3: A, B, C
    assert scoring.reference_target(tied, share=0) == (1.0, "A")
    assert scoring.reference_target(dict(reversed(tied.items())), share=0.5) == (1.0, "B")


@settings(max_examples=200, deadline=None)
@given(
    st.dictionaries(st.text("abcdef", min_size=1, max_size=3),
                    st.lists(st.one_of(st.none(), st.floats(0.0, 10.0)), min_size=1, max_size=4), max_size=8),
    st.floats(0.0, 1.0),
)  # fmt: skip
def test_the_target_is_the_lowest_loss_that_the_share_of_finite_configs_is_at_or_below(best, share):
    found = scoring.reference_target(best, share)
    medians = [np.median([math.inf if v is None else v for v in vs]) for vs in best.values()]
    finite = [m for m in medians if math.isfinite(m)]
    if not finite:
        assert found is None
        return
    loss, name = found
    need = max(1, math.ceil(share * len(finite) - 1e-9))
    assert sum(m <= loss for m in finite) >= need  # that share reaches it (their medians are at or below) ...
    assert sum(m < loss for m in finite) < need  # ... and no lower loss would do
    assert np.median([math.inf if v is None else v for v in best[name]]) == loss


def test_parse_targets():
    assert scoring.parse_targets("2.1", ["a", "b"]) == {"a": 2.1, "b": 2.1}
    assert scoring.parse_targets("a=2.1, b=0.4", ["a", "b"]) == {"a": 2.1, "b": 0.4}
    assert scoring.parse_targets("b=1e-2", ["a", "b"]) == {"b": 0.01}  # a: set from the references
    for bad, message in (("x", "like 2.1"), ("c=1", "not compared here"), ("1,2", "one loss for every task"),
                         ("", "named no loss"), ("a=inf", "like 2.1")):  # fmt: skip
        with pytest.raises(optcore.ConfigError, match=message):
            scoring.parse_targets(bad, ["a", "b"])


# ------------------------------------------------------------------ profiles and the score
HAND = {"A": [10.0, 20.0, INF], "B": [20.0, 10.0, 30.0]}
# ratios: A 1, 2, inf; B 2, 1, 1


def test_profile_by_hand():
    assert scoring.profile_ratios(HAND) == {"A": [1.0, 2.0, INF], "B": [2.0, 1.0, 1.0]}
    profile = scoring.performance_profile(HAND, [1.0, 1.5, 2.0, 4.0])
    assert profile["A"] == pytest.approx([1 / 3, 1 / 3, 2 / 3, 2 / 3])
    assert profile["B"] == pytest.approx([2 / 3, 2 / 3, 1.0, 1.0])


def test_score_by_hand():
    # area under rho from 1 to 4, / 3: A (3 + 2 + 0) / 9, B (2 + 3 + 3) / 9
    assert scoring.profile_score(HAND) == pytest.approx({"A": 5 / 9, "B": 8 / 9})
    assert scoring.profile_score({"A": [1.0], "B": [4.0]}) == {"A": 1.0, "B": 0.0}  # 4x the fastest earns nothing
    assert scoring.profile_score({"A": [INF], "B": [INF]}) == {"A": 0.0, "B": 0.0}  # nobody solved it
    assert scoring.profile_score({"A": [0.0], "B": [0.0]}) == {"A": 1.0, "B": 1.0}  # met before training


def test_profiles_refuse_misaligned_or_negative_times():
    with pytest.raises(ValueError, match="one time per problem"):
        scoring.profile_score({"A": [1.0], "B": [1.0, 2.0]})
    with pytest.raises(ValueError, match=">= 0 or inf"):
        scoring.profile_score({"A": [-1.0]})
    with pytest.raises(ValueError, match="above 1"):
        scoring.profile_score(HAND, max_tau=1.0)


def _algoperf(times: dict[str, list[float]], max_tau: float = 4.0, points: int = 100) -> dict[str, float]:
    """AlgoPerf's procedure (scoring/performance_profile.py): ratios to the per-problem minimum,
    rho at ``points`` evenly spaced taus in [1, max_tau], trapezoid area divided by the tau range."""
    names = list(times)
    table = np.array([times[n] for n in names], dtype=float)
    with np.errstate(invalid="ignore", divide="ignore"):
        ratios = table / table.min(axis=0)
    taus = np.linspace(1.0, max_tau, points)
    rho = np.stack([(ratios <= tau).sum(axis=1) / table.shape[1] for tau in taus], axis=1)
    area = ((rho[:, 1:] + rho[:, :-1]) / 2 * np.diff(taus)).sum(axis=1) / (max_tau - 1)
    return dict(zip(names, area.tolist()))


TIMES = st.lists(st.one_of(st.floats(1.0, 1000.0), st.just(INF)), min_size=1, max_size=6)


@st.composite
def time_tables(draw: st.DrawFn) -> dict[str, list[float]]:
    n = draw(st.integers(1, 6))
    k = draw(st.integers(1, 4))
    column = st.lists(st.one_of(st.floats(1.0, 1000.0), st.just(INF)), min_size=n, max_size=n)
    return {f"opt{i}": draw(column) for i in range(k)}


@settings(max_examples=150, deadline=None)
@given(time_tables())
def test_score_is_algoperfs_up_to_its_grid(times):
    exact, grid = scoring.profile_score(times), _algoperf(times)
    for name in times:
        assert 0.0 <= exact[name] <= 1.0
        assert exact[name] == pytest.approx(grid[name], abs=3 / 99 + 1e-9)  # one grid step per problem at most
    dense = _algoperf(times, points=30_001)
    assert all(exact[n] == pytest.approx(dense[n], abs=1e-3) for n in times)


@settings(max_examples=100, deadline=None)
@given(time_tables(), st.floats(0.01, 100.0))
def test_score_ignores_the_unit_of_time_and_rewards_being_fastest(times, unit):
    scaled = {n: [t * unit for t in ts] for n, ts in times.items()}
    assert scoring.profile_score(scaled) == pytest.approx(scoring.profile_score(times))
    fastest = {**times, "best": [min(col) / 2 if math.isfinite(min(col)) else 1.0 for col in zip(*times.values())]}
    assert scoring.profile_score(fastest)["best"] == 1.0  # fastest on every problem: the maximum


# ------------------------------------------------------------------ summarise: runs as compare stores them
def _run(seed: int, losses: list[float | None], task: str = "", every: int = 10, step_s: float = 0.1) -> dict:
    steps = [i * every for i in range(len(losses))]
    return {"seed": seed, "task": task, "val_losses": [[s, v] for s, v in zip(steps, losses)],
            "eval_seconds": [s * step_s for s in steps]}  # fmt: skip


def test_summarise_with_a_given_target():
    runs = {
        "fast": [_run(0, [3.0, 2.0, 1.5]), _run(1, [3.0, 2.4, 1.9])],
        "slow": [_run(0, [3.0, 2.5, 2.0], step_s=0.05), _run(1, [3.0, 2.6, 2.3])],
    }
    s = scoring.summarise(runs, target=2.0)
    assert s["targets"] == {"": {"loss": 2.0, "source": "given", "set_by": None}}
    assert s["problems"] == [{"task": "", "seed": 0}, {"task": "", "seed": 1}]
    fast, slow = s["optimizers"]["fast"], s["optimizers"]["slow"]
    assert [(r["steps"], r["seconds"]) for r in fast["reach"]] == [(10, 1.0), (20, 2.0)]
    assert [(r["steps"], r["seconds"]) for r in slow["reach"]] == [(20, 1.0), (None, None)]
    assert (fast["reached"], slow["reached"], fast["of"]) == (2, 1, 2)
    # by steps: fast 1, 1; slow 2, miss -> (3 + 3) / 6 and (2 + 0) / 6
    assert (fast["score_steps"], slow["score_steps"]) == pytest.approx((1.0, 1 / 3))
    # by seconds: seed 0 both at 1.0 s (slow steps are cheaper) -> ratio 1 each
    assert (fast["score_seconds"], slow["score_seconds"]) == pytest.approx((1.0, 0.5))
    times = scoring.profile_times(s, "steps")
    assert times == {"fast": [10.0, 20.0], "slow": [20.0, INF]}


def test_summarise_sets_the_target_from_the_references_and_scores_tasks_together():
    runs = {
        "A": [_run(0, [3.0, 2.0, 1.0], "a"), _run(1, [3.0, 2.0, 1.2], "a"), _run(0, [5.0, 4.0], "b")],
        "B": [_run(0, [3.0, 1.4, 1.1], "a"), _run(1, [3.0, 1.3, 1.3], "a")],  # no run on task b: a miss
    }
    s = scoring.summarise(runs, target={"b": 4.5})
    # task a: medians of best losses A 1.1, B 1.2; ceil(0.75 x 2) = 2 -> 1.2, set by B; task b: given
    assert s["targets"]["a"] == {"loss": pytest.approx(1.2), "source": "reference", "set_by": "B", "share": 0.75}
    assert s["targets"]["b"]["source"] == "given"
    assert [(p["task"], p["seed"]) for p in s["problems"]] == [("a", 0), ("a", 1), ("b", 0)]
    assert [r["steps"] for r in s["optimizers"]["A"]["reach"]] == [20, 20, 10]
    assert [r["steps"] for r in s["optimizers"]["B"]["reach"]] == [20, None, None]  # seed 1's best is 1.3
    assert [r["ran"] for r in s["optimizers"]["B"]["reach"]] == [True, True, False]
    # ratios A 1, 1, 1; B 1, miss, miss -> 9 / 9 and 3 / 9
    assert s["optimizers"]["A"]["score_steps"] == pytest.approx(1.0)
    assert s["optimizers"]["B"]["score_steps"] == pytest.approx(1 / 3)
    # AlgoPerf's best median (share 0): 1.1, set by A, which B reaches on seed 0 only, at its last evaluation
    best = scoring.summarise(runs, target={"b": 4.5}, share=0)
    assert best["targets"]["a"] == {"loss": pytest.approx(1.1), "source": "reference", "set_by": "A", "share": 0}
    assert [r["steps"] for r in best["optimizers"]["A"]["reach"]] == [20, None, 10]
    assert [r["steps"] for r in best["optimizers"]["B"]["reach"]] == [20, None, None]  # 1.1 <= 1.1 at step 20
    only_b = scoring.summarise(runs, reference=["B"])
    assert only_b["targets"]["a"]["set_by"] == "B" and only_b["targets"]["b"]["loss"] is None
    with pytest.raises(optcore.ConfigError, match="not among"):
        scoring.summarise(runs, reference=["C"])


def test_summarise_when_every_config_diverged_has_no_target_and_says_so():
    from rich.console import Console

    # A diverged after its first evaluation (step 0, before training), B never had a finite loss,
    # D never got below its untrained loss, and C failed to build: none of them trained
    runs = {"A": [_run(0, [3.0, None, None])], "B": [_run(0, [None, None])], "C": [], "D": [_run(0, [3.0, 3.0, 3.2])]}
    s = scoring.summarise(runs)
    assert s["targets"][""] == {"loss": None, "source": "reference", "set_by": None, "share": 0.75}
    assert all(e["reached"] == 0 and e["score_steps"] == 0.0 for e in s["optimizers"].values())
    console = Console(record=True, width=200)
    scoreboard.render_scores(s, console, "t")
    text = console.export_text()
    assert "no config finished with a finite loss" in text and "Note" not in text


def test_a_config_that_did_not_train_neither_sets_the_target_nor_meets_it_at_step_0():
    """A diverged run's only finite loss is often the one before training: were it its best,
    a quarter of the configs diverging would set the target there, and every config would
    meet it at step 0 with the same score."""
    assert scoring.trained_best(_run(0, [3.0, None, None])) is None
    assert scoring.trained_best(_run(0, [3.0, 3.0, 3.5])) is None  # never below its loss before training
    assert scoring.trained_best(_run(0, [3.0, 2.0, None])) == 2.0  # it diverged later: it reached 2.0
    assert scoring.trained_best({"val_losses": [[5, 2.5], [10, 2.0]]}) == 2.0  # no step-0 evaluation
    runs = {"ok": [_run(0, [3.0, 2.5, 2.0])], "boom": [_run(0, [3.0, None, None])]}
    s = scoring.summarise(runs)
    assert (s["targets"][""]["loss"], s["targets"][""]["set_by"]) == (2.0, "ok")
    assert [r["steps"] for r in s["optimizers"]["ok"]["reach"]] == [20]
    assert s["optimizers"]["boom"]["reached"] == 0 and s["optimizers"]["ok"]["score_steps"] == 1.0


def test_summarise_counts_the_fastest_of_several_runs_of_one_problem_and_needs_times_for_seconds():
    runs = {"A": [_run(0, [3.0, 2.5, 1.0]), _run(0, [3.0, 1.0, 1.0])], "B": [_run(0, [3.0, 1.0])]}
    del runs["B"][0]["eval_seconds"]
    s = scoring.summarise(runs, target=1.0)
    assert s["optimizers"]["A"]["reach"][0]["steps"] == 10
    assert s["optimizers"]["A"]["score_steps"] == 1.0 and s["optimizers"]["A"]["score_seconds"] is None


# ------------------------------------------------------------------ the compare command
def _compare(out, *extra: str, names: str = "AdamW,torch:SGD", steps: int = 6) -> int:
    return main(["compare", "--optimizers", names, "--steps", str(steps), "--in-process", "--quiet",
                 "--out", str(out), *extra])  # fmt: skip


def test_compare_scores_time_to_target_and_draws_the_profile_over_seeds(tmp_path, capsys):

    out = tmp_path / "out"
    assert _compare(out, "--seeds", "0,1", "--target", "4.0") == 0
    printed = capsys.readouterr().out
    assert "time to target" in printed and "score (steps)" in printed and "profile.png" in printed
    assert "give --target" not in printed
    doc = json.loads((out / "results.json").read_text())
    scores = doc["scores"]
    assert scores["targets"] == {"char-lm": {"loss": 4.0, "source": "given", "set_by": None}}
    assert scores["problems"] == [{"task": "char-lm", "seed": 0}, {"task": "char-lm", "seed": 1}]
    for row in doc["rows"]:
        reach = scores["optimizers"][row["name"]]["reach"]
        for r, i in zip(reach, row["runs"]):
            run = doc["results"][i]
            assert len(run["eval_seconds"]) == len(run["val_losses"]) and run["eval_seconds"][0] == 0.0
            first = next((s for s, v in run["val_losses"] if v is not None and v <= 4.0), None)
            assert r["steps"] == first  # the first evaluation at or below the target, from the stored curve
    assert (out / "profile.png").read_bytes()[:4] == b"\x89PNG"
    # the scores come from the stored document alone: rebuilt, they are the live ones
    rebuilt = scoring.summarise(scoreboard.runs_by_optimizer(doc), {"char-lm": 4.0})
    assert rebuilt == scores


def test_compare_without_a_target_sets_it_from_the_runs(tmp_path, capsys):
    out = tmp_path / "out"
    assert _compare(out) == 0
    assert "give --target" in capsys.readouterr().out  # and says what such a target is worth
    doc = json.loads((out / "results.json").read_text())
    target = doc["scores"]["targets"]["char-lm"]
    best = {r["name"]: r["best"] for r in doc["results"]}
    assert target["source"] == "reference" and target["share"] == scoring.REACH_SHARE
    assert target["loss"] == max(best.values())  # 2 configs: ceil(0.75 x 2) = 2, both reach it
    assert best[target["set_by"]] == target["loss"]
    assert all(doc["scores"]["optimizers"][name]["reached"] == 1 for name in best)
    assert not (out / "profile.png").exists()  # one problem: no profile to draw


def _separates(scores: dict) -> None:
    """A time-to-target table that carries information: most configs reach the target,
    at different times, and their scores differ (neither all equal nor all zero)."""
    entries = scores["optimizers"]
    (target,) = scores["targets"].values()
    assert target["source"] == "reference" and target["loss"] is not None
    reached = {name: e for name, e in entries.items() if e["reached"]}
    assert len(reached) >= math.ceil(scoring.REACH_SHARE * len(entries)) - 1, (target, entries)  # most: one may fail
    assert len(reached) > len(entries) / 2
    assert len({scoreboard.median_reached(e, "steps") for e in reached.values()}) >= 2  # the reachers differ
    by_steps = [e["score_steps"] for e in entries.values()]
    assert len(set(by_steps)) >= 2 and sum(s > 0 for s in by_steps) > len(by_steps) / 2
    assert 0 < sum(s == 1.0 for s in by_steps) < len(by_steps)  # a fastest, and slower ones


def test_the_default_run_committed_in_docs_separates_the_configs():
    """The README's default run (``optcore compare``, 300 steps, docs/results/compare.json),
    scored from its stored runs: with the best config's own best loss as target, 10 of its
    11 configs missed and scored 0."""
    doc = json.loads((Path(__file__).resolve().parents[2] / "docs" / "results" / "compare.json").read_text())
    scores = scoring.summarise(scoreboard.runs_by_optimizer(doc))
    assert len(scores["optimizers"]) == 11
    _separates(scores)
    algoperf = scoring.summarise(scoreboard.runs_by_optimizer(doc), share=0)  # the best config's own best loss
    assert sum(e["reached"] for e in algoperf["optimizers"].values()) == 1


def test_the_default_line_up_without_a_target_separates_the_configs(tmp_path, capsys):
    """``optcore compare`` as ``scripts/dev demo`` runs it (every default config, no
    --target), over a short budget."""
    out = tmp_path / "out"
    assert main(["compare", "--steps", "30", "--in-process", "--quiet", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    doc = json.loads((out / "results.json").read_text())
    assert len(doc["rows"]) >= 4 and all(row["status"] == "ok" for row in doc["rows"])
    _separates(doc["scores"])
    table = printed[printed.index("time to target") :]
    assert table.count(" miss ") < len(doc["rows"]) / 2 and "75% of the configs reach" in " ".join(table.split())


def test_a_bad_target_fails_before_anything_runs(tmp_path, capsys):
    assert _compare(tmp_path / "out", "--target", "vision=2") == 1
    assert "not compared here" in capsys.readouterr().err and not (tmp_path / "out").exists()


def test_compare_on_several_tasks_scores_them_together(tmp_path, capsys):
    out = tmp_path / "out"
    task = "examples/my_task.py:task"
    assert _compare(out, "--task", f"char-lm,{task}", "--target", f"char-lm=4.0,{task}=10", steps=4) == 0
    printed = capsys.readouterr().out
    assert "2 tasks (char-lm, examples/my_task.py:task)" in printed
    doc = json.loads((out / "results.json").read_text())
    assert doc["complete"] and sorted(doc["tasks"]) == ["char-lm", task]
    for spec, entry in doc["tasks"].items():
        one = json.loads((out / entry["folder"] / "results.json").read_text())
        assert one["task"]["spec"] == spec and one["scores"]["targets"][spec]["source"] == "given"
    assert [(p["task"], p["seed"]) for p in doc["scores"]["problems"]] == [("char-lm", 0), (task, 0)]
    assert (out / "profile.png").read_bytes()[:4] == b"\x89PNG"
    assert "Partial" not in printed and doc["unfinished"] == doc["not_run"] == []
    # stopped in its first task (the second never ran): the scores say they are partial, everywhere
    first = json.loads((out / doc["tasks"]["char-lm"]["folder"] / "results.json").read_text())
    (tmp_path / "cut").mkdir()
    assert scoreboard.score_tasks({"char-lm": {**first, "complete": False}}, tmp_path / "cut", complete=False,
                                  tasks=["char-lm", task]) == 0  # fmt: skip
    printed = " ".join(capsys.readouterr().out.split())
    assert f"1 tasks (char-lm), PARTIAL (unfinished: char-lm; not run: {task})" in printed
    assert "Partial scores" in printed and "Run the same command again" in printed
    cut = json.loads((tmp_path / "cut" / "results.json").read_text())
    assert not cut["complete"] and cut["unfinished"] == ["char-lm"] and cut["not_run"] == [task]
    # a live run whose --budget cut runs of a task is not interrupted, yet that task did not finish
    budget = {**first, "complete": True, "cut": "cut 1 run to stay within 1 s: AdamW (seed 1)"}
    assert scoreboard.score_tasks({"char-lm": budget}, tmp_path / "cut", complete=True, tasks=["char-lm"]) == 0
    assert "PARTIAL (unfinished: char-lm)" in " ".join(capsys.readouterr().out.split())
    assert not json.loads((tmp_path / "cut" / "results.json").read_text())["complete"]
    with pytest.raises(optcore.ConfigError, match="each task once"):
        scoreboard.compare_tasks(argparse.Namespace(task="a,a", target=None), lambda a: 0, tmp_path)


def test_several_tasks_check_every_task_before_running_any(tmp_path, capsys):
    assert _compare(tmp_path / "out", "--task", "char-lm,no-such-task") == 1
    assert "no-such-task" in capsys.readouterr().err and not (tmp_path / "out" / "char-lm").exists()


def test_scores_read_another_section_of_a_document_and_the_default_task():
    run = {"seed": 0, "status": "ok", "val_losses": [[0, 3.0], [10, 1.0]], "eval_seconds": [0.0, 1.0]}
    doc = {"task": {"spec": "char-lm"}, "rows": [{"name": "A", "status": "ok", "runs": [0]}], "results": [run],
           "tuned": {"rows": [{"name": "A", "status": "ok", "runs": [1]}], "results": [{}, {**run, "seed": 7}]}}
    assert [r["seed"] for r in scoreboard.runs_by_optimizer(doc)["A"]] == [0]
    assert [r["seed"] for r in scoreboard.runs_by_optimizer(doc, part=doc["tuned"])["A"]] == [7]
    assert scoreboard.parse_target("2.0", None) == {"char-lm": 2.0}  # no --task: the default one


def test_several_tuned_tasks_are_scored_by_their_re_seeded_runs(tmp_path):
    """With --trials, each task's table scores the chosen points' re-seeded runs; the
    scores over all tasks must read the same runs, not the runs at defaults."""
    from optcore.compare.train import empty_result

    run = {**empty_result({"name": "A", "optimizer": {"type": "AdamW"}}),
           "val_losses": [[0, 3.0], [10, 1.0]], "eval_seconds": [0.0, 1.0]}  # fmt: skip

    def compare_one(args):
        folder = Path(args.out)
        folder.mkdir(parents=True)
        doc = {"task": {"spec": args.task}, "summary": args.task, "complete": True,
               "rows": [{"name": "A", "status": "ok", "runs": [0]}], "results": [{**run, "seed": 0}],
               "tuned": {"rows": [{"name": "A", "status": "ok", "runs": [0, 1]}],
                         "results": [{**run, "seed": 1}, {**run, "seed": 2}]}}
        (folder / "results.json").write_text(json.dumps(doc))
        return 0

    args = argparse.Namespace(task="char-lm,vision", target="char-lm=2.0,vision=2.0")
    assert scoreboard.compare_tasks(args, compare_one, tmp_path) == 0
    scores = json.loads((tmp_path / "results.json").read_text())["scores"]
    assert [(p["task"], p["seed"]) for p in scores["problems"]] == [
        ("char-lm", 1), ("char-lm", 2), ("vision", 1), ("vision", 2)]

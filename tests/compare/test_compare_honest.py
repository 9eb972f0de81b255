"""The compare pictures and rankings say what the data says: no seam in the smoothed
training curve, the mean over seeds drawn where the legend gives the mean, and no
order between results whose difference is within their noise."""

from __future__ import annotations

import itertools
import json
import math
import statistics

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from optcore.cli import main
from optcore.compare import report, sweep


# ------------------------------------------------------------------ the smoothed training curve
def _second_differences(values):
    return [abs(a - 2 * b + c) for a, b, c in zip(values, values[1:], values[2:])]


def _trailing(values, window=20):
    """The trailing average the plot used to draw (a mean of fewer points before step 20)."""
    return [statistics.fmean(values[max(0, i - window + 1) : i + 1]) for i in range(len(values))]


def test_the_smoothed_curve_has_no_seam_where_the_window_fills():
    loss = [2 + 2.2 * math.exp(-t / 25) for t in range(1, 301)]  # a typical falling training loss
    bend = max(_second_differences(loss))
    assert max(_second_differences(report.smooth(loss))) < 3 * bend
    # the trailing average bends ~10x harder than the loss ever does, at step 19-20: the kink users saw
    old = _second_differences(_trailing(loss))
    assert max(old) > 9 * bend and old.index(max(old)) in (17, 18)
    assert max(abs(s - v) for s, v in zip(report.smooth(loss), loss)) < 0.05  # and it does not lag (trailing: 0.5)


def test_smoothing_keeps_a_straight_curve_and_the_ends_and_stops_at_a_divergence():
    ramp = [3.0 - 0.01 * i for i in range(100)]
    assert report.smooth(ramp) == pytest.approx(ramp)
    noisy = [1.0, 3.0] * 30
    smoothed = report.smooth(noisy)
    assert smoothed[0] == 1.0 and smoothed[-1] == 3.0 and smoothed[30] == pytest.approx(2.0, abs=0.05)
    cut = report.smooth([1.0] * 30 + [None])
    assert cut[-1] is None and cut[19] == 1.0 and cut[20] is None  # windows that reach the missing loss


# ------------------------------------------------------------------ the mean over seeds
def _seed(losses, vals):
    return {"losses": losses, "val_losses": vals, "status": "ok"}


def _figure(monkeypatch, rows, results):
    """Draw the loss plot and keep the figure instead of closing it."""
    import matplotlib.pyplot as plt

    kept = []
    monkeypatch.setattr(plt, "close", kept.append)
    report.plot_curves(rows, results, {"summary": "test", "seeds": [0, 1]}, report.Path("/dev/null"))
    return kept[0]


def test_the_loss_plot_draws_the_mean_over_seeds_with_a_band(monkeypatch, tmp_path):
    results = [
        _seed([4.0 - 0.01 * i for i in range(50)], [[0, 4.5], [25, 3.9], [50, 3.6]]),
        _seed([3.0 - 0.01 * i for i in range(50)], [[0, 4.5], [25, 3.1], [50, 2.8]]),
    ]
    row = {"name": "A", "runs": [0, 1], "final": 3.2, "final_sd": statistics.stdev([3.6, 2.8]), "status": "ok"}
    curves = report.row_curves(row, results)
    xs, mean, sd = curves["val"]
    assert xs == [0, 25, 50] and mean == pytest.approx([4.5, 3.5, 3.2]) and sd[-1] == pytest.approx(row["final_sd"])
    assert mean[-1] == pytest.approx(row["final"])  # the curve ends where the legend's mean is
    fig = _figure(monkeypatch, [row], results)
    ax_train, ax_val = fig.axes
    (train_line,) = ax_train.get_lines()
    assert list(train_line.get_ydata()) == pytest.approx([3.5 - 0.01 * i for i in range(50)])  # not seed 0's 4.0...
    (val_line,) = ax_val.get_lines()
    assert list(val_line.get_ydata()) == pytest.approx([4.5, 3.5, 3.2])
    assert len(ax_val.collections) == 1 and "mean over seeds" in ax_val.get_title()  # the ± sd band, and it says so
    assert "mean ± sd" in fig.legends[0].get_title().get_text()


def test_one_seed_draws_that_seed_without_a_band(monkeypatch):
    results = [_seed([2.0] * 30, [[0, 3.0], [30, 2.0]])]
    row = {"name": "A", "runs": [0], "final": 2.0, "final_sd": None, "status": "ok"}
    fig = _figure(monkeypatch, [row], results)
    assert not fig.axes[1].collections and "mean" not in fig.axes[1].get_title()


def test_compare_with_two_seeds_plots_their_mean(tmp_path, monkeypatch):
    out = tmp_path / "out"
    assert main(["compare", "--optimizers", "AdamW", "--steps", "4", "--seeds", "0,1", "--in-process", "--quiet",
                 "--out", str(out)]) == 0  # fmt: skip
    doc = json.loads((out / "results.json").read_text())
    (row,) = doc["rows"]
    _, mean, _ = report.row_curves(row, doc["results"])["val"]
    assert mean[-1] == pytest.approx(row["final"]) and len({r["final"] for r in doc["results"]}) == 2


def _sweep_figure(monkeypatch, rows):
    import matplotlib.pyplot as plt

    kept = []
    monkeypatch.setattr(plt, "close", kept.append)
    report.plot_sweep(rows, {"summary": "test"}, report.Path("/dev/null"))
    return kept[0]


def _sweep_row(name, finished, diverged):
    sweep_points = [{"lr": lr, "mean": loss, "sd": None, "status": "ok"} for lr, loss in finished]
    sweep_points += [{"lr": lr, "mean": None, "sd": None, "status": "diverged"} for lr in diverged]
    best_lr, best = min(finished, key=lambda p: p[1])
    return {"name": name, "swept": True, "sweep": sorted(sweep_points, key=lambda p: p["lr"]), "lr": best_lr,
            "final": best}  # fmt: skip


def test_the_sweep_plot_shows_the_diverged_lrs_beyond_the_largest_finished_one(monkeypatch):
    # SGD's tuning on char-lm: finished up to lr 0.375, diverged from 0.618 up
    sgd = _sweep_row("SGD", [(0.01, 2.9), (0.1, 2.5), (0.375, 2.4)], [0.618, 0.807, 1.27])
    adamw = _sweep_row("AdamW", [(1e-4, 3.1), (1e-3, 2.3), (3e-3, 2.35)], [])
    ax = _sweep_figure(monkeypatch, [adamw, sgd]).axes[0]
    low, high = ax.get_xlim()
    assert low <= 1e-4 and high >= 1.27  # the axis spans every lr that ran, the diverged ones included
    crosses = [line for line in ax.get_lines() if line.get_marker() == "x"]
    assert len(crosses) == 1 and list(crosses[0].get_xdata()) == [0.618, 0.807, 1.27]
    assert "diverged" in crosses[0].get_label() and crosses[0].get_label().startswith("SGD")
    assert all(0 < y <= 1 for y in crosses[0].get_ydata())  # a strip inside the axes, whatever the losses
    (band,) = ax.patches
    left, right = band.get_x(), band.get_x() + band.get_width()
    assert left == pytest.approx(0.618) and right >= 1.27 and right < 2  # the unstable region, shaded
    assert any("diverged" in t.get_text() for t in ax.get_legend().get_texts())


def test_a_sweep_without_diverged_lrs_has_no_strip_or_band(monkeypatch):
    ax = _sweep_figure(monkeypatch, [_sweep_row("AdamW", [(1e-4, 3.1), (1e-3, 2.3)], [])]).axes[0]
    assert not [line for line in ax.get_lines() if line.get_marker() == "x"] and not ax.patches


def test_diverged_lrs_between_finished_ones_are_marked_but_not_shaded_as_one_region(monkeypatch):
    row = _sweep_row("Lion", [(1e-4, 3.0), (1e-2, 2.8)], [1e-3])
    ax = _sweep_figure(monkeypatch, [row]).axes[0]
    (crosses,) = [line for line in ax.get_lines() if line.get_marker() == "x"]
    assert list(crosses.get_xdata()) == [1e-3] and not ax.patches


def test_a_trial_that_blew_up_but_finished_does_not_flatten_the_others(monkeypatch):
    # SGD's tuning on a teacher-student regression: lr 0.135 ended at 2.4e7 without diverging
    sgd = _sweep_row("SGD", [(0.01, 0.3), (0.03, 0.25), (0.135, 2.4e7)], [0.18, 0.26])
    adamw = _sweep_row("AdamW", [(1e-3, 1.9), (1e-2, 1.1), (7e-2, 0.8)], [])
    ax = _sweep_figure(monkeypatch, [adamw, sgd]).axes[0]
    assert ax.get_yscale() == "log"  # 0.25 and 1.1 stay apart on the plot
    assert ax.get_ylim()[0] <= 0.25 and ax.get_ylim()[1] >= 2.4e7
    ax = _sweep_figure(monkeypatch, [adamw]).axes[0]
    assert ax.get_yscale() == "linear"  # losses within two decades keep a linear axis


# ------------------------------------------------------------------ ties
def _row(name, final, sd=None):
    return {"name": name, "final": final, "final_sd": sd}


def test_one_seed_does_not_order_a_difference_within_the_noise():
    # the newcomer's case: AdamW 0.0008 below Lion with one seed, and the other order on another run
    rows = sweep.rank([_row("Lion", 2.1716), _row("AdamW", 2.1708)])
    assert [r["rank"] for r in rows] == ["1=", "1="] and sweep.ranking_line(rows) == "AdamW = Lion (tie)"
    apart = sweep.rank([_row("b", 2.10), _row("a", 2.00)])  # 5% apart: beyond 1% noise each
    assert [(r["name"], r["rank"]) for r in apart] == [("a", "1"), ("b", "2")]
    assert sweep.NOISE_REL == 0.01


def test_a_wide_spread_ties_everything_it_overlaps_not_just_its_neighbour():
    # b and c are clearly apart, but a's spread covers both: nothing orders a against c
    rows = sweep.rank([_row("a", 1.00, 0.5), _row("b", 1.01, 0.001), _row("c", 1.30, 0.001), _row("d", 3.0, 0.01)])
    assert [(r["name"], r["rank"]) for r in rows] == [("a", "1="), ("b", "1="), ("c", "1="), ("d", "4")]


FINALS = st.lists(st.tuples(st.floats(0.5, 5.0), st.one_of(st.none(), st.floats(0.0, 0.3))), min_size=1, max_size=7)


@settings(max_examples=200, deadline=None)
@given(FINALS, st.randoms())
def test_ranks_are_separated_intervals_whatever_the_input_order(finals, rnd):
    rows = [_row(f"o{i}", f, sd) for i, (f, sd) in enumerate(finals)]
    ranked = sweep.rank([dict(r) for r in rows])
    shuffled = [dict(r) for r in rows]
    rnd.shuffle(shuffled)
    assert {r["name"]: r["rank"] for r in sweep.rank(shuffled)} == {r["name"]: r["rank"] for r in ranked}
    assert [r["final"] for r in ranked] == sorted(r["final"] for r in ranked)

    def interval(r):
        noise = max(r["final_sd"] or 0.0, sweep.NOISE_REL * r["final"])
        return r["final"] - noise, r["final"] + noise

    for better, worse in itertools.combinations(ranked, 2):
        if better["rank"] != worse["rank"]:  # ordered: the data separates them
            assert interval(better)[1] < interval(worse)[0]
        elif abs(better["final"] - worse["final"]) < 1e-12:
            assert better["rank"].endswith("=")  # equal finals are always a tie


def test_a_diverged_run_is_drawn_up_to_its_last_finite_loss():
    results = [{"losses": [3.0 - 0.01 * i for i in range(40)] + [None], "val_losses": [[0, 3.5], [20, 2.9], [40, None]],
                "status": "diverged"}]  # fmt: skip
    row = {"name": "A", "runs": [0], "final": None, "final_sd": None, "status": "diverged"}
    curves = report.row_curves(row, results)
    xs, mean, _ = curves["train"]
    assert len(mean) == 40 and mean[-1] == pytest.approx(3.0 - 0.39)  # the last finite loss, not cut 10 steps early
    assert curves["val"][:2] == ([0, 20], [3.5, 2.9])


def test_the_protocol_table_says_how_a_config_at_defaults_ended():
    """A config whose runs at defaults diverged reads "diverged" under "at defaults", not "-"."""
    from rich.console import Console

    from optcore.compare import tuning

    def record(name):
        return {"tuned": True, "space": {}, "studies": [{"study": 0, "trials": [], "best": 0.5, "best_trial": 0,
                "pruned": 0, "diverged": 0}], "score": 0.5, "chosen": {"point": {"lr": 0.01}, "lr": 0.01},
                "unstable": tuning.unstable_region([])}  # fmt: skip

    doc = {"protocol": {"trials": 1, "studies": 1, "sampler": "sobol", "sampler_seed": 0, "tuning_seed": 0,
                        "seeds": [1]},
           "rows": [{"name": "SGD", "status": "diverged", "final": None, "final_sd": None},
                    {"name": "AdamW", "status": "ok", "final": 1.25, "final_sd": None}],
           "tuned": {"optimizers": {"SGD": record("SGD"), "AdamW": record("AdamW")},
                     "rows": [{"name": n, "rank": "1=", "final": 0.5, "final_sd": None} for n in ("SGD", "AdamW")]}}
    console = Console(record=True, width=200)
    tuning.render_protocol(doc, console)
    lines = {line.split("│")[2].strip(): line for line in console.export_text().splitlines() if line.count("│") > 3}
    assert "diverged" in lines["SGD"].split("│")[3] and "1.250" in lines["AdamW"].split("│")[3]

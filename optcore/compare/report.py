"""What a comparison shows: the rich table, the PNG plots and ``results.json``.

``results.json`` is rewritten (atomically) after every finished run, so an
interrupted comparison keeps what finished. The table's loss columns are
held-out losses; the progress bar shows the training loss and says so.
"""

from __future__ import annotations

import json
import math
import os
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from optcore import __version__

from .text import label, shown
from .tuning import unstable_region

#: The lr-sweep plot's loss axis is logarithmic where the finished losses span more than this factor.
LOG_Y_SPAN = 100.0


def human_bytes(n: float | None) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)  # pragma: no cover


def fmt(value: float | None, spec: str) -> str:
    return "-" if value is None or not math.isfinite(value) else format(value, spec)


def describe(config: Mapping[str, Any], built: str | None = None) -> str:
    """``optcore-lion:Lion lr=0.003 weight_decay=0.1 + cosine``: what was built."""
    opt = config.get("optimizer")
    if not isinstance(opt, Mapping):
        return str(built or opt)
    text = " ".join([str(built or opt.get("type"))] + [f"{k}={v}" for k, v in opt.items() if k != "type"])
    sched = config.get("lr_scheduler")
    if sched is not None:
        text += f" + {sched.get('type') if isinstance(sched, Mapping) else sched}"
    return text


def _final(row: Mapping[str, Any]) -> str:
    if row["final"] is None:
        return "-"
    spread = f" ± {row['final_sd']:.3f}" if row.get("final_sd") is not None else ""
    return f"{row['final']:.3f}{spread}"


def render_table(rows: Sequence[Mapping[str, Any]], meta: Mapping[str, Any], console: Any) -> None:
    from rich.table import Table

    seeds = meta["seeds"]
    table = Table(
        title=f"optcore compare: {shown(meta['summary'], 400)}",
        caption=(
            f"held-out final: held-out loss at the end{' (mean ± sd over seeds ' + ','.join(map(str, seeds)) + ')' if len(seeds) > 1 else ''}; "
            "rank: '=' marks a tie (mean ± noise overlap; noise: the sd over seeds, at least 1% of the loss); "
            "lr: the chosen lr (* = best of a sweep); best: lowest held-out loss at any evaluation; steps/s: training "
            "steps only; state: optimizer state (+ fp32 master "
            f"copies for precision wrappers); peak RSS: {shown(meta['memory_note'], 600)}"
        ),
    )
    for col, justify in (
        ("#", "right"), ("config (built)", "left"), ("lr", "right"), ("held-out final", "right"),
        ("best (step)", "right"), ("steps/s", "right"), ("state", "right"), ("B/param", "right"),
        ("peak RSS", "right"), ("Δ RSS", "right"), ("skipped", "right"), ("status", "left"),
    ):  # fmt: skip
        table.add_column(col, justify=justify, no_wrap=col != "config (built)", overflow="ellipsis")
    detail = console.width >= 130  # the hyper-parameters fit on a second line
    for r in rows:
        status = "ok" if r["status"] == "ok" else f"[red]{shown(r['status'])}[/red]"
        table.add_row(
            r["rank"],
            f"[bold]{shown(r['name'])}[/bold]" + (f"\n[dim]{shown(describe(r['config'], r['built']), 400)}[/dim]"
                                                  if detail else ""),
            ("-" if r["lr"] is None else f"{r['lr']:g}") + ("*" if r["swept"] else ""),
            _final(r),
            f"{fmt(r['best'], '.3f')} ({r['best_step']})" if r["best"] is not None else "-",
            fmt(r["steps_per_s"], ".1f"),
            human_bytes(r["state_bytes"]),
            fmt(r["state_bytes_per_param"], ".1f"),
            human_bytes(r["peak_rss"]),
            human_bytes(r["peak_rss_delta"]),
            "-" if r["skipped_steps"] is None else str(r["skipped_steps"]),
            status,
        )
    console.print(table)


def print_notes(rows: Sequence[Mapping[str, Any]], results: Sequence[Mapping[str, Any]], console: Any) -> None:
    """Warnings once per config, and every error with its config's name."""
    seen: set[tuple[str, str]] = set()
    for r in results:
        for message in r.get("warnings") or ():
            if (r["name"], message) not in seen:
                seen.add((r["name"], message))
                console.print(f"[yellow]{shown(r['name'])}[/yellow] {shown(message, 400)}", highlight=False)
    for row in rows:
        if row["error"]:
            console.print(f"[red]{shown(row['name'])}[/red] {shown(row['status'])}: {shown(row['error'], 400)}",
                          highlight=False)


def write_results(path: Path, doc: Mapping[str, Any]) -> None:
    """Write ``doc`` to ``path`` atomically: a reader (or a Ctrl-C) never sees half a file."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps({"optcore_version": __version__, **doc}, indent=1, default=str))
    os.replace(tmp, path)


# -------------------------------------------------------------------- plots
#: The training-loss curves are smoothed over up to ``2 * SMOOTH_HALF + 1`` steps.
SMOOTH_HALF = 10


def smooth(values: Sequence[float | None], half: int = SMOOTH_HALF) -> list[float | None]:
    """A centred moving average: each point is the mean of the ``half`` steps on either
    side of it and itself, fewer (but as many on each side) at the two ends.

    Centred, so a straight stretch of the curve stays where it is (a trailing
    average lags a falling loss by half its window); shrinking symmetrically at
    the ends, so the first point is the first loss and the curve has no seam
    where a full window first fits. A window that holds a missing (non-finite)
    loss gives None: the curve stops where the run diverged."""
    out: list[float | None] = []
    n = len(values)
    for i in range(n):
        k = min(half, i, n - 1 - i)
        window = [v for v in values[i - k : i + k + 1] if v is not None]
        out.append(sum(window) / len(window) if len(window) == 2 * k + 1 else None)
    return out


def _mean_sd(columns: Sequence[Sequence[float | None]]) -> tuple[list[float], list[float]]:
    """Pointwise mean and standard deviation (0 for one curve) of equally long curves,
    up to the first point one of them lacks."""
    mean: list[float] = []
    sd: list[float] = []
    for column in zip(*columns):
        point = [v for v in column if v is not None]
        if len(point) < len(column):
            break
        mean.append(statistics.fmean(point))
        sd.append(statistics.stdev(point) if len(point) > 1 else 0.0)
    return mean, sd


def _finite_prefix(values: Sequence[float | None]) -> list[float | None]:
    return list(values[: values.index(None)] if None in values else values)


def row_curves(row: Mapping[str, Any], results: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """What the loss plot draws for one row: over the row's runs (its seeds at its
    chosen lr) the mean and standard deviation of the smoothed training loss per
    step and of the held-out loss per evaluation, as the table's mean ± sd is."""
    # a config with no finished lr has runs at several lrs: its first run stands for it, as in the table
    runs = [results[i] for i in (row["runs"] if row["status"] == "ok" else row["runs"][:1])]
    trains = [smooth(_finite_prefix(r["losses"])) for r in runs]  # a diverged run's curve ends at its last loss
    length = min(len(t) for t in trains) if trains else 0
    train_mean, train_sd = _mean_sd([t[:length] for t in trains])
    evals = [dict(r["val_losses"]) for r in runs]
    steps = [s for s, _ in runs[0]["val_losses"] if all(s in e for e in evals)] if runs else []
    val_mean, val_sd = _mean_sd([[e[s] for s in steps] for e in evals])
    return {
        "seeds": len(runs),
        "train": (list(range(1, len(train_mean) + 1)), train_mean, train_sd),
        "val": (steps[: len(val_mean)], val_mean, val_sd),
    }


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_curves(rows: Sequence[Mapping[str, Any]], results: Sequence[Mapping[str, Any]], meta: Mapping[str, Any],
                path: Path, loss_label: str = "loss") -> None:  # fmt: skip
    """Training loss (smoothed) and held-out loss per config at its chosen lr, one
    colour each: the mean over its seeds with a band of ± one standard deviation
    (the legend's mean ± sd), zoomed on the last 90% of training."""
    plt = _pyplot()
    fig, (ax_train, ax_val) = plt.subplots(1, 2, figsize=(14, 5.2), dpi=110, layout="constrained")
    shown = [(row, row_curves(row, results)) for row in rows if row["runs"] and results[row["runs"][0]]["losses"]]
    colors = plt.get_cmap("tab10" if len(shown) <= 10 else "tab20").colors
    late: list[float] = []
    several = any(curves["seeds"] > 1 for _, curves in shown)
    for i, (row, curves) in enumerate(shown):
        color = colors[i % len(colors)]
        text = f"{label(row['name'])}  {_final(row)}" + ("" if row["status"] == "ok" else f" ({row['status']})")
        panels = ((ax_train, curves["train"], {}), (ax_val, curves["val"], {"marker": "o", "ms": 3}))
        for ax, (xs, mean, sd), style in panels:
            ax.plot(xs, mean, color=color, lw=1.4, label=text if ax is ax_val else None, **style)
            if curves["seeds"] > 1:
                ax.fill_between(xs, [m - s for m, s in zip(mean, sd)], [m + s for m, s in zip(mean, sd)],
                                color=color, alpha=0.18, lw=0)  # fmt: skip
        xs, mean, _ = curves["train"]
        cut = max(1, len(mean) // 10)
        late += mean[cut:] + [v for s, v in zip(*curves["val"][:2]) if s >= cut]
    over = " (mean over seeds, band ± sd)" if several else ""
    titles = (f"training loss, centred moving average of {2 * SMOOTH_HALF + 1} steps{over}", f"held-out loss{over}")
    for ax, title in zip((ax_train, ax_val), titles):
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        if late:
            low, high = min(late), max(late)
            ax.set_ylim(low - 0.05 * (high - low) - 0.01, high + 0.1 * (high - low) + 0.01)
    ax_train.set_ylabel(label(loss_label))
    if shown:
        legend_title = "config, held-out final" + (" (mean ± sd)" if several else "")
        fig.legend(title=legend_title, loc="outside right upper", fontsize=9, title_fontsize=9)
    fig.suptitle(f"optcore compare: {label(meta['summary'], 200)}", fontsize=11)
    fig.savefig(path)
    plt.close(fig)


def plot_sweep(rows: Sequence[Mapping[str, Any]], meta: Mapping[str, Any], path: Path, loss_label: str = "loss") -> None:
    """Final held-out loss against the learning rate, one line per optimizer
    (error bars: the spread over seeds), the chosen lr ringed.

    A run that diverged has no final loss, so its lr is drawn as a cross on a strip
    along the top of the plot, and an optimizer's unstable region (every lr from its
    smallest diverged one up, when all of them lie above the lrs that finished) is
    shaded: the x-axis spans every lr that was run, not only those that finished."""
    from matplotlib.transforms import blended_transform_factory

    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(9, 5.2), dpi=110, layout="constrained")
    colors = plt.get_cmap("tab10" if len(rows) <= 10 else "tab20").colors
    strip = blended_transform_factory(ax.transData, ax.transAxes)
    swept = [r for r in rows if r["swept"]]
    for i, row in enumerate(swept):
        color = colors[i % len(colors)]
        points = [s for s in row["sweep"] if s["lr"] is not None and s["mean"] is not None]
        failed = [s for s in row["sweep"] if s["lr"] is not None and s["mean"] is None]
        if points:
            ax.errorbar([s["lr"] for s in points], [s["mean"] for s in points], yerr=[s["sd"] or 0.0 for s in points],
                        color=color, marker="o", ms=4, lw=1.4, capsize=3, label=label(row["name"]))  # fmt: skip
        if row["final"] is not None:
            ax.plot([row["lr"]], [row["final"]], "o", ms=11, mfc="none", mec=color, mew=1.6)
        if not failed:
            continue
        height = 0.97 - 0.035 * i
        ax.plot([s["lr"] for s in failed], [height] * len(failed), "x", ms=7, mew=1.8, color=color, transform=strip,
                label=f"{label(row['name'])}: {', '.join(sorted({s['status'] for s in failed}))}")  # fmt: skip
        ax.update_datalim([(s["lr"], points[0]["mean"] if points else 0.0) for s in failed], updatey=False)
        region = unstable_region([{"lr": s["lr"], "status": "ok" if s["mean"] is not None else s["status"]}
                                  for s in row["sweep"] if s["lr"] is not None])  # fmt: skip
        if region["from_lr"] is not None:
            ax.axvspan(region["from_lr"], max(region["diverged_lrs"]) * 1.15, color=color, alpha=0.08, lw=0)
    ax.autoscale_view()
    ax.set_xscale("log")
    finals = [s["mean"] for r in swept for s in r["sweep"] if s["mean"] is not None and math.isfinite(s["mean"])]
    if finals and min(finals) > 0 and max(finals) > LOG_Y_SPAN * min(finals):
        ax.set_yscale("log")  # one run that blew up without diverging would flatten every other point
    ax.set_xlabel("learning rate (x on the top strip: diverged; shaded: unstable region)")
    ax.set_ylabel(f"final held-out {label(loss_label)}")
    ax.grid(alpha=0.3, which="both")
    ax.set_title(f"lr sweep (ringed: chosen): {label(meta['summary'], 200)}", fontsize=10)
    ax.legend(fontsize=9, loc="best")
    fig.savefig(path)
    plt.close(fig)

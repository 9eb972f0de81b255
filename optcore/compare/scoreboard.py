"""Time to target in ``optcore compare``: ``--target`` and ``--task a,b,c``.

Reads what the compare command stored (``results.json``'s rows and runs) and
adds, through :mod:`.scoring`, each optimizer's steps and seconds to the target
loss, its performance profile and its AlgoPerf-style score: a ``scores``
section in ``results.json``, a table, and ``profile.png`` where there are
several problems (tasks or seeds). It needs nothing but the stored document, so
a report rebuilt from stored runs shows the same scores as the live run.

With several tasks, :func:`compare_tasks` runs the whole comparison once per
task (each into its own folder, with its own table and plots) and then scores
the optimizers over all of them together.
"""

from __future__ import annotations

import argparse
import re
import statistics
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from optcore import ConfigError

from . import scoring
from .text import label, shown


def runs_by_optimizer(
    doc: Mapping[str, Any], task: str | None = None, part: Mapping[str, Any] | None = None
) -> dict[str, list[dict[str, Any]]]:
    """The runs that stand for each config of a compare document: its chosen lr's
    runs (one per seed), tagged with ``task``. A config with no finished lr has
    none: it misses every target. ``part``: another ``{"rows", "results"}``
    section of the document to read them from (e.g. the re-seeded runs of a
    tuned comparison), else the document's own."""
    task = task if task is not None else doc["task"]["spec"]
    part = part if part is not None else doc
    results = part["results"]
    return {
        row["name"]: [{**results[i], "task": task} for i in row["runs"]] if row["status"] == "ok" else []
        for row in part["rows"]
    }


def _targets(text: str | float | None, tasks: Sequence[str]) -> dict[str, float] | None:
    if text is None:
        return None
    return {t: float(text) for t in tasks} if isinstance(text, (int, float)) else scoring.parse_targets(text, tasks)


def parse_target(text: str | float | None, task: str | None) -> dict[str, float] | None:
    """``--target`` for a comparison on one ``task`` (None: the default task): {task: loss},
    or None (set from the runs)."""
    from .tasks import DEFAULT_TASK

    return _targets(text, [task or DEFAULT_TASK])


def median_reached(entry: Mapping[str, Any], by: str) -> float | None:
    """The median ``by`` ("steps" or "seconds") to target over the problems an
    optimizer's :func:`.scoring.summarise` ``entry`` solved; None if it solved none."""
    kept = [r[by] for r in entry["reach"] if r["steps"] is not None and r[by] is not None]
    return statistics.median(kept) if kept else None


def target_origin(target: Mapping[str, Any]) -> str:
    """Where a target set from the runs came from, in words: ``"the loss 75% of the
    configs reach, Lion's best"``. An entry stored before targets recorded their
    ``share`` was set by the best config's runs alone."""
    share = target.get("share", 0.0)
    if not share:
        return f"set by {target['set_by']}'s best runs"
    return f"the loss {share:.0%} of the configs reach, {target['set_by']}'s best"


def render_scores(summary: Mapping[str, Any], console: Any, title: str) -> None:
    """The time-to-target table: per config the problems it solved, the median steps and
    seconds over those, and the score by steps and by seconds (no rank: a score
    summarises, it does not test a difference)."""
    from rich.table import Table

    from .report import fmt

    def origin(t: Mapping[str, Any]) -> str:
        if t["source"] == "given":
            return "given"
        return target_origin(t) if t["set_by"] else "no config finished with a finite loss"

    targets = "; ".join(f"{shown(task)} {fmt(t['loss'], '.4g')} ({shown(origin(t))})"
                        for task, t in summary["targets"].items())  # fmt: skip
    n = len(summary["problems"])
    table = Table(
        title=f"time to target: {shown(title, 600)}",
        caption=(
            f"targets (held-out loss): {targets}. reached: problems (task x seed) where the held-out loss got to the "
            f"target, at an evaluation; steps, seconds: median over those (training time, evaluations excluded); "
            f"score: area under the performance profile up to {summary['max_tau']:g}x the fastest, / "
            f"{summary['max_tau'] - 1:g} (1: fastest everywhere, 0: never within {summary['max_tau']:g}x; a miss "
            "scores 0). By steps it repeats on this machine for the same torch build and seeds; by seconds it is this "
            "machine's under its load, and does not repeat."
        ),
    )
    for col in ("config", "reached", "steps", "seconds", "score (steps)", "score (seconds)"):
        table.add_column(col, justify="left" if col == "config" else "right", no_wrap=True)
    for name, entry in summary["optimizers"].items():
        steps = median_reached(entry, "steps")
        table.add_row(
            shown(name), f"{entry['reached']}/{n}", "miss" if steps is None else f"{steps:g}",
            fmt(median_reached(entry, "seconds"), ".2f"),
            fmt(entry["score_steps"], ".3f"), fmt(entry["score_seconds"], ".3f"),
        )  # fmt: skip
    console.print(table)
    shares = {t.get("share", 0.0) for t in summary["targets"].values() if t["source"] == "reference" and t["set_by"]}
    if shares:
        share = f"{max(shares):.0%} of the configs" if max(shares) else "the best config"
        console.print(
            f"[yellow]Note[/yellow]: a target set from the runs is the loss that {share} reach: of each config's "
            "best held-out loss (the median over its seeds), the one that this share of them are at or below. The "
            "times to it rank the configs that reach it. It moves with the line-up and the machine: to compare runs "
            "made apart, give --target one loss for all of them.",
            highlight=False,
        )


def plot_profile(summary: Mapping[str, Any], path: Path, title: str) -> None:
    """The performance profiles, by steps and by seconds: the fraction of problems each
    config solved within tau times the fastest, for tau from 1 to ``max_tau``."""
    from .report import _pyplot

    plt = _pyplot()
    entries = summary["optimizers"].values()
    bys = [by for by in ("steps", "seconds") if all(e[f"score_{by}"] is not None for e in entries)]
    fig, axes = plt.subplots(1, len(bys), figsize=(6.5 * len(bys), 4.8), dpi=110, layout="constrained", squeeze=False)
    max_tau = summary["max_tau"]
    taus = [1 + (max_tau - 1) * i / 600 for i in range(601)]
    colors = plt.get_cmap("tab10" if len(summary["optimizers"]) <= 10 else "tab20").colors
    for ax, by in zip(axes[0], bys):
        profile = scoring.performance_profile(scoring.profile_times(summary, by), taus)
        for i, (name, rho) in enumerate(profile.items()):
            score = summary["optimizers"][name][f"score_{by}"]
            ax.step(taus, rho, where="post", color=colors[i % len(colors)], lw=1.6, ls=("-", "--", "-.", ":")[i % 4],
                    label=f"{label(name)}  {score:.3f}")  # fmt: skip  (dashes keep equal profiles visible)
        ax.set_xlim(1, max_tau)
        ax.set_ylim(-0.03, 1.03)
        ax.set_xlabel(f"{by} to target / the fastest config's (tau)")
        ax.set_ylabel("fraction of problems solved within tau")
        ax.set_title(f"by {by}", fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend(title="config, score", fontsize=9, title_fontsize=9, loc="lower right")
    fig.suptitle(f"performance profiles over {len(summary['problems'])} problems: {label(title, 200)}", fontsize=11)
    fig.savefig(path)
    plt.close(fig)


def report_scores(
    doc: dict[str, Any], out: Path, console: Any, target: Mapping[str, float] | None = None,
    part: Mapping[str, Any] | None = None,
) -> list[Path]:  # fmt: skip
    """Score one comparison (``doc``, as written to ``results.json``) by time to target:
    add ``doc["scores"]``, rewrite ``out/results.json``, print the table, and draw
    ``out/profile.png`` where there are several problems. ``part``: score the runs
    of that ``{"rows", "results"}`` section instead of the document's own (see
    :func:`runs_by_optimizer`). Returns the files written."""
    from .report import write_results

    if not (part if part is not None else doc).get("rows"):
        return []
    spec = doc["task"]["spec"]
    summary = scoring.summarise(runs_by_optimizer(doc, spec, part), target)
    doc["scores"] = summary
    write_results(out / "results.json", doc)
    render_scores(summary, console, doc["summary"])
    written = [out / "results.json"]
    if len(summary["problems"]) > 1 and summary["targets"][spec]["loss"] is not None:
        plot_profile(summary, out / "profile.png", doc["summary"])
        written.append(out / "profile.png")
    return written


def task_folder(spec: str) -> str:
    """A folder name for a ``--task`` spec (``examples/my_task.py:task`` -> ``examples_my_task.py_task``)."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", spec).strip("_.") or "task"


def compare_tasks(args: argparse.Namespace, compare_one: Callable[[argparse.Namespace], int], out: Path) -> int:
    """``optcore compare --task a,b,c``: the comparison on each task (into
    ``out/<task>/``, each with its own table, plots and time to target), then the
    scores over every (task, seed) problem together: ``out/results.json`` and
    ``out/profile.png``. Each task is a sweep of its own in one storage (``--storage``,
    else ``out/optuna.db``), listed by an index under ``--study``
    (:func:`.study.task_index`), so that workers share every task and ``compare
    report`` rebuilds them all and the scores over them."""
    tasks = [t.strip() for t in args.task.split(",") if t.strip()]
    if len(set(tasks)) != len(tasks) or not tasks:
        raise ConfigError(f"--task {args.task!r}: name each task once, e.g. --task char-lm,vision.",
                          problems=[("task", args.task)])  # fmt: skip
    targets = _targets(args.target, tasks) or {}
    from .records import read_results
    from .tasks import load_task

    for task in tasks:  # a bad spec fails before the first task runs
        load_task(task)
    from .study import DEFAULT_HEARTBEAT_S, DEFAULT_STUDY, default_storage_url, open_storage, task_index, task_study

    out.mkdir(parents=True, exist_ok=True)
    storage = getattr(args, "storage", None) or default_storage_url(out)
    study = getattr(args, "study", None) or DEFAULT_STUDY
    task_index(open_storage(storage, getattr(args, "heartbeat", None) or DEFAULT_HEARTBEAT_S), study, tasks)
    docs: dict[str, dict[str, Any]] = {}
    rc = 0
    for task in tasks:
        folder = out / task_folder(task)
        one = argparse.Namespace(**{**vars(args), "task": task, "out": str(folder), "target": targets.get(task)})
        one.storage, one.study = storage, task_study(study, task_folder(task))
        rc = compare_one(one)
        docs[task] = read_results(folder / "results.json")
        if rc:  # interrupted: score what finished, say so
            break
    return score_tasks(docs, out, complete=rc == 0 and len(docs) == len(tasks), targets=targets, tasks=tasks) or rc


def score_tasks(docs: Mapping[str, Mapping[str, Any]], out: Path, complete: bool,
                targets: Mapping[str, float] | None = None, tasks: Sequence[str] = ()) -> int:  # fmt: skip
    """The scores over every task's comparison (``docs``: each task's ``results.json``)
    together, at the targets each task's comparison was given (the others set from
    the runs): ``out/results.json``, the table and ``out/profile.png``. The live
    run, a worker that joined it and ``compare report`` call it alike.

    Scores over part of the sweep (a task stopped before its last trial, or
    ``tasks`` not run at all) say so in the title, in ``results.json``
    (``unfinished``, ``not_run``) and in a line under the table: a score over
    fewer problems is not the sweep's."""
    from rich.console import Console

    from .report import write_results

    runs: dict[str, list[dict[str, Any]]] = {}
    for task, doc in docs.items():
        tuned = doc.get("tuned")  # the tuned protocol is scored by its re-seeded runs, as each task's own table is
        for name, mine in runs_by_optimizer(doc, task, tuned if tuned and tuned["rows"] else None).items():
            runs.setdefault(name, []).extend(mine)
    given = {task: t["loss"] for doc in docs.values() for task, t in doc.get("scores", {}).get("targets", {}).items()
             if t["source"] == "given"}  # fmt: skip
    summary = scoring.summarise(runs, {**given, **(targets or {})})
    # a live run cut by --budget is "complete" (not interrupted), yet its sweep is not: `compare report` says so too
    unfinished = [task for task, doc in docs.items() if not doc["complete"] or doc.get("cut")]
    not_run = [task for task in tasks if task not in docs]
    partial = "; ".join(
        part for part in (unfinished and f"unfinished: {', '.join(unfinished)}", not_run and f"not run: {', '.join(not_run)}")
        if part
    )
    title = f"{len(docs)} tasks ({', '.join(docs)})" + (f", PARTIAL ({partial})" if partial else "")
    write_results(out / "results.json", {
        "title": title,
        "tasks": {task: {"folder": task_folder(task), "summary": doc["summary"], "complete": doc["complete"]}
                  for task, doc in docs.items()},
        "complete": complete and not partial, "unfinished": unfinished, "not_run": not_run, "scores": summary,
    })  # fmt: skip
    console = Console(soft_wrap=False)
    if not console.is_terminal:
        console = Console(soft_wrap=False, width=150)
    render_scores(summary, console, title)
    written = [out / "results.json"]
    if summary["problems"] and any(t["loss"] is not None for t in summary["targets"].values()):
        plot_profile(summary, out / "profile.png", title)
        written.append(out / "profile.png")
    if partial:
        console.print(f"[bold red]Partial scores[/] ({shown(partial, 600)}): they cover only the runs that finished. "
                      "Run the same "
                      "command again to finish the sweep (finished runs are kept), then read the scores.")
    console.print(f"Wrote {', '.join(map(str, written))}", markup=False, highlight=False)
    return 0

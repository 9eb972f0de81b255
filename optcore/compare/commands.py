"""The ``optcore compare``, ``optcore train`` and ``optcore memory`` subcommands.

This module is imported by every ``optcore`` invocation to add its
subcommands, so it imports only argparse at the top; each command imports the
modules it runs (torch, rich, matplotlib) when it runs.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .._errors import ConfigError
from .._values import clean_text
from .defaults import lineup_text
from .text import shown

DEFAULT_STEPS = 300
DEFAULT_OUT = "optcore-compare"
DEFAULT_TASK = "char-lm"  # optcore.compare.tasks.DEFAULT_TASK (not imported: it imports torch)
DEFAULT_STUDY = "compare"  # optcore.compare.study.DEFAULT_STUDY


def _settings(args: argparse.Namespace, file_options: Mapping[str, Any]) -> Any:
    import torch

    from .train import RunSettings

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    try:
        torch.empty(1, device=device)
    except (RuntimeError, AssertionError) as exc:
        raise ConfigError(f"--device {device!r} is not usable here ({exc}); try --device cpu.") from None
    steps = args.steps if args.steps is not None else int(file_options.get("num_training_steps", DEFAULT_STEPS))
    seed = args.seed if args.seed is not None else int(file_options.get("seed", 0))
    if steps < 1:
        raise ConfigError(f"--steps must be at least 1, got {steps}.", problems=[("steps", "< 1")])
    return RunSettings(steps=steps, seed=seed, device=device, task=args.task or DEFAULT_TASK)


def _out_dir(args: argparse.Namespace) -> Path:
    """``--out`` as given, else a fresh timestamped folder under ``optcore-compare/``
    (an earlier comparison is never overwritten)."""
    if args.out:
        return Path(args.out)
    base = Path(DEFAULT_OUT) / time.strftime("%Y%m%d-%H%M%S")
    out, n = base, 1
    while out.exists():
        n += 1
        out = base.with_name(f"{base.name}-{n}")
    return out


def _entries(args: argparse.Namespace) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    from ..files import load_config_file
    from .lineup import default_entries, entries_from_file, entries_from_names, unique_names

    if args.config and args.optimizers:
        raise ConfigError("Give --optimizers or --config, not both.")
    options: dict[str, Any] = {}
    if args.config:
        entries, options = entries_from_file(load_config_file(args.config))
    elif args.optimizers:
        entries = entries_from_names(args.optimizers)
    else:
        entries = default_entries()
    if not entries:
        raise ConfigError("Nothing to compare: --optimizers named no optimizer.")
    unique_names(entries)
    return entries, options


#: Flags that define a sweep: a worker that gives none of them joins a stored sweep as it is.
SWEEP_FLAGS = ("optimizers", "config", "steps", "seed", "seeds", "task", "lr_sweep", "lrs", "trials", "studies",
               "algoperf", "prune", "sampler")  # fmt: skip


def _protocol(args: argparse.Namespace, seed: int) -> tuple[dict[str, Any], list[int]]:
    """The tuning protocol of the flags, and the seeds the configs run on."""
    from .sweep import parse_seeds
    from .tuning import ALGOPERF_STUDIES, ALGOPERF_TRIALS, DEFAULT_RESEEDS

    trials, studies = args.trials, args.studies
    if args.algoperf:
        trials = ALGOPERF_TRIALS if trials is None else trials
        studies = ALGOPERF_STUDIES if studies is None else studies
    trials, studies = trials or 0, 1 if studies is None else studies
    if trials < 0:
        raise ConfigError(f"--trials must be at least 1, got {trials}.", problems=[("trials", "< 1")])
    if studies < 1:
        raise ConfigError(f"--studies must be at least 1, got {studies}.", problems=[("studies", "< 1")])
    if studies > 1 and not trials:
        raise ConfigError("--studies repeats the tuning of --trials: give --trials K too (or --algoperf).",
                          problems=[("studies", "without --trials")])  # fmt: skip
    if args.prune and not trials:
        raise ConfigError("--prune stops tuning trials early: give --trials K too.", problems=[("prune", "no trials")])
    if args.prune and args.in_process:
        raise ConfigError("--prune stops a trial's process: drop --in-process.", problems=[("prune", "in-process")])
    if args.seeds:
        seeds = parse_seeds(args.seeds)
    elif trials:  # re-seed the chosen config on seeds the tuning did not pick it on
        seeds = [seed + i for i in range(1, DEFAULT_RESEEDS + 1)]
    else:
        seeds = [seed]
    protocol = {"trials": trials, "studies": studies, "sampler": args.sampler or "sobol", "sampler_seed": seed,
                "tuning_seed": seed, "prune": bool(args.prune)}  # fmt: skip
    return protocol, seeds


def _hide_password(url: str) -> str:
    from .study import _hide_password as hide

    return hide(url)


def _join_command(url: str, study: str) -> str:
    """The command that joins sweep ``study`` in the storage at ``url`` as it is."""
    import shlex

    return f"optcore compare --storage {shlex.quote(_hide_password(url))} --study {shlex.quote(clean_text(study, 200))}"


def _print_skipped(sweep: Any, console: Any) -> None:
    """One line per stored record the sweep skipped, as text (it came from the storage)."""
    for message in sweep.bad.values():
        console.print(f"Skipped: {message}", markup=False, highlight=False, soft_wrap=True)


def cmd_compare(args: argparse.Namespace) -> int:
    if getattr(args, "compare_command", None) == "report":
        return cmd_report(args)
    import dataclasses

    import optuna  # noqa: F401 - the engine: a missing extra is named before anything is written
    import rich  # noqa: F401

    from .lineup import search_space
    from .runner import default_jobs, run_one
    from .study import MEMORY_NOTES, Sweep, default_storage_url, isolation_text, open_storage, sweep_meta
    from .scoreboard import compare_tasks, parse_target
    from .sweep import Budget, Run, parse_duration, parse_lrs
    from .tasks import load_task

    if args.storage and not args.task and not getattr(args, "joining", False):
        from .study import task_index
        from .trust import Trust

        stored_tasks = task_index(open_storage(args.storage, args.heartbeat), args.study, None)
        if stored_tasks:  # a worker that joins a stored sweep of several tasks, as it is
            Trust.of(None, (), _join_command(args.storage, args.study)).check_tasks(args.study, stored_tasks)
            args = argparse.Namespace(**{**vars(args), "task": ",".join(stored_tasks), "joining": True})
    if "," in (args.task or ""):  # several tasks: this command once per task, then the scores over all
        return compare_tasks(args, cmd_compare, _out_dir(args))
    target = parse_target(args.target, args.task)  # a bad --target fails before anything runs
    entries, options = _entries(args)
    settings = _settings(args, options)
    protocol, seeds = _protocol(args, settings.seed)
    if args.lrs and args.lr_sweep:
        raise ConfigError("Give --lr-sweep or --lrs, not both.")
    lrs = parse_lrs(args.lrs) if args.lrs else None
    budget = Budget(parse_duration(args.budget) if args.budget else None)
    jobs = args.jobs if args.jobs is not None else default_jobs(args.threads, settings.device, args.in_process)
    if jobs < 1:
        raise ConfigError(f"--jobs must be at least 1, got {jobs}.", problems=[("jobs", "< 1")])
    if jobs > 1 and args.in_process:
        raise ConfigError("--in-process runs one config at a time; drop --jobs or --in-process.",
                          problems=[("jobs", "needs fresh processes")])  # fmt: skip
    task = load_task(settings.task)  # fails early, with its message, on a bad --task
    spaces = {e["name"]: search_space(e) for e in entries} if protocol["trials"] else {}
    out = _out_dir(args)
    out.mkdir(parents=True, exist_ok=True)
    url = args.storage or default_storage_url(out)
    isolation = isolation_text("in-process" if args.in_process else "spawn", jobs)
    memory_note = MEMORY_NOTES["in-process" if args.in_process else "spawn"]
    meta = sweep_meta(
        entries, spaces, task={"spec": settings.task, "name": task.name, "description": task.describe()},
        steps=settings.steps, seeds=seeds, lr_sweep=args.lr_sweep, lrs=lrs, protocol=protocol,
        extra={"summary": f"{task.describe()}, {settings.steps} steps, seeds {','.join(map(str, seeds))}, "
               f"{settings.device}", "memory_note": memory_note, "loss_label": getattr(task, "loss_label", "loss"),
               "settings": {"device": settings.device, "threads": args.threads, "jobs": jobs, "isolation": isolation},
               "target": target},
    )  # fmt: skip
    from .trust import Trust

    joining = getattr(args, "joining", False)  # its --task came from the storage's index, not from its user
    # --task alone joins as it is: it names the code this worker trusts (the stored task must be the same)
    explicit = not args.storage or (not joining and any(getattr(args, flag, None) not in (None, False)
                                                        for flag in SWEEP_FLAGS if flag != "task"))  # fmt: skip
    trust = Trust.of(None if joining else args.task, entries, _join_command(url, args.study))
    sweep = Sweep.open(open_storage(url, args.heartbeat), args.study, meta, explicit=explicit, trust=trust)
    meta = sweep.meta  # a worker that joins runs the stored sweep
    if args.task and not joining and meta["task"]["spec"] != args.task:
        raise ConfigError(
            f"The comparison {args.study!r} in this storage is a sweep of the task "
            f"{clean_text(meta['task']['spec'])!r}, not of {args.task!r}. Run the same --task as the other workers "
            "(or give only --storage and --study), or start a new one with another --study.",
            problems=[("task", "differs from the stored sweep")],
        )
    if args.target is not None and not args.task:  # its --target is for the stored task, not the default one
        target = parse_target(args.target, meta["task"]["spec"])
    own_target = target if args.target is not None and target != meta.get("target") else None
    target = target if args.target is not None else meta.get("target")  # and scores it by the stored target
    settings = dataclasses.replace(settings, steps=meta["steps"], task=meta["task"]["spec"])
    protocol = sweep.protocol  # its pruning too: every worker prunes a tuning trial by the same rule
    if protocol["prune"] and args.in_process:
        raise ConfigError(f"The comparison {args.study!r} prunes its tuning trials (--prune), which stops a trial's "
                          "process: drop --in-process.", problems=[("prune", "in-process")])  # fmt: skip
    console = _console()
    if own_target is not None:
        stored = meta.get("target")
        started = ("without a --target (it sets one from the runs)" if not stored
                   else "with --target " + ",".join(f"{shown(task)}={loss:g}" for task, loss in stored.items()))
        console.print(f"[yellow]Note[/yellow]: this worker scores by its own --target {args.target}; the sweep "
                      f"{args.study!r} was started {started}, and `optcore compare report` scores by that.",
                      highlight=False)  # fmt: skip
    planned = sweep.planned()
    tuning = f", {protocol['trials']} trials x {protocol['studies']} studies per optimizer" if protocol["trials"] else ""
    console.print(
        f"Comparing {len(meta['entries'])} configs ({planned} runs{tuning}: seeds {','.join(map(str, meta['seeds']))}), "
        f"{settings.steps} steps each on {settings.device}, {isolation}; results go to {out}/"
        + (f" (sweep {args.study!r} in {_hide_password(url)})" if args.storage else "")
    )
    settings_doc = {"steps": settings.steps, "seeds": meta["seeds"], "device": settings.device, "threads": args.threads,
                    "jobs": jobs, "isolation": isolation, "lr_sweep": meta["lr_sweep"], "lrs": meta["lrs"],
                    "budget_s": budget.seconds, "storage": _hide_password(url), "study": args.study}  # fmt: skip
    live: dict[str, Any] = {"settings": settings_doc, "complete": False, "interrupted": False, "cut": None}
    started = time.perf_counter()

    def document() -> dict[str, Any]:
        from .study import collect

        doc = collect(sweep)
        isolation = doc.pop("isolation")  # every way the sweep's runs were made, this worker's and the others'
        return {**doc, **live, "settings": {**live["settings"], "isolation": isolation}}

    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from .report import write_results

    columns = (
        TextColumn("{task.description:<22}"), BarColumn(), MofNCompleteColumn(),
        TextColumn("train loss {task.fields[loss]} {task.fields[at]}"), TimeElapsedColumn(),
    )  # fmt: skip
    per_config = _planned_per_config(sweep)
    try:
        with Progress(*columns, console=console, disable=args.quiet) as progress:
            bars = {name: progress.add_task(shown(name, 22), total=n * settings.steps, loss="-", at="", start=False)
                    for name, n in per_config.items()}  # fmt: skip
            done_steps: dict[str, int] = dict.fromkeys(per_config, 0)

            def show(claimed: Any, step: int, loss: float | None = None) -> None:
                bar = bars[claimed.config]
                at = f"(lr {claimed.lr:.3g}, seed {claimed.seed})" if claimed.lr is not None else f"(seed {claimed.seed})"
                fields = {"loss": f"{loss:.3f}", "at": f"{claimed.phase} {at}"} if loss is not None else {}
                progress.start_task(bar)
                progress.update(bar, completed=done_steps[claimed.config] + step, **fields)

            def execute(claimed: Any) -> dict[str, Any]:
                prune = _pruning(claimed, settings.steps) if protocol["prune"] and claimed.phase == "tune" else None

                def report(step: int, loss: float) -> None:
                    show(claimed, step, loss)
                    if prune is not None:
                        prune(step, loss)

                begin = time.perf_counter()
                result = run_one(claimed.entry, dataclasses.replace(settings, seed=claimed.seed), not args.in_process,
                                 args.threads, report, claimed.stop)  # fmt: skip
                if prune is not None and claimed.attrs.get("pruned_at"):
                    result.update(status="pruned", error=None, pruned_at=claimed.attrs["pruned_at"])
                result["name"], result["seed"], result["phase"] = claimed.config, claimed.seed, claimed.phase
                result["worker"] = f"{socket.gethostname()}:{os.getpid()}"
                result["isolation"], result["jobs"] = ("in-process" if args.in_process else "spawn"), jobs
                if claimed.lr is not None:
                    result["lr"] = claimed.lr
                result["trial_wall_s"] = time.perf_counter() - begin
                return result

            def admit(claimed: Any) -> bool:
                return budget.allows(Run(claimed.config, claimed.entry, claimed.lr, claimed.seed),
                                     time.perf_counter() - started)  # fmt: skip

            def finished(claimed: Any, result: dict[str, Any]) -> None:
                budget.record(Run(claimed.config, claimed.entry, claimed.lr, claimed.seed), result["trial_wall_s"])
                done_steps[claimed.config] += settings.steps
                show(claimed, 0)
                if result["status"] not in ("ok", "pruned"):
                    progress.update(bars[claimed.config], description=f"{shown(claimed.config, 15)} {result['status']}")
                write_results(out / "results.json", document())  # an interrupted run keeps what finished

            sweep.run(execute, jobs=jobs, admit=admit, finished=finished)
    except KeyboardInterrupt:
        live["interrupted"] = True
    live.update(complete=not live["interrupted"], cut=budget.describe_cuts(), elapsed_s=time.perf_counter() - started)
    doc = document()
    show_comparison(doc, out, console, target)
    _print_skipped(sweep, console)
    if doc["cut"]:
        console.print(f"[yellow]Budget[/yellow]: {shown(doc['cut'], 2000)}", highlight=False)
    if doc["interrupted"]:
        console.print(f"[yellow]Interrupted[/yellow]: kept the {finished_trials(doc)} finished runs of "
                      f"{doc['sweep']['planned_trials']}; the same command resumes the sweep.")  # fmt: skip
    return 130 if doc["interrupted"] else 0


def finished_trials(doc: Mapping[str, Any]) -> int:
    """The runs of a comparison document that finished: at defaults, tuning trials and re-seeded runs."""
    tuned = doc.get("tuned") or {}
    tuning = sum(len(s["trials"]) for record in tuned.get("optimizers", {}).values() for s in record["studies"])
    return len(doc["results"]) + tuning + len(tuned.get("results", []))


def _console() -> Any:
    from rich.console import Console

    console = Console(soft_wrap=False)
    if not console.is_terminal:  # a log file or a pipe: room for the whole table
        console = Console(soft_wrap=False, width=150)
    return console


def _planned_per_config(sweep: Any) -> dict[str, int]:
    from .sweep import plan

    meta = sweep.meta
    counts = {e["name"]: 0 for e in meta["entries"]}
    for run in plan(meta["entries"], meta["seeds"], meta["lr_sweep"], meta["lrs"]):
        counts[run.config] += 1
    for name in sweep.tunable():
        counts[name] += sweep.protocol["trials"] * sweep.protocol["studies"] + len(meta["seeds"])
    return counts


def _pruning(claimed: Any, steps: int) -> Any:
    """Report the training loss (mean of the last reports) to the trial at tenths of
    the run and stop the trial's process when Optuna's pruner says so (the learning curve
    that :mod:`.dashboard` writes after the run takes the same mean at its other steps)."""
    from .dashboard import CURVE_WINDOW

    every = max(1, steps // 10)
    recent: list[float] = []
    last = [0]

    def check(step: int, loss: float) -> None:
        recent.append(loss)
        del recent[:-CURVE_WINDOW]
        if step - last[0] < every or claimed.stop.is_set():
            return
        last[0] = step
        claimed.trial.report(sum(recent) / len(recent), step)
        if claimed.trial.should_prune():
            claimed.attrs["pruned_at"] = step
            claimed.stop.set()

    return check


def show_comparison(doc: Mapping[str, Any], out: Path, console: Any, target: Any = None) -> None:
    """Write ``results.json`` and the plots of ``doc`` into ``out`` and print its
    tables: the live run and ``compare report`` show a comparison alike."""
    from .report import plot_curves, plot_sweep, print_notes, render_table, write_results
    from .sweep import ranking_line

    write_results(out / "results.json", doc)
    loss_label = doc.get("loss_label") or "loss"
    meta = {"summary": doc["summary"], "memory_note": doc["memory_note"], "seeds": doc["protocol"]["seeds"]}
    rows, results = doc["rows"], doc["results"]
    written = [out / "results.json"]
    tuned = doc.get("tuned")
    if rows:
        plot_curves(rows, results, meta, out / "loss_curves.png", loss_label)
        written.append(out / "loss_curves.png")
        if any(r["swept"] for r in rows):
            plot_sweep(rows, meta, out / "lr_sweep.png", loss_label)
            written.append(out / "lr_sweep.png")
        if not tuned:
            render_table(rows, meta, console)
        print_notes(rows, results, console)
        line = ranking_line(rows)
        if line and not tuned:
            console.print(f"Ranking by held-out final loss: {line}", highlight=False, markup=False)
    if tuned:
        from .tuning import render_protocol

        if tuned["rows"]:
            plot_curves(tuned["rows"], tuned["results"], meta, out / "loss_curves_tuned.png", loss_label)
            written.append(out / "loss_curves_tuned.png")
        trials = _trial_rows(tuned)
        if trials:
            task_steps = doc["summary"].split(", seeds ")[0]
            tuning_meta = {**meta, "summary": f"{task_steps}, every tuning trial (seed {doc['protocol']['tuning_seed']})"}
            plot_sweep(trials, tuning_meta, out / "tuning.png", loss_label)
            written.append(out / "tuning.png")
        if tuned["rows"]:
            render_table(tuned["rows"], meta, console)
        render_protocol(doc, console)
        line = ranking_line(tuned["rows"])
        if line:
            console.print(f"Ranking of the tuned optimizers by re-seeded held-out final loss: {line}", highlight=False,
                          markup=False)  # fmt: skip
    from .scoreboard import report_scores

    written += report_scores(doc, out, console, target, part=tuned if tuned and tuned["rows"] else None)[1:]
    console.print(f"Wrote {', '.join(map(str, written))}", markup=False, highlight=False)


def _trial_rows(tuned: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Each tuned optimizer's trials as plot_sweep's rows: final loss against lr,
    the chosen trial ringed, diverged lrs marked."""
    rows = []
    for name, record in tuned["optimizers"].items():
        trials = [t for s in record["studies"] for t in s["trials"] if t.get("lr") is not None]
        if not trials:
            continue
        sweep = sorted(({"lr": t["lr"], "mean": t["final"] if t["status"] == "ok" else None, "sd": None,
                         "status": t["status"]} for t in trials), key=lambda p: p["lr"])  # fmt: skip
        chosen = record["chosen"]
        rows.append({"name": name, "swept": True, "sweep": sweep, "lr": chosen["lr"] if chosen else None,
                     "final": chosen["score"] if chosen else None})  # fmt: skip
    return rows


def cmd_report(args: argparse.Namespace) -> int:
    """``optcore compare report``: the table and plots of a sweep, from its storage alone."""
    import optuna  # noqa: F401 - a missing extra is named before anything is written

    from .records import read_results
    from .scoreboard import score_tasks, task_folder
    from .study import Sweep, open_storage, task_index, task_study

    if args.storage.startswith("sqlite:///") and not Path(args.storage[len("sqlite:///"):]).is_file():
        raise ConfigError(f"No such SQLite file: {args.storage[len('sqlite:///'):]} (a comparison's storage is "
                          "optuna.db in its --out folder: --storage sqlite:///OUT/optuna.db).",
                          problems=[("storage", "missing")])  # fmt: skip
    storage = open_storage(args.storage)
    out = _out_dir(args)
    tasks = task_index(storage, args.study, None)
    if tasks:  # a sweep of several tasks: each task's report, then the scores over all, as the live run
        docs: dict[str, Any] = {}
        for task in tasks:
            folder = task_folder(task)
            _report_one(Sweep.open(storage, task_study(args.study, folder), None), args, out / folder)
            docs[task] = read_results(out / folder / "results.json")
        return score_tasks(docs, out, complete=all(d["complete"] for d in docs.values()), tasks=tasks)
    _report_one(Sweep.open(storage, args.study, None), args, out)
    return 0


def _report_one(sweep: Any, args: argparse.Namespace, out: Path) -> None:
    from .study import collect

    out.mkdir(parents=True, exist_ok=True)
    doc = collect(sweep)
    settings = {**sweep.meta.get("settings", {}), "isolation": doc.pop("isolation"),
                "storage": _hide_password(args.storage), "study": sweep.name}  # fmt: skip
    doc.update(settings=settings, complete=not sweep.pending())
    console = _console()
    show_comparison(doc, out, console, sweep.meta.get("target"))  # the live run's --target, stored
    _print_skipped(sweep, console)


def cmd_train(args: argparse.Namespace) -> int:
    import torch

    from ..files import load_config_file
    from .lineup import normalise_entry
    from .report import describe, fmt, human_bytes
    from .train import run_config

    data = load_config_file(args.config)
    if isinstance(data, Mapping):
        options = {k: data[k] for k in ("num_training_steps", "seed") if k in data}
        data = {k: v for k, v in data.items() if k not in ("num_training_steps", "seed")}
    else:
        options = {}
    entry = normalise_entry(data)
    settings = _settings(args, options)
    if args.threads:
        torch.set_num_threads(args.threads)
    every = max(1, settings.steps // 10)
    print(f"optcore train: {describe(entry)} for {settings.steps} steps on {settings.device} (seed {settings.seed})")

    def report(step: int, loss: float, lr: float | None = None) -> None:
        if step % every == 0 or step == settings.steps:
            lr_text = f"  lr {float(lr):.2e}" if isinstance(lr, (int, float)) and not isinstance(lr, bool) else ""
            print(f"step {step:>5}/{settings.steps}  train loss {loss:.4f}{lr_text}", flush=True)

    result = run_config(entry, settings, report, sample_chars=args.sample)
    for message in result["warnings"]:
        print(f"warning: {message}", file=sys.stderr)
    if result["status"] != "ok":
        print(f"error: {result['name']} {result['status']}: {result['error']}", file=sys.stderr)
        return 1
    print(
        f"final held-out loss {result['final']:.4f} (best {result['best']:.4f} at step {result['best_step']}); "
        f"{fmt(result['steps_per_s'], '.1f')} steps/s; optimizer state {human_bytes(result['state_bytes'])} "
        f"({fmt(result['state_bytes_per_param'], '.1f')} B/param)"
    )
    if result.get("sample"):
        print("sample:\n" + result["sample"])
    return 0


def cmd_memory(args: argparse.Namespace) -> int:
    from .memory_report import run_memory_command

    return run_memory_command(args)


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--steps", type=int, help=f"training steps per run (default: the file's, else {DEFAULT_STEPS})")
    p.add_argument("--seed", type=int, help="seed of the model, the batches and the optimizer (default 0)")
    p.add_argument("--device", help="torch device (default: cuda when available, else cpu)")
    p.add_argument(
        "--task",
        help="what to train: char-lm (default), hf-llama (needs transformers), vision, or your own "
        "package.module:name / path/to/file.py:name (see `optcore.compare.tasks`)",
    )  # fmt: skip
    p.add_argument(
        "--threads", type=int, default=1,
        help="torch CPU threads (default 1: the models are tiny, and one thread is as fast and steadier on a busy "
        "machine; 0 keeps torch's default)",
    )  # fmt: skip


def add_commands(sub: Any) -> None:
    """Add ``compare``, ``train`` and ``memory`` to the ``optcore`` command's subparsers."""
    p = sub.add_parser(
        "compare",
        help="train a small model with several optimizers; table, loss plot and JSON side by side",
        description="Train the same small model on the same data with several optimizer configs (per seed, per lr "
        "of a sweep, or tuned with an equal budget of trials) and compare held-out loss, speed, optimizer-state "
        "memory, peak memory and skipped fp16 steps. Every run is an Optuna trial.",
        epilog=f"Default line-up, each config where one of its implementations is installed (the first one): "
        f"{lineup_text()}; at the learning rates of optcore.compare.lineup.DEFAULTS.",
    )
    p.add_argument("--optimizers", help="comma-separated names (each means what `optcore show NAME` says) or "
                   "qualified names, e.g. Lion,AdamW,optcore-lion:Lion")  # fmt: skip
    p.add_argument("--config", help="YAML/JSON/TOML list of configs ({name, optimizer, lr_scheduler})")
    _common(p)
    p.add_argument("--seeds", help="run every config once per seed, e.g. 0,1,2: the table shows mean ± sd, ties")
    p.add_argument("--lr-sweep", type=int, nargs="?", const=3, metavar="N",
                   help="run each config at N lrs (default 3) on a 3x grid around its own lr; compare at the best")
    p.add_argument("--lrs", help="run each config at these lrs, e.g. 1e-3,3e-3,1e-2; compare at the best")
    p.add_argument("--target", help="held-out loss to reach: steps and seconds to it, profile and score, e.g. 2.1 or "
                   "char-lm=2.1,vision=0.4 with --task char-lm,vision (several tasks: a comparison each, scored "
                   "together); default: the loss that 3 in 4 configs reach, set from their runs")  # fmt: skip
    p.add_argument("--budget", help="stay within this wall time (90s, 10m, 1h): later runs are cut, and reported")
    p.add_argument("--out", help=f"directory for the results (default: a new {DEFAULT_OUT}/<date-time>/)")
    p.add_argument("--jobs", type=int, help="runs at a time, each in its own process (default: one per CPU core "
                   "divided by --threads; 1 on an accelerator). Results do not depend on it; use 1 for steadier "
                   "steps/s")  # fmt: skip
    p.add_argument("--in-process", action="store_true", help="run every config in this process (faster start)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    tune = p.add_argument_group(
        "tuning (equal budgets, AlgoPerf's external-tuning rule)",
        "Each optimizer gets K quasi-random points from its search space (optcore.compare.lineup.DEFAULTS, or a "
        "config's search_space); its score is the median over studies of each study's best; the point behind the "
        "score is run again on --seeds (default: 3 seeds after --seed) and ranked by their mean ± sd.",
    )
    tune.add_argument("--trials", type=int, metavar="K", help="tune each optimizer with K quasi-random points")
    tune.add_argument("--studies", type=int, metavar="S", help="repeat the tuning S times with other sampler seeds "
                      "(default 1); the score is the median of the S bests")  # fmt: skip
    tune.add_argument("--algoperf", action="store_true", help="AlgoPerf's budget: --trials 5 --studies 3")
    tune.add_argument("--sampler", choices=("sobol", "halton"), help="the quasi-random sequence (default sobol)")
    tune.add_argument("--prune", action="store_true", help="stop tuning trials whose training loss is above the "
                      "median of the study's trials at the same step (Optuna's MedianPruner); reported per optimizer")
    sweep = p.add_argument_group(
        "storage (Optuna)",
        "Every run is an Optuna trial. The sweep lives in an Optuna storage: by default optuna.db in --out, so the "
        "same command with the same --out resumes it; with --storage, the same command on several machines shares "
        "one sweep, each taking the next trials.",
    )
    sweep.add_argument("--storage", help="an Optuna RDB storage URL, e.g. postgresql://user@host/db or "
                       "sqlite:///path/optuna.db (default: sqlite in --out)")  # fmt: skip
    sweep.add_argument("--study", default=DEFAULT_STUDY, help=f"the sweep's name in the storage (default {DEFAULT_STUDY})")
    sweep.add_argument("--heartbeat", type=float, default=10.0, metavar="SECONDS",
                       help="a running trial's heartbeat (default 10 s); a trial silent for 3 heartbeats (its worker "
                       "was killed) is run again by another worker")  # fmt: skip
    reports = p.add_subparsers(dest="compare_command", metavar="{report}")
    r = reports.add_parser("report", help="the table and plots of a sweep, rebuilt from its storage alone",
                           description="Rebuild results.json, the table and the plots of a sweep from its Optuna "
                           "storage (it may still be running elsewhere: what has finished is shown).")  # fmt: skip
    r.add_argument("--storage", required=True, help="the sweep's storage URL (sqlite:///DIR/optuna.db by default)")
    r.add_argument("--study", default=DEFAULT_STUDY, help=f"the sweep's name (default {DEFAULT_STUDY})")
    r.add_argument("--out", help=f"directory for the results (default: a new {DEFAULT_OUT}/<date-time>/)")
    p.set_defaults(func=cmd_compare)

    p = sub.add_parser("train", help="train the compare task with one config (the smallest end-to-end example)")
    p.add_argument("--config", required=True, help="YAML/JSON/TOML {optimizer, lr_scheduler, num_training_steps}")
    _common(p)
    p.add_argument("--sample", type=int, default=200, help="characters of text to sample at the end (0: none)")
    p.set_defaults(func=cmd_train)

    p = sub.add_parser(
        "memory",
        help="predict optimizer-state, master-copy, gradient and parameter bytes for a model (nothing allocated)",
        description="Build each optimizer config on the meta device for the model's parameters and initialise its "
        "state with one step, then count the bytes: exact, not a rule of thumb.",
    )
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--params", help="a parameter count: 7B, 125M, 350000 (shapes unknown: one flat tensor)")
    src.add_argument("--model", help="a model factory package.module:fn or path/to/file.py:fn (built on meta)")
    src.add_argument("--hf-config", help="a transformers config.json (or its folder): built on meta, no download")
    p.add_argument("--optimizers", help="comma-separated names (default: the compare line-up)")
    p.add_argument("--config", help="YAML/JSON/TOML list of optimizer configs, as for compare")
    p.add_argument("--precision", choices=("fp32", "bf16", "fp16"), default="fp32", help="parameter precision")
    p.add_argument("--memory-efficient", action="store_true", help="fp16/bf16 without fp32 master copies")
    p.add_argument("--sharding", choices=("fsdp2", "zero1", "zero2", "zero3"),
                   help="with --world-size: what one rank holds under FSDP2 (each parameter cut along dim 0) or "
                   "ZeRO (1 shards optimizer state, 2 also gradients, 3 also parameters)")  # fmt: skip
    p.add_argument("--world-size", type=int, default=1, help="ranks to shard over (with --sharding)")
    p.add_argument("--zero-stage", type=int, choices=(1, 2, 3), help="same as --sharding zero1|zero2|zero3")
    p.add_argument("--check", action="store_true",
                   help="also build the model for real, step each config and print measured beside predicted "
                   "(exit status 1 where they differ); for small models")  # fmt: skip
    p.add_argument("--json", action="store_true", help="print JSON instead of the table")
    p.add_argument("--out", help="also write memory.json and memory.png into this directory")
    p.set_defaults(func=cmd_memory)

"""The ``optcore compare``, ``optcore train`` and ``optcore memory`` subcommands.

This module is imported by every ``optcore`` invocation to add its
subcommands, so it imports only argparse at the top; each command imports the
modules it runs (torch, rich, matplotlib) when it runs.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .._errors import ConfigError

DEFAULT_STEPS = 300
DEFAULT_OUT = "optcore-compare"


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
    return RunSettings(steps=steps, seed=seed, device=device, task=args.task)


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


def cmd_compare(args: argparse.Namespace) -> int:
    import dataclasses

    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from .report import plot_curves, plot_sweep, print_notes, render_table, write_results
    from .runner import default_jobs, run_all, run_one
    from .sweep import Budget, parse_duration, parse_lrs, parse_seeds, plan, ranking_line, summarise
    from .scoreboard import compare_tasks, parse_target, report_scores
    from .tasks import load_task

    if "," in (args.task or ""):  # several tasks: this command once per task, then the scores over all
        return compare_tasks(args, cmd_compare, _out_dir(args))
    target = parse_target(args.target, args.task)  # a bad --target fails before anything runs
    entries, options = _entries(args)
    settings = _settings(args, options)
    seeds = parse_seeds(args.seeds) if args.seeds else [settings.seed]
    if args.lrs and args.lr_sweep:
        raise ConfigError("Give --lr-sweep or --lrs, not both.")
    lrs = parse_lrs(args.lrs) if args.lrs else None
    budget = Budget(parse_duration(args.budget) if args.budget else None)
    runs = plan(entries, seeds, args.lr_sweep, lrs)
    task = load_task(settings.task)  # fails early, with its message, on a bad --task
    out = _out_dir(args)
    out.mkdir(parents=True, exist_ok=True)
    console = Console(soft_wrap=False)
    if not console.is_terminal:  # a log file or a pipe: room for the whole table
        console = Console(soft_wrap=False, width=150)
    jobs = args.jobs if args.jobs is not None else default_jobs(args.threads, settings.device, args.in_process)
    if jobs < 1:
        raise ConfigError(f"--jobs must be at least 1, got {jobs}.", problems=[("jobs", "< 1")])
    if jobs > 1 and args.in_process:
        raise ConfigError("--in-process runs one config at a time; drop --jobs or --in-process.",
                          problems=[("jobs", "needs fresh processes")])  # fmt: skip
    isolation = "in-process" if args.in_process else "one fresh process per run (spawn)"
    if jobs > 1:
        isolation += f", {jobs} at a time"
    summary = f"{task.describe()}, {settings.steps} steps, seeds {','.join(map(str, seeds))}, {settings.device}"
    memory_note = (
        "peak resident memory of the run's own process, and its growth (Δ) from just before the optimizer was built"
        if not args.in_process
        else "peak resident memory since the run started (kernel peak mark reset; the process's earlier "
        "allocations are included), and its growth (Δ) from just before the optimizer was built"
    )
    meta = {"summary": summary, "memory_note": memory_note, "seeds": seeds}
    doc: dict[str, Any] = {
        "task": {"spec": settings.task, "name": task.name, "description": task.describe()},
        "settings": {"steps": settings.steps, "seeds": seeds, "device": settings.device, "threads": args.threads,
                     "jobs": jobs,
                     "isolation": isolation, "lr_sweep": args.lr_sweep, "lrs": lrs, "budget_s": budget.seconds},
        "summary": summary, "memory_note": memory_note, "complete": False, "interrupted": False,
        "planned_runs": len(runs), "results": [], "rows": [], "cut": None,
    }  # fmt: skip
    console.print(
        f"Comparing {len(entries)} configs ({len(runs)} runs: lrs x seeds {','.join(map(str, seeds))}), "
        f"{settings.steps} steps each on {settings.device}, {isolation}; results go to {out}/"
    )
    results: list[dict[str, Any]] = doc["results"]
    per_config = {e["name"]: sum(r.config == e["name"] for r in runs) for e in entries}
    order = {id(run): i for i, run in enumerate(runs)}
    finished: list[tuple[int, dict[str, Any]]] = []
    started = time.perf_counter()
    columns = (
        TextColumn("{task.description:<22}"), BarColumn(), MofNCompleteColumn(),
        TextColumn("train loss {task.fields[loss]} {task.fields[at]}"), TimeElapsedColumn(),
    )  # fmt: skip
    try:
        with Progress(*columns, console=console, disable=args.quiet) as progress:
            bars = {name: progress.add_task(name[:22], total=n * settings.steps, loss="-", at="", start=False)
                    for name, n in per_config.items()}  # fmt: skip
            steps_done: dict[int, int] = {}  # plan index -> steps trained (finished runs: all of them)

            def show(run: Any, step: int, loss: float | None = None) -> None:
                steps_done[order[id(run)]] = step
                bar = bars[run.config]
                completed = sum(steps_done.get(order[id(r)], 0) for r in runs if r.config == run.config)
                at = f"(lr {run.lr:g}, seed {run.seed})" if run.lr is not None else f"(seed {run.seed})"
                fields = {"loss": f"{loss:.3f}", "at": at} if loss is not None else {}
                progress.start_task(bar)
                progress.update(bar, completed=completed, **fields)

            def execute(run: Any, stop: Any) -> dict[str, Any]:
                begin = time.perf_counter()
                result = run_one(run.entry, dataclasses.replace(settings, seed=run.seed), not args.in_process,
                                 args.threads, lambda step, loss: show(run, step, loss), stop)  # fmt: skip
                result["_wall"] = time.perf_counter() - begin
                return result

            def record(run: Any, result: dict[str, Any]) -> None:
                result["name"], result["seed"] = run.config, run.seed
                if run.lr is not None:
                    result["lr"] = run.lr
                budget.record(run, result.pop("_wall"))
                show(run, settings.steps)
                if result["status"] != "ok":
                    progress.update(bars[run.config], description=f"{run.config[:15]} {result['status']}")
                finished.append((order[id(run)], result))
                results[:] = [r for _, r in sorted(finished, key=lambda pair: pair[0])]  # plan order
                write_results(out / "results.json", doc)  # an interrupted run keeps what finished

            run_all(runs, execute, jobs=jobs, admit=lambda run: budget.allows(run, time.perf_counter() - started),
                    finished=record)  # fmt: skip
    except KeyboardInterrupt:
        doc["interrupted"] = True
    rows = summarise(entries, results)
    doc.update(rows=rows, complete=not doc["interrupted"], cut=budget.describe_cuts(),
               elapsed_s=time.perf_counter() - started)  # fmt: skip
    write_results(out / "results.json", doc)
    loss_label = getattr(task, "loss_label", "loss")
    written = [out / "results.json"]
    if rows:
        plot_curves(rows, results, meta, out / "loss_curves.png", loss_label)
        written.append(out / "loss_curves.png")
        if any(r["swept"] for r in rows):
            plot_sweep(rows, meta, out / "lr_sweep.png", loss_label)
            written.append(out / "lr_sweep.png")
        render_table(rows, meta, console)
        print_notes(rows, results, console)
        line = ranking_line(rows)
        if line:
            console.print(f"Ranking by held-out final loss: {line}", highlight=False)
        written += report_scores(doc, out, console, target)[1:]
    if doc["cut"]:
        console.print(f"[yellow]Budget[/yellow]: {doc['cut']}", highlight=False)
    if doc["interrupted"]:
        console.print(f"[yellow]Interrupted[/yellow]: kept the {len(results)} finished runs of {len(runs)}.")
    console.print(f"Wrote {', '.join(map(str, written))}")
    return 130 if doc["interrupted"] else 0


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
        "--task", default="char-lm",
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
        "of a sweep) and compare held-out loss, speed, optimizer-state memory, peak memory and skipped fp16 steps.",
        epilog="Default line-up (the installed ones): AdamW, Adam, NAdam, SGD, RMSprop, Adagrad, Lion, Adafactor, "
        "Prodigy, ScheduleFreeAdamW, at the learning rates of optcore.compare.lineup.DEFAULTS.",
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
                   "together); default: set from the best config's runs, as AlgoPerf does")  # fmt: skip
    p.add_argument("--budget", help="stay within this wall time (90s, 10m, 1h): later runs are cut, and reported")
    p.add_argument("--out", help=f"directory for the results (default: a new {DEFAULT_OUT}/<date-time>/)")
    p.add_argument("--jobs", type=int, help="runs at a time, each in its own process (default: one per CPU core "
                   "divided by --threads; 1 on an accelerator). Results do not depend on it; use 1 for steadier "
                   "steps/s")  # fmt: skip
    p.add_argument("--in-process", action="store_true", help="run every config in this process (faster start)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
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

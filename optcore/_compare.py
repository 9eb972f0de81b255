"""``optcore compare`` and ``optcore train``: which optimizer, on a real (tiny) model.

``compare`` trains the embedded task (:mod:`optcore._tasks`: a 2-layer
character-level transformer on a corpus shipped in the package) once per
optimizer config, from the same initial weights on the same batches, and shows
side by side: the loss curves, final and best held-out loss, steps/s, optimizer
state (bytes and bytes per parameter), peak process memory and skipped fp16
steps. It writes ``results.json`` and ``loss_curves.png`` to ``--out``.

Each config runs in a fresh process (multiprocessing "spawn") so that its
peak memory is its own and one config cannot disturb the next; ``--in-process``
is faster to start and resets the kernel's peak-RSS mark between configs
instead. ``train`` runs one config on the same task: the smallest end-to-end use
of the library.

Importing this module is cheap (argparse only); torch, rich and matplotlib are
imported by the commands.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from ._errors import ConfigError

DEFAULT_STEPS = 300
DEFAULT_OUT = "optcore-compare"

#: The default line-up: label, implementations in order of preference (the first
#: installed one is used), hyper-parameters. Learning rates were picked on a 3x grid
#: (1e-3, 3e-3, 1e-2, 3e-2, ...) by held-out loss on the embedded task at 300 steps,
#: seed 0; Prodigy keeps its authors' rule lr=1. Adafactor uses a fixed lr (relative
#: step off): its relative-step default reached 2.41 where lr=1e-2 reached 2.18.
DEFAULTS: tuple[tuple[str, tuple[str, ...], dict[str, Any]], ...] = (
    ("AdamW", ("AdamW",), {"lr": 1e-2, "weight_decay": 0.01}),
    ("Adam", ("Adam",), {"lr": 1e-2}),
    ("NAdam", ("NAdam",), {"lr": 1e-2}),
    ("SGD", ("SGD",), {"lr": 0.3, "momentum": 0.9, "nesterov": True}),
    ("RMSprop", ("RMSprop",), {"lr": 3e-3}),
    ("Adagrad", ("Adagrad",), {"lr": 3e-2}),
    ("Lion", ("optcore-lion:Lion", "Lion"), {"lr": 3e-3, "weight_decay": 0.1}),
    ("Adafactor", ("optcore-adafactor:Adafactor", "torch:Adafactor"),
     {"lr": 1e-2, "relative_step": False, "scale_parameter": False}),
    ("Prodigy", ("Prodigy",), {"lr": 1.0}),
    ("ScheduleFreeAdamW", ("ScheduleFreeAdamW",), {"lr": 1e-2}),
)  # fmt: skip


def _key(name: str) -> str:
    """``"optcore-lion:Lion"``, ``"lion_pytorch.Lion"`` and ``"lion"`` -> ``"lion"``."""
    return re.sub(r"[-_]", "", re.split(r"[:.]", name)[-1]).lower()


def _hparams_for(type_name: str, spec: Any) -> dict[str, Any]:
    """The line-up's hyper-parameters for ``type_name`` when its schema takes them all."""
    for label, _, hparams in DEFAULTS:
        if _key(label) == _key(type_name) and set(hparams) <= set(spec.schema.model_fields):
            return dict(hparams)
    return {}


def default_entries() -> list[dict[str, Any]]:
    """The default line-up, restricted to what is installed."""
    from ._errors import OptcoreError
    from ._registry import resolve

    entries = []
    for label, candidates, hparams in DEFAULTS:
        for name in candidates:
            try:
                spec = resolve(name)
            except OptcoreError:
                continue
            fitting = hparams if set(hparams) <= set(spec.schema.model_fields) else {}
            entries.append({"name": label, "optimizer": {"type": name, **fitting}})
            break
    return entries


def entries_from_names(names: str) -> list[dict[str, Any]]:
    """``"Lion,AdamW,torch:SGD"`` -> one entry per name. A plain name from the
    line-up (:data:`DEFAULTS`) gets the line-up's implementation and
    hyper-parameters; any other name resolves as in ``build_optimizer`` and gets
    the line-up's hyper-parameters when its class is in the line-up and takes
    them, its library defaults otherwise. A name that does not resolve is kept:
    its build fails and is reported in the table."""
    import warnings

    from ._errors import OptcoreError
    from ._registry import resolve

    lineup = {_key(e["name"]): e for e in default_entries()}
    entries = []
    for name in (n.strip() for n in names.split(",")):
        if not name:
            continue
        if re.fullmatch(r"[\w-]+", name) and _key(name) in lineup:
            entries.append(dict(lineup[_key(name)], optimizer=dict(lineup[_key(name)]["optimizer"])))
            continue
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # shadowing is reported when the config is built
                hparams = _hparams_for(name, resolve(name))
        except OptcoreError:
            hparams = {}
        entries.append({"name": name, "optimizer": {"type": name, **hparams}})
    return entries


def entries_from_file(data: Any) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """A compare file: a list of configs, or ``{"configs": [...], "num_training_steps": N,
    "seed": S}``. Each config is ``{"name": ..., "optimizer": {...}, "lr_scheduler": {...}}``
    or a bare optimizer config ``{"type": ..., ...}``. Returns the entries and the
    file's run settings."""
    options: dict[str, Any] = {}
    if isinstance(data, Mapping) and "configs" in data:
        options = {k: v for k, v in data.items() if k != "configs"}
        unknown = sorted(set(options) - {"num_training_steps", "seed"})
        if unknown:
            raise ConfigError(
                f"Unknown keys {unknown} at the top of the compare file; accepted: configs, num_training_steps, seed.",
                problems=[(k, "unknown") for k in unknown],
                accepted=["configs", "num_training_steps", "seed"],
            )
        data = data["configs"]
    if not isinstance(data, list) or not data:
        raise ConfigError(
            "A compare file is a non-empty list of configs (or a mapping with a 'configs' list), e.g.\n"
            "- {name: AdamW, optimizer: {type: AdamW, lr: 3e-3}}\n- {type: Lion, lr: 3e-4}",
            problems=[("configs", "not a non-empty list")],
        )
    return [normalise_entry(raw, i) for i, raw in enumerate(data)], options


def normalise_entry(raw: Any, index: int = 0) -> dict[str, Any]:
    """``{"name", "optimizer", "lr_scheduler"?}`` from any accepted form of one config."""
    from ._config import to_plain

    plain = to_plain(raw)
    if isinstance(plain, str):
        plain = {"type": plain}
    if not isinstance(plain, Mapping):
        raise ConfigError(f"Config #{index + 1} must be a mapping, got {plain!r}.", problems=[(f"#{index + 1}", "bad")])
    plain = dict(plain)
    name = plain.pop("name", None)
    if "num_training_steps" in plain:
        raise ConfigError(
            f"Config #{index + 1} sets num_training_steps: every config of a comparison runs the same number of "
            "steps; set it once at the top of the file (or pass --steps).",
            problems=[("num_training_steps", "per-config")],
        )
    if "optimizer" in plain and "type" not in plain:
        entry = {"optimizer": plain.pop("optimizer")}
        for key in ("lr_scheduler", "scheduler"):
            if key in plain:
                entry["lr_scheduler"] = plain.pop(key)
        if plain:
            raise ConfigError(
                f"Config #{index + 1} has unknown keys {sorted(plain)}; accepted: name, optimizer, lr_scheduler.",
                problems=[(k, "unknown") for k in plain],
                accepted=["name", "optimizer", "lr_scheduler"],
            )
    else:
        entry = {"optimizer": plain}
    if name is None:
        opt = entry["optimizer"]
        name = opt.get("type", f"config {index + 1}") if isinstance(opt, Mapping) else str(opt)
    return {"name": str(name), **entry}


def _unique_names(entries: list[dict[str, Any]]) -> None:
    seen: dict[str, int] = {}
    for entry in entries:
        count = seen[entry["name"]] = seen.get(entry["name"], 0) + 1
        if count > 1:
            entry["name"] = f"{entry['name']} #{count}"


# ------------------------------------------------------------------- running
def run_one(
    entry: dict[str, Any],
    settings: Any,
    isolate: bool = True,
    threads: int | None = 1,
    report: Callable[[int, float], None] | None = None,
) -> dict[str, Any]:
    """Run one entry (in a fresh process with ``isolate``); ``report(step, loss)``
    follows progress. Never raises for a bad config: the result says ``failed``."""
    on_step = report or (lambda step, loss: None)
    if isolate:
        return _run_isolated(entry, settings, threads, on_step)
    return _run_here(entry, settings, threads, lambda step, loss, lr: on_step(step, loss))


def _run_here(entry: dict[str, Any], settings: Any, threads: int | None, report: Callable[..., None]) -> dict[str, Any]:
    import torch

    from ._tasks import run_config

    before = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        return run_config(entry, settings, report)
    finally:
        torch.set_num_threads(before)


def _worker(entry: dict[str, Any], settings: Any, threads: int | None, queue: Any) -> None:
    """Body of the per-config process: run, stream progress, send the result."""
    every = max(1, settings.steps // 100)

    def report(step: int, loss: float, *_: Any) -> None:
        if step % every == 0 or step == settings.steps:
            queue.put(("step", step, loss))

    try:
        result = _run_here(entry, settings, threads, report)
    except BaseException as exc:  # noqa: BLE001 - anything reaches the parent as a failed config
        from ._tasks import empty_result

        result = empty_result(entry)
        result["status"], result["error"] = "failed", f"{type(exc).__name__}: {exc}"
    queue.put(("done", result))


def _run_isolated(
    entry: dict[str, Any], settings: Any, threads: int | None, report: Callable[..., None]
) -> dict[str, Any]:
    import multiprocessing
    import queue as queues

    from ._tasks import empty_result

    ctx = multiprocessing.get_context("spawn")
    channel = ctx.Queue()
    process = ctx.Process(target=_worker, args=(entry, settings, threads, channel), daemon=True)
    process.start()
    result = None
    try:
        while result is None:
            try:
                message = channel.get(timeout=0.2)
            except queues.Empty:
                if not process.is_alive() and channel.empty():
                    break
                continue
            if message[0] == "step":
                report(message[1], message[2])
            else:
                result = message[1]
        process.join(timeout=30)
    finally:
        if process.is_alive():
            process.terminate()
            process.join()
    if result is None:
        result = empty_result(entry)
        result["status"] = "failed"
        result["error"] = f"the worker process exited with code {process.exitcode} before reporting"
    return result


# -------------------------------------------------------------------- output
def _human_bytes(n: float | None) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)  # pragma: no cover


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None or not math.isfinite(value) else format(value, spec)


def _describe(entry_config: Mapping[str, Any]) -> str:
    """``optcore-lion:Lion lr=0.003 weight_decay=0.1 + cosine`` for the table."""
    opt = entry_config.get("optimizer")
    if not isinstance(opt, Mapping):
        return str(opt)
    text = " ".join([str(opt.get("type"))] + [f"{k}={v}" for k, v in opt.items() if k != "type"])
    sched = entry_config.get("lr_scheduler")
    if sched is not None:
        text += f" + {sched.get('type') if isinstance(sched, Mapping) else sched}"
    return text


def _order(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Best final loss first; diverged and failed configs last."""
    return sorted(results, key=lambda r: (r["final"] is None, r["final"] if r["final"] is not None else 0.0))


def render_table(results: list[dict[str, Any]], meta: Mapping[str, Any], console: Any) -> None:
    from rich.table import Table

    table = Table(
        title=f"optcore compare: {meta['task_summary']}",
        caption=(
            "final/best: held-out loss at the end / lowest at any evaluation (step); steps/s: training "
            "steps only; state: optimizer state (+ fp32 master copies for precision wrappers); peak RSS: "
            f"{meta['memory_note']}"
        ),
    )
    for col, justify in (
        ("#", "right"), ("config", "left"), ("final", "right"), ("best (step)", "right"),
        ("steps/s", "right"), ("state", "right"), ("B/param", "right"), ("peak RSS", "right"),
        ("Δ RSS", "right"), ("skipped", "right"), ("status", "left"),
    ):  # fmt: skip
        table.add_column(col, justify=justify, no_wrap=col != "config", overflow="ellipsis")
    detail = console.width >= 130  # the hyper-parameters fit on a second line
    for rank, r in enumerate(_order(results), 1):
        status = "ok" if r["status"] == "ok" else f"[red]{r['status']}[/red]"
        table.add_row(
            str(rank) if r["final"] is not None else "-",
            f"[bold]{r['name']}[/bold]" + (f"\n[dim]{_describe(r['config'])}[/dim]" if detail else ""),
            _fmt(r["final"], ".3f"),
            f"{_fmt(r['best'], '.3f')} ({r['best_step']})" if r["best"] is not None else "-",
            _fmt(r["steps_per_s"], ".1f"),
            _human_bytes(r["state_bytes"]),
            _fmt(r["state_bytes_per_param"], ".1f"),
            _human_bytes(r["peak_rss"]),
            _human_bytes(r["peak_rss_delta"]),
            "-" if r["skipped_steps"] is None else str(r["skipped_steps"]),
            status,
        )
    console.print(table)
    for r in results:
        for message in r.get("warnings") or ():
            console.print(f"[yellow]{r['name']}[/yellow] {message}", highlight=False)
        if r["error"]:
            console.print(f"[red]{r['name']}[/red] {r['status']}: {r['error']}", highlight=False)


def plot(results: list[dict[str, Any]], meta: Mapping[str, Any], path: Path) -> None:
    """Training loss (smoothed) and held-out loss per config, one colour each,
    the y axis zoomed on the last 90% of training where the configs separate."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ordered = [r for r in _order(results) if r["losses"]]
    fig, (ax_train, ax_val) = plt.subplots(1, 2, figsize=(14, 5.2), dpi=110, layout="constrained")
    colors = plt.get_cmap("tab10" if len(ordered) <= 10 else "tab20").colors
    late: list[float] = []
    for i, r in enumerate(ordered):
        color = colors[i % len(colors)]
        smooth = _smooth(r["losses"])
        ax_train.plot(range(1, len(smooth) + 1), smooth, color=color, lw=1.4)
        points = [(s, v) for s, v in r["val_losses"] if v is not None]
        label = f"{r['name']}  {_fmt(r['final'], '.3f')}" + ("" if r["status"] == "ok" else f" ({r['status']})")
        ax_val.plot([s for s, _ in points], [v for _, v in points], color=color, lw=1.4, marker="o", ms=3, label=label)
        cut = max(1, len(smooth) // 10)
        late += [v for v in smooth[cut:] if v is not None] + [v for s, v in points if s >= cut]
    for ax, title in ((ax_train, "training loss (moving average of 20 steps)"), (ax_val, "held-out loss")):
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        if late:
            low, high = min(late), max(late)
            ax.set_ylim(low - 0.05 * (high - low) - 0.01, high + 0.1 * (high - low) + 0.01)
    ax_train.set_ylabel("cross-entropy (nats/char)")
    fig.legend(title="config, final held-out loss", loc="outside right upper", fontsize=9, title_fontsize=9)
    fig.suptitle(f"optcore compare: {meta['task_summary']}", fontsize=11)
    fig.savefig(path)
    plt.close(fig)


def _smooth(values: list[float | None], window: int = 20) -> list[float | None]:
    out: list[float | None] = []
    recent: list[float] = []
    for v in values:
        if v is None:
            out.append(None)
            continue
        recent = (recent + [v])[-window:]
        out.append(sum(recent) / len(recent))
    return out


# ------------------------------------------------------------------ commands
def _settings(args: argparse.Namespace, file_options: Mapping[str, Any]) -> Any:
    import torch

    from ._tasks import RunSettings

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    try:
        torch.empty(1, device=device)
    except (RuntimeError, AssertionError) as exc:
        raise ConfigError(f"--device {device!r} is not usable here ({exc}); try --device cpu.") from None
    steps = args.steps if args.steps is not None else int(file_options.get("num_training_steps", DEFAULT_STEPS))
    seed = args.seed if args.seed is not None else int(file_options.get("seed", 0))
    if steps < 1:
        raise ConfigError(f"--steps must be at least 1, got {steps}.", problems=[("steps", "< 1")])
    return RunSettings(steps=steps, seed=seed, device=device)


def _task_summary(settings: Any, results: list[dict[str, Any]]) -> str:
    n = next((r["n_params"] for r in results if r["n_params"]), None)
    t = settings.task
    size = f", {n / 1e6:.2f}M params" if n else ""
    return (
        f"char transformer LM ({t.n_layers} layers, d={t.d_model}{size}), {settings.steps} steps, "
        f"batch {t.batch_size}x{t.context}, seed {settings.seed}, {settings.device}"
    )


def cmd_compare(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from ._config import load_config_file

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
    _unique_names(entries)
    settings = _settings(args, options)
    console = Console(soft_wrap=False)
    if not console.is_terminal:  # a log file or a pipe: room for the whole table
        console = Console(soft_wrap=False, width=150)
    isolation = "in-process" if args.in_process else "one fresh process per config (spawn)"
    console.print(f"Comparing {len(entries)} configs, {settings.steps} steps each on {settings.device}, {isolation}.")

    columns = (
        TextColumn("{task.description:<22}"), BarColumn(), MofNCompleteColumn(),
        TextColumn("loss {task.fields[loss]}"), TimeElapsedColumn(),
    )  # fmt: skip
    with Progress(*columns, console=console, disable=args.quiet) as progress:
        tasks = [progress.add_task(e["name"][:22], total=settings.steps, loss="-", start=False) for e in entries]

        def report(index: int, step: int, loss: float) -> None:
            progress.start_task(tasks[index])
            progress.update(tasks[index], completed=step, loss=f"{loss:.3f}")

        results = []
        for index, entry in enumerate(entries):
            result = run_one(entry, settings, not args.in_process, args.threads, lambda s, v, i=index: report(i, s, v))
            if result["status"] != "ok":
                progress.update(tasks[index], description=f"{entry['name'][:15]} {result['status']}")
            results.append(result)

    memory_note = (
        "peak resident memory of the config's own process, and its growth (Δ) from just before the optimizer was built"
        if not args.in_process
        else "peak resident memory since the config started (kernel peak mark reset; the process's earlier "
        "allocations are included), and its growth (Δ) from just before the optimizer was built"
    )
    meta = {"task_summary": _task_summary(settings, results), "memory_note": memory_note}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    _write_json(out / "results.json", settings, meta, isolation, args.threads, results)
    plot(results, meta, out / "loss_curves.png")
    render_table(results, meta, console)
    console.print(f"Wrote {out / 'results.json'} and {out / 'loss_curves.png'}")
    return 0


def _write_json(
    path: Path, settings: Any, meta: Mapping[str, Any], isolation: str, threads: int | None, results: list[Any]
) -> None:
    import dataclasses

    from . import __version__

    doc = {
        "optcore_version": __version__,
        "task": {
            "name": "char-transformer-lm",
            "corpus": "optcore/data/corpus.txt",
            **dataclasses.asdict(settings.task),
        },
        "settings": {
            "steps": settings.steps,
            "seed": settings.seed,
            "device": settings.device,
            "threads": threads,
            "isolation": isolation,
        },
        "summary": meta["task_summary"],
        "memory_note": meta["memory_note"],
        "results": results,
    }
    path.write_text(json.dumps(doc, indent=1, default=str))


def cmd_train(args: argparse.Namespace) -> int:
    import torch

    from ._config import load_config_file
    from ._tasks import run_config

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
    print(f"optcore train: {_describe(entry)} for {settings.steps} steps on {settings.device} (seed {settings.seed})")

    def report(step: int, loss: float, lr: float | None = None) -> None:
        if step % every == 0 or step == settings.steps:
            lr_text = f"  lr {lr:.2e}" if isinstance(lr, float) else ""
            print(f"step {step:>5}/{settings.steps}  loss {loss:.4f}{lr_text}", flush=True)

    result = run_config(entry, settings, report, sample_chars=args.sample)
    for message in result["warnings"]:
        print(f"warning: {message}", file=sys.stderr)
    if result["status"] != "ok":
        print(f"error: {result['name']} {result['status']}: {result['error']}", file=sys.stderr)
        return 1
    print(
        f"final held-out loss {result['final']:.4f} (best {result['best']:.4f} at step {result['best_step']}); "
        f"{_fmt(result['steps_per_s'], '.1f')} steps/s; optimizer state {_human_bytes(result['state_bytes'])} "
        f"({_fmt(result['state_bytes_per_param'], '.1f')} B/param)"
    )
    if result.get("sample"):
        print("sample:\n" + result["sample"])
    return 0


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--steps", type=int, help=f"training steps per config (default: the file's, else {DEFAULT_STEPS})")
    p.add_argument("--seed", type=int, help="seed of the model, the batches and the optimizer (default 0)")
    p.add_argument("--device", help="torch device (default: cuda when available, else cpu)")
    p.add_argument(
        "--threads", type=int, default=1,
        help="torch CPU threads (default 1: the model is tiny, and one thread is as fast and steadier on a busy "
        "machine; 0 keeps torch's default)",
    )  # fmt: skip


def add_commands(sub: Any) -> None:
    """Add ``compare`` and ``train`` to the ``optcore`` command's subparsers."""
    lineup = ", ".join(f"{label} ({' or '.join(c)}{''.join(f' {k}={v}' for k, v in h.items())})"
                       for label, c, h in DEFAULTS)  # fmt: skip
    p = sub.add_parser(
        "compare",
        help="train a tiny transformer LM with several optimizers; table, loss plot and JSON side by side",
        description="Train the same small model on the same data with several optimizer configs and compare loss "
        "curves, final/best loss, speed, optimizer-state memory, peak memory and skipped fp16 steps.",
        epilog=f"Default line-up (the installed ones): {lineup}.",
    )
    p.add_argument("--optimizers", help="comma-separated names or qualified names, e.g. Lion,AdamW,torch:SGD")
    p.add_argument("--config", help="YAML/JSON/TOML list of configs ({name, optimizer, lr_scheduler})")
    _common(p)
    p.add_argument("--out", default=DEFAULT_OUT, help=f"directory for results.json and loss_curves.png ({DEFAULT_OUT})")
    p.add_argument("--in-process", action="store_true", help="run every config in this process (faster start)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_compare)

    p = sub.add_parser("train", help="train the compare task with one config (the smallest end-to-end example)")
    p.add_argument("--config", required=True, help="YAML/JSON/TOML {optimizer, lr_scheduler, num_training_steps}")
    _common(p)
    p.add_argument("--sample", type=int, default=200, help="characters of text to sample at the end (0: none)")
    p.set_defaults(func=cmd_train)

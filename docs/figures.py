"""Regenerate every figure the README and the docs quote, from committed results.

    python docs/figures.py            # rewrite the generated sections (and plots) from docs/results/
    python docs/figures.py --check    # exit 1 if a section differs from its results file (the test does this)
    python docs/figures.py --summarise-protocol OUT   # docs/results/compare_protocol.json from a tuned
                                                      # --task a,b run's --out, then as without it

Each figure is a section of a markdown file between
``<!-- BEGIN GENERATED: NAME -->`` and ``<!-- END GENERATED: NAME -->``, and a
results file under ``docs/results/`` written by the command that measured it
(its name is in :data:`FIGURES`). To refresh a figure, rerun that command,
then this script; ``tests/docs/test_figures.py`` fails while a section and its
results file disagree, so the README cannot drift from what was measured.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "docs" / "results"


@dataclass(frozen=True)
class Figure:
    name: str
    page: Path
    results: Path
    command: str
    render: Callable[[Any], str]
    plot: Callable[[Any], None] | None = None


def _ratio(value: float, goal: float | None = None) -> str:
    return f"{value:.3f}" + (f" (goal <= {goal})" if goal is not None else "")


def render_bench_core(data: dict[str, Any]) -> str:
    lines = [
        "| params | optimizer | optcore fused / torch fused | optcore default / torch default | optcore default, x bound |",
        "|---|---|---|---|---|",
    ]
    for row in data["rows"]:
        adamw = row["optimizer"] == "AdamW"
        lines.append(
            f"| {row['params'] / 1e6:.0f}M | {row['optimizer'] if adamw else 'SGD momentum'} "
            f"| {_ratio(row['fused_ratio'], 1.02 if adamw else None)} "
            f"| {_ratio(row['default_ratio'], 0.4 if adamw else None)} "
            f"| {row['x_bound']['optcore default']:.2f} |"
        )
    bandwidths = ", ".join(f"{r['bandwidth'] / 1e9:.1f}" for r in data["rows"])
    load = f", load average {data['load_average']}" if "load_average" in data else ""
    lines += [
        "",
        f"{data.get('when', 'Measured')} on {_machine(data)}; torch {data['torch']}, {data['threads']} threads{load}. The bound is the bytes a step must move "
        "(28 per parameter for AdamW, 20 for SGD with momentum) over the in-place `a.add_(b)` bandwidth "
        f"sampled in the same rounds ({bandwidths} GB/s). `import optcore` after `import torch`: "
        f"{data['import_ms']:.1f} ms (goal <= 30 ms); the first look-up of a plugin name among 50 extra "
        f"entry-point distributions: {data['plugin_first_ms']:.1f} ms, then {data['plugin_cached_us']:.0f} µs."
        + (f" {data['note']}" if data.get("note") else ""),
    ]
    return "\n".join(lines)


def render_compare(data: dict[str, Any]) -> str:
    from optcore.compare.report import describe, human_bytes
    from optcore.compare.sweep import rank

    ranked = rank([dict(r) for r in data["rows"]])  # the ranks (ties) the current rule gives the measured finals

    lines = [
        "| # | config (built) | lr | held-out final | best (step) | steps/s | state | B/param | skipped | status |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in ranked:
        final = "-" if r["final"] is None else f"{r['final']:.3f}" + (f" ± {r['final_sd']:.3f}" if r.get("final_sd") else "")
        best = "-" if r["best"] is None else f"{r['best']:.3f} ({r['best_step']})"
        lines.append(
            f"| {r['rank']} | {describe(r['config'], r['built'])} | {'-' if r['lr'] is None else format(r['lr'], 'g')} "
            f"| {final} | {best} | {'-' if r['steps_per_s'] is None else format(r['steps_per_s'], '.1f')} "
            f"| {human_bytes(r['state_bytes'])} | {'-' if r['state_bytes_per_param'] is None else format(r['state_bytes_per_param'], '.1f')} "
            f"| {'-' if r['skipped_steps'] is None else r['skipped_steps']} | {r['status']} |"
        )
    settings = data["settings"]
    lines += [
        "",
        f"({data['summary']}; {settings['isolation']}. Reproducible: on one machine, with the same torch build and "
        "seed, the losses repeat exactly. Not reproducible across machines: there CPU kernels and thread counts "
        "differ, so the losses differ in the 2nd-3rd decimal and close rankings can swap; steps/s and memory are "
        "this machine's.)",
    ]
    return "\n".join(lines)


def render_compare_time(data: dict[str, Any]) -> str:
    jobs = data["settings"].get("jobs", 1)
    side_by_side = f", {jobs} runs at a time" if jobs > 1 else ", one run at a time"
    return f"{data['elapsed_s'] / 60:.1f} minutes ({data['settings']['steps']} steps x {len(data['rows'])} configs{side_by_side})"


def render_setup_time(data: dict[str, Any]) -> str:
    """The set-up time, with when and on what machine it was measured (it ages as main moves on)."""
    return f"{data['setup_s'] / 60:.1f} minutes ({data['how']}; measured {data['setup_measured']} on {data['machine']})"


def render_test_time(data: dict[str, Any]) -> str:
    """The test command's time and test counts, with when and on what machine they were measured."""
    if data.get("test_s") is None:
        return "(not measured yet: time `scripts/dev test` and fill test_s and test_how in docs/results/timing.json)"
    counts = f"{data['passed']:,} passed, {data['skipped']:,} skipped, {data['xfailed']:,} xfailed"
    return (f"{data['test_s'] / 60:.1f} minutes ({data['test_how']}; pytest itself {data['pytest_s']:.0f} s: "
            f"{counts}; measured {data['test_measured']} on {data['machine']})")


def render_bench_adafactor(data: dict[str, Any]) -> str:
    mode = {"relative": "relative step", "manual": "manual lr"}
    lines = [
        "| size, mode | implementation | ms/step (best) | x bound (median; range) | x floor (median) | floor, x bound | x HF |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for row in data["rows"]:
        low, high = row["x_bound_range"]
        lines.append(
            f"| {row['params'] / 1e6:.1f}M, {mode[row['mode']]} | {row['implementation']} | {row['best_ms']:.1f} "
            f"| {row['x_bound']:.2f} ({low:.2f}-{high:.2f}) | {row['x_floor']:.2f} | {row['floor_x_bound']:.2f} "
            f"| {row['x_hf']:.2f} |"
        )
    lines += ["", _footer(data, ", fp32")]
    return "\n".join(lines)


def _machine(data: dict[str, Any]) -> str:
    """Where a benchmark ran, as its results file records it (``benchmarks/common.py:machine``)."""
    return data.get("machine", "machine not recorded")


def _footer(data: dict[str, Any], extra: str = "") -> str:
    """The line under a benchmark table: when, on what machine, torch, threads, rounds, load and the command."""
    return (
        f"{data['when']} on {_machine(data)}; torch {data['torch']}, {data['threads']} threads, "
        f"{data['rounds']} rounds{extra}, load "
        f"average {data['load_average'][0]}-{data['load_average'][1]}: `{data['command']}`"
    )


def _sizes(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The first row of each size, in order."""
    first: dict[int, dict[str, Any]] = {}
    for row in rows:
        first.setdefault(row["params"], row)
    return list(first.values())


def render_bench_lion(data: dict[str, Any]) -> str:
    lines = [
        "| size | implementation | ms/step (best) | x bound (median; range) | x C kernel | x best peer | first step ms |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for row in data["rows"]:
        low, high = row["x_bound_range"]
        peer = "-" if row["x_best_peer"] is None else f"{row['x_best_peer']:.2f}"
        lines.append(
            f"| {row['params'] / 1e6:.1f}M | {row['implementation']} | {row['best_ms']:.1f} "
            f"| {row['x_bound']:.2f} ({low:.2f}-{high:.2f}) | {row['x_kernel']:.2f} | {peer} | {row['first_ms']:.0f} |"
        )
    bounds = "; ".join(
        f"{r['params'] / 1e6:.1f}M: {r['bound_ms']:.1f} ms at {r['add_gbs']:.1f} GB/s" for r in _sizes(data["rows"])
    )
    lines += ["", f"Bound (20 B/param at the median `add_` rate): {bounds}. " + _footer(data, ", fp32")]
    return "\n".join(lines)


def render_bench_fp16(data: dict[str, Any]) -> str:
    lines = [
        "| size | implementation | step ms (best) | vs hand-written loop | vs bound (median; range) |",
        "|---|---|---:|---:|---:|",
    ]
    for size in _sizes(data["rows"]):
        lines.append(
            f"| {size['params'] / 1e6:.1f}M | bandwidth bound (40 B/param at {size['add_gbs']:.1f} GB/s) "
            f"| {size['bound_ms']:.1f} | | 1.00 |"
        )
        for row in (r for r in data["rows"] if r["params"] == size["params"]):
            low, high = row["x_bound_range"]
            lines.append(
                f"| {row['params'] / 1e6:.1f}M | {row['implementation']} | {row['best_ms']:.1f} | {row['x_loop']:.3f} "
                f"| {row['x_bound']:.2f} ({low:.2f}-{high:.2f}) |"
            )
    lines += [
        "",
        "| size | wrapper | fp32 param copy + its grad, B/param (MiB) | optimizer state, B/param (MiB) |",
        "|---|---|---:|---:|",
    ]
    for row in data["memory"]:
        n, copies, state = row["params"], row["copies_bytes"], row["state_bytes"]
        lines.append(
            f"| {n / 1e6:.1f}M | {row['wrapper']} | {copies / n:.2f} ({copies / 2**20:.0f}) "
            f"| {state / n:.2f} ({state / 2**20:.0f}) |"
        )
    lines += ["", _footer(data, ", fp16 parameters")]
    return "\n".join(lines)


def render_bench_adascale(data: dict[str, Any]) -> str:
    lines = [
        (
            "| size | step vs SGD | step, x bound (median; range) | hooks ms / backward (bound) "
            "| hooks, x bound (median; range) | iteration vs SGD |"
        ),
        "|---|---:|---:|---:|---:|---:|",
    ]
    for row in data["rows"]:
        (s_low, s_high), (h_low, h_high) = row["step_x_bound_range"], row["hooks_x_bound_range"]
        lines.append(
            f"| {row['params'] / 1e6:.1f}M ({row['tensors']} tensors) "
            f"| {row['step_ratio']:.2f}x ({row['step_ms']:.2f} vs {row['sgd_step_ms']:.2f} ms) "
            f"| {row['step_x_bound']:.2f} ({s_low:.2f}-{s_high:.2f}) "
            f"| {row['hooks_ms']:.2f} ({row['hooks_bound_ms']:.2f}) "
            f"| {row['hooks_x_bound']:.2f} ({h_low:.2f}-{h_high:.2f}) "
            f"| {row['iteration_ratio']:.2f}x ({row['iteration_ms']:.1f} vs {row['sgd_iteration_ms']:.1f} ms) |"
        )
    rates = "; ".join(f"{r['params'] / 1e6:.1f}M: {r['add_gbs']:.1f} GB/s" for r in data["rows"])
    lines += [
        "",
        f"Bounds (20 B/param for the step, 4 B/param per backward for the hooks) at the median `add_` rate: {rates}. "
        + _footer(data, f" of {data['reps']} reps, {data['clock']} clock, fp32"),
    ]
    return "\n".join(lines)


def render_bench_adascale_ddp(data: dict[str, Any]) -> str:
    lines = ["| size | AdaScaleSGD vs SGD, per iteration (median; range) | AdaScaleSGD | SGD |", "|---|---:|---:|---:|"]
    for row in data["rows"]:
        low, high = row["ratio_range"]
        lines.append(
            f"| {row['params'] / 1e6:.1f}M ({row['tensors']} tensors, {row['rows_per_rank']} rows per rank) "
            f"| {row['ratio']:.2f}x ({low:.2f}-{high:.2f}) | {row['adascale_ms']:.1f} ms | {row['sgd_ms']:.1f} ms |"
        )
    lines += ["", _footer(data, f" of {data['reps']} iterations, {data['world_size']} DDP ranks (gloo), fp32")]
    return "\n".join(lines)


def render_road(data: dict[str, Any]) -> str:
    parts = []
    for r in data["roads"]:
        core = sum(1 for a, b in r["hops"] if not a.startswith("optcore_") and not b.startswith("optcore_"))
        parts += [
            f"`build_optimizer({json.dumps(r['config'])}, model)`: {len(r['hops'])} hops, {core} of them "
            "between core modules (the others enter or leave a plugin's).",
            "",
            "```text",
            *(f"{i:2d}. {a} -> {b}" for i, (a, b) in enumerate(r["hops"], 1)),
            "```",
            "",
        ]
    return "\n".join(parts[:-1])


def render_placements(data: dict[str, Any]) -> str:
    """The support table of docs/distributed.md from optcore.testing.check_placements' report."""
    names = {
        "ddp": "DDP", "fsdp2": "FSDP2", "fsdp2-3": "FSDP2 x3", "fsdp2-4": "FSDP2 x4", "hsdp-2x2": "HSDP 2x2",
        "zero1": "`zero_redundancy`", "deepspeed-zero1": "DS ZeRO-1", "deepspeed-zero2": "DS ZeRO-2",
        "deepspeed-zero3": "DS ZeRO-3", "dcp-2to1": "DCP 2->1", "dcp-1to2": "DCP 1->2", "dcp-2to3": "DCP 2->3",
        "dcp-3to2": "DCP 3->2", "dcp-4to1": "DCP 4->1",
    }
    cells = {(r["optimizer"], r["placement"]): r for r in data["results"]}
    lines = [
        "| optimizer | steps | noise | " + " | ".join(names.get(p, p) for p in data["placements"]) + " |",
        "|---" * (len(data["placements"]) + 3) + "|",
    ]
    notes: list[str] = []
    for name in data["optimizers"]:
        row = []
        for p in data["placements"]:
            r = cells[name, p]
            text = {"equal": "yes", "refused": "refused"}.get(r["outcome"], f"**{r['outcome']}**")
            if r["outcome"] in ("equal", "differs") and r["max_diff"] is not None and r.get("noise"):
                text += f" ({r['max_diff'] / r['noise']:.2g}x)"
            if r["outcome"] in ("crashed", "differs") and r["message"]:
                first = " ".join(r["message"].split("\n")[0].split())
                first = first if len(first) <= 160 else first[:157] + "..."
                if first not in notes:
                    notes.append(first)
                text += f" [{notes.index(first) + 1}]"
            row.append(text)
        noise = data.get("noise", {}).get(name)
        steps = data.get("row_steps", {}).get(name, data["steps"])
        lines.append(f"| {name} | {steps} | {'-' if noise is None else f'{noise:.0e}'} | " + " | ".join(row) + " |")
    env = data["environment"]
    counts = {k: sum(1 for r in data["results"] if r["outcome"] == k) for k in ("equal", "refused", "differs", "crashed")}
    lines += [""] + [f"[{i}] `{note}`" for i, note in enumerate(notes, 1)] + ([""] if notes else [])
    lines.append(
        f"{len(data['placements'])} placements, {counts['equal']} cells equal, {counts['refused']} refused, "
        f"{counts['differs']} differ, {counts['crashed']} crashed. "
        "yes (the largest difference from one process, as a multiple of the row's noise): equal within "
        f"{data['atol']:g} times the noise, which is one process against itself with the batch summed in another "
        "order (at least one float epsilon of the largest parameter); refused: a "
        "`ConfigError` that names the reason and what works instead (every message is in "
        "`docs/results/placements.json`); **crashed** / **differs**: a bug, listed in `tests/distributed/test_placements.py`'s "
        f"KNOWN. At least {data['steps']} steps (three periods where an optimizer declares one) on {env['backend']} "
        f"ranks against one process on the full batch; torch {env['torch']}, DeepSpeed "
        f"{env.get('deepspeed', 'not installed')}; {data['machine']}, {data['when']}, {data['seconds']} s: "
        f"`{data['command']}`"
    )
    return "\n".join(lines)


def plot_compare(data: dict[str, Any]) -> None:
    from optcore.compare.report import plot_curves

    meta = {"summary": data["summary"], "memory_note": data["memory_note"], "seeds": data["settings"]["seeds"]}
    plot_curves(data["rows"], data["results"], meta, ROOT / "docs" / "img" / "compare.png")


def render_compare_tasks(data: dict[str, Any]) -> str:
    from optcore.compare.scoreboard import median_reached, target_origin

    scores = data["scores"]
    n = len(scores["problems"])
    lines = [
        "| config | reached | steps to target (median) | seconds (median) | score by steps | score by seconds |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name, entry in scores["optimizers"].items():
        steps, seconds = median_reached(entry, "steps"), median_reached(entry, "seconds")
        lines.append(
            f"| {name} | {entry['reached']}/{n} | {'-' if steps is None else format(steps, 'g')} "
            f"| {'-' if seconds is None else format(seconds, '.2f')} | {entry['score_steps']:.3f} "
            f"| {'-' if entry['score_seconds'] is None else format(entry['score_seconds'], '.3f')} |"
        )
    targets = "; ".join(
        f"{task} {t['loss']:.4g} (" + ("given" if t["source"] == "given" else target_origin(t)) + ")"
        for task, t in scores["targets"].items()
    )
    summaries = "; ".join(f"{task}: {t['summary']}" for task, t in data["tasks"].items())
    lines += ["", f"Targets (held-out loss): {targets}. {summaries}."]
    return "\n".join(lines)


def render_compare_targets(data: dict[str, Any]) -> str:
    """The default run's time-to-target table with the target set from its runs, scored
    now from the runs stored in its ``results.json``, as ``optcore compare`` scores them."""
    from optcore.compare import scoreboard, scoring

    scores = scoring.summarise(scoreboard.runs_by_optimizer(data))
    return render_compare_tasks({"scores": scores, "tasks": {data["task"]["spec"]: {"summary": data["summary"]}}})


def plot_compare_tasks(data: dict[str, Any]) -> None:
    from optcore.compare.scoreboard import plot_profile

    title = f"{len(data['tasks'])} tasks ({', '.join(data['tasks'])})"
    plot_profile(data["scores"], ROOT / "docs" / "img" / "choosing" / "tasks" / "profile.png", title)


PROTOCOL = ROOT / "docs" / "img" / "choosing" / "protocol"


def summarise_protocol(folder: Path) -> dict[str, Any]:
    """The part of a tuned multi-task comparison (``--task a,b --trials K``) that the
    docs show: its top-level ``results.json`` (tasks, targets, scores) and, per task,
    the protocol, the rows at defaults and re-seeded, and every study's trials, without
    the per-step loss curves (which stay in the run's own folder)."""
    top = json.loads((folder / "results.json").read_text())
    for task, entry in top["tasks"].items():
        doc = json.loads((folder / task / "results.json").read_text())
        keep = ("name", "lr", "final", "final_sd", "n_seeds", "status", "rank")
        entry.update(
            protocol=doc["protocol"],
            settings={k: doc["settings"][k] for k in ("steps", "device", "threads", "jobs", "isolation")},
            defaults=[{k: r.get(k) for k in keep} for r in doc["rows"]],
            reseeded=[{k: r.get(k) for k in keep} for r in doc["tuned"]["rows"]],
            optimizers=doc["tuned"]["optimizers"],
        )
    return top


def render_compare_protocol(data: dict[str, Any]) -> str:
    from optcore.compare.tuning import describe_unstable

    def loss(value: float | None, sd: float | None = None) -> str:
        return "-" if value is None else f"{value:.3f}" + (f" ± {sd:.3f}" if sd is not None else "")

    lines = [
        "| task | # | optimizer | at defaults | best per study | score | chosen point | re-seeded |",
        "|---|---|---|---:|---:|---:|---|---:|",
    ]
    unstable = []
    for task, entry in data["tasks"].items():
        defaults = {r["name"]: r for r in entry["defaults"]}
        for row in entry["reseeded"]:
            record = entry["optimizers"][row["name"]]
            point = " ".join(f"{k}={v:.3g}" for k, v in (record["chosen"] or {}).get("point", {}).items()) or "-"
            at = defaults.get(row["name"])
            lines.append(
                f"| {task} | {row['rank']} | {row['name']} | {loss(at['final'], at['final_sd']) if at else '-'} "
                f"| {' '.join(loss(s['best']) for s in record['studies'])} | {loss(record['score'])} | {point} "
                f"| {loss(row['final'], row['final_sd'])} |"
            )
        unstable += [f"{task}: {line}" for name, r in entry["optimizers"].items()
                     if (line := describe_unstable(name, r["unstable"]))]  # fmt: skip
    (protocol,) = {json.dumps(e["protocol"], sort_keys=True) for e in data["tasks"].values()}
    protocol = json.loads(protocol)
    settings = next(iter(data["tasks"].values()))["settings"]
    lines += [
        "",
        f"{protocol['trials']} trials x {protocol['studies']} studies per optimizer ({protocol['sampler']} points, "
        f"sampler seed {protocol['sampler_seed']}), each trial on seed {protocol['tuning_seed']}; the chosen point "
        f"re-run on seeds {','.join(map(str, protocol['seeds']))} (mean ± sd of the final held-out loss, ranked "
        f"with ties where the spreads overlap); {settings['steps']} steps per run, {settings['device']}, "
        f"{settings['threads']} thread(s), {settings['isolation']}."
        + (" Diverged: " + "; ".join(unstable) + "." if unstable else " No trial diverged."),
        "",
        f"Time to target, over the {len(data['tasks'])} tasks and the {len(protocol['seeds'])} re-seeded runs "
        "of each chosen point:",
        "",
        render_compare_tasks(data),
    ]
    return "\n".join(lines)


def plot_compare_protocol(data: dict[str, Any]) -> None:
    from optcore.compare.commands import _trial_rows
    from optcore.compare.report import plot_sweep
    from optcore.compare.scoreboard import plot_profile

    PROTOCOL.mkdir(parents=True, exist_ok=True)
    title = f"tuned, {len(data['tasks'])} tasks ({', '.join(data['tasks'])})"
    plot_profile(data["scores"], PROTOCOL / "profile.png", title)
    for task, entry in data["tasks"].items():
        meta = {"summary": f"{task}, {entry['settings']['steps']} steps, every tuning trial "
                           f"(seed {entry['protocol']['tuning_seed']})", "memory_note": "", "seeds": [entry['protocol']['tuning_seed']]}  # fmt: skip
        plot_sweep(_trial_rows(entry), meta, PROTOCOL / f"tuning-{task}.png")


FIGURES: list[Figure] = [
    Figure(
        "road",
        ROOT / "docs" / "architecture.md",
        RESULTS / "road.json",
        "python benchmarks/road.py --json docs/results/road.json",
        render_road,
    ),
    Figure(
        "compare",
        ROOT / "README.md",
        RESULTS / "compare.json",
        "optcore compare --out /tmp/c && cp /tmp/c/results.json docs/results/compare.json",
        render_compare,
        plot_compare,
    ),
    Figure(
        "compare-targets",
        ROOT / "docs" / "choosing.md",
        RESULTS / "compare.json",
        "optcore compare --out /tmp/c && cp /tmp/c/results.json docs/results/compare.json",
        render_compare_targets,
    ),
    Figure(
        "compare-tasks",
        ROOT / "docs" / "choosing.md",
        RESULTS / "compare_tasks.json",
        "optcore compare --task char-lm,vision --optimizers torch:AdamW,optcore-lion:Lion,torch:SGD --seeds 0,1,2 "
        "--target char-lm=2.35,vision=1.0 --out docs/img/choosing/tasks && cp docs/img/choosing/tasks/results.json docs/results/compare_tasks.json",
        render_compare_tasks,
        plot_compare_tasks,
    ),
    Figure(
        "compare-protocol",
        ROOT / "docs" / "choosing.md",
        RESULTS / "compare_protocol.json",
        "optcore compare --task char-lm,vision --optimizers torch:AdamW,optcore-lion:Lion,torch:SGD --algoperf "
        "--seeds 1,2,3 --steps 150 --target char-lm=2.4,vision=0.9 --in-process --quiet "
        "--out docs/img/choosing/protocol && python docs/figures.py --summarise-protocol docs/img/choosing/protocol",
        render_compare_protocol,
        plot_compare_protocol,
    ),
    Figure(
        "placements",
        ROOT / "docs" / "distributed.md",
        RESULTS / "placements.json",
        "python benchmarks/placements.py --json docs/results/placements.json",
        render_placements,
    ),
    Figure(
        "timing-compare",
        ROOT / "README.md",
        RESULTS / "compare.json",
        "optcore compare --out /tmp/c && cp /tmp/c/results.json docs/results/compare.json",
        render_compare_time,
    ),
    Figure(
        "timing-setup",
        ROOT / "README.md",
        RESULTS / "timing.json",
        "time scripts/dev setup in a fresh clone (see the file's 'how')",
        render_setup_time,
    ),
    Figure(
        "timing-test",
        ROOT / "README.md",
        RESULTS / "timing.json",
        "time scripts/dev test with .venv set up (see the file's 'test_how')",
        render_test_time,
    ),
    Figure(
        "bench-core",
        ROOT / "README.md",
        RESULTS / "bench_core.json",
        "python benchmarks/bench_core.py --json docs/results/bench_core.json",
        render_bench_core,
    ),
    Figure(
        "bench-adafactor",
        ROOT / "plugins" / "optcore-adafactor" / "README.md",
        RESULTS / "bench_adafactor.json",
        "python benchmarks/bench_adafactor.py --sizes 10M,100M --ours c --peers none --modes relative,manual "
        "--json docs/results/bench_adafactor.json",
        render_bench_adafactor,
    ),
    Figure(
        "bench-adascale-ddp",
        ROOT / "plugins" / "optcore-adascale" / "README.md",
        RESULTS / "bench_adascale_ddp.json",
        "python benchmarks/bench_adascale_ddp.py --sizes 10M 100M --rounds 5 --reps 3 "
        "--json docs/results/bench_adascale_ddp.json",
        render_bench_adascale_ddp,
    ),
    Figure(
        "bench-lion",
        ROOT / "plugins" / "optcore-lion" / "README.md",
        RESULTS / "bench_lion.json",
        "TORCHINDUCTOR_FORCE_DISABLE_CACHES=1 python benchmarks/bench_lion.py --sizes 10M,100M --rounds 5 "
        "--json docs/results/bench_lion.json",
        render_bench_lion,
    ),
    Figure(
        "bench-fp16",
        ROOT / "plugins" / "optcore-fp16" / "README.md",
        RESULTS / "bench_fp16.json",
        "python benchmarks/bench_fp16.py --sizes 10M,100M --rounds 7 --json docs/results/bench_fp16.json",
        render_bench_fp16,
    ),
    Figure(
        "bench-adascale",
        ROOT / "plugins" / "optcore-adascale" / "README.md",
        RESULTS / "bench_adascale.json",
        "python benchmarks/bench_adascale.py --sizes 10M 100M --threads 1 --rounds 5 --reps 3 "
        "--json docs/results/bench_adascale.json",
        render_bench_adascale,
    ),
]


def _pattern(name: str) -> re.Pattern[str]:
    """A block section (markers on lines of their own) or an inline one."""
    return re.compile(
        rf"(<!-- BEGIN GENERATED: {re.escape(name)} -->\n?)(.*?)(\n?<!-- END GENERATED: {re.escape(name)} -->)", re.S
    )


def expected(figure: Figure) -> str:
    return figure.render(json.loads(figure.results.read_text()))


def current(figure: Figure) -> str:
    match = _pattern(figure.name).search(figure.page.read_text())
    if match is None:
        raise SystemExit(f"{figure.page.name} has no GENERATED section {figure.name!r}")
    return match.group(2)


def write(figure: Figure) -> None:
    text = figure.page.read_text()
    body = expected(figure)
    def fill(m: re.Match[str]) -> str:
        block = m.group(1).endswith("\n")  # markers on lines of their own: keep the end marker on its own too
        end = m.group(3) if not block or m.group(3).startswith("\n") else "\n" + m.group(3)
        return m.group(1) + body + end

    figure.page.write_text(_pattern(figure.name).sub(fill, text))
    if figure.plot is not None:
        figure.plot(json.loads(figure.results.read_text()))


def _where(figure: Figure) -> str:
    page = figure.page.relative_to(ROOT) if figure.page.is_relative_to(ROOT) else figure.page
    return f"{page}:{figure.name}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true")
    parser.add_argument("--summarise-protocol", metavar="OUT", type=Path,
                        help="write docs/results/compare_protocol.json from a tuned --task a,b comparison's --out")
    args = parser.parse_args(argv)
    if args.summarise_protocol is not None:
        target = RESULTS / "compare_protocol.json"
        target.write_text(json.dumps(summarise_protocol(args.summarise_protocol), indent=1) + "\n")
        print(f"wrote {target.relative_to(ROOT)}")
    stale = []
    for figure in FIGURES:
        if not figure.results.exists():  # a new figure before its first measured run: say so, do the others
            stale.append(f"{_where(figure)} ({figure.results.name} is missing; run `{figure.command}`)")
        elif args.check:
            if current(figure) != expected(figure):
                stale.append(f"{_where(figure)} (from {figure.results.name}; rerun `{figure.command}`)")
        else:
            write(figure)
            print(f"wrote {_where(figure)} from {figure.results.relative_to(ROOT)}")
    for line in stale:
        print(f"stale: {line}", file=sys.stderr)
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())

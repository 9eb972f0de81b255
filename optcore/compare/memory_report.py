"""What ``optcore memory`` shows: a table, JSON, and a stacked bar chart of
parameters, gradients, master copies and optimizer state per config."""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from optcore import ConfigError

from .report import fmt, human_bytes


def _source(args: argparse.Namespace) -> tuple[Any, Any, str]:
    """The model factory, a reshaped twin for the shape check (``--params`` only), and a description."""
    from .memory import FlatParams, factory_from_hf_config, factory_from_spec, parse_count

    if args.params:
        n = parse_count(args.params)
        return (lambda: FlatParams(n)), (lambda: FlatParams(n, as_matrix=True)), f"{n:,} parameters (one flat tensor)"
    if args.model:
        return factory_from_spec(args.model), None, f"model {args.model}"
    return factory_from_hf_config(args.hf_config), None, f"transformers config {args.hf_config}"


def run_memory_command(args: argparse.Namespace) -> int:
    from ..files import load_config_file
    from .lineup import default_entries, entries_from_file, entries_from_names, unique_names
    from .memory import predict_all

    if args.world_size < 1:
        raise ConfigError(f"--world-size must be at least 1, got {args.world_size}.", problems=[("world_size", "< 1")])
    if args.memory_efficient and args.precision == "fp32":
        raise ConfigError("--memory-efficient is for --precision bf16 or fp16 (no fp32 master copies).")
    if args.config:
        entries = entries_from_file(load_config_file(args.config))[0]
    elif args.optimizers:
        entries = entries_from_names(args.optimizers)
    else:
        entries = default_entries()
    unique_names(entries)
    factory, twin, what = _source(args)
    rows = predict_all(entries, factory, args.precision, args.memory_efficient, args.world_size, args.zero_stage, twin)
    meta = {"model": what, "n_params": rows[0]["n_params"] if rows else None, "precision": args.precision,
            "memory_efficient": args.memory_efficient, "world_size": args.world_size, "zero_stage": args.zero_stage}  # fmt: skip
    doc = {**meta, "rows": rows}
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "memory.json").write_text(json.dumps(doc, indent=1, default=str))
        plot_memory(rows, meta, out / "memory.png")
    if args.json:
        print(json.dumps(doc, indent=1, default=str))
    else:
        render_memory(rows, meta)
        if args.out:
            print(f"Wrote {Path(args.out) / 'memory.json'} and {Path(args.out) / 'memory.png'}")
    return 0


def _title(meta: Mapping[str, Any]) -> str:
    text = f"{meta['model']}, {meta['precision']}{' memory-efficient' if meta['memory_efficient'] else ''}"
    if meta["world_size"] > 1:
        text += f", ZeRO-{meta['zero_stage']} over {meta['world_size']} ranks"
    return text


def render_memory(rows: Sequence[Mapping[str, Any]], meta: Mapping[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(soft_wrap=False)
    if not console.is_terminal:
        console = Console(soft_wrap=False, width=150)
    table = Table(
        title=f"optcore memory: {_title(meta)}",
        caption="state: optimizer state incl. master copies (the fp32 copies and their gradients of a precision "
        "wrapper, also shown alone); total: state + gradients + parameters; activations are not included. "
        "Predicted from the optimizer built on the meta device and stepped once.",
    )
    columns = ["config (built)", "state", "master", "grads", "params", "total", "B/param"]
    if meta["world_size"] > 1:
        columns.append("per rank")
    for col in [*columns, "note"]:
        table.add_column(col, justify="left" if col in ("config (built)", "note") else "right",
                         no_wrap=col != "note", overflow="fold")  # fmt: skip
    for r in rows:
        cells = [f"[bold]{r['name']}[/bold]\n[dim]{r['built'] or '-'}[/dim]", human_bytes(r["state_bytes"]),
                 human_bytes(r["master_bytes"]) if r["master_bytes"] else "-", human_bytes(r["grad_bytes"]),
                 human_bytes(r["param_bytes"]), human_bytes(r["total_bytes"]), fmt(r["total_bytes_per_param"], ".1f")]  # fmt: skip
        if meta["world_size"] > 1:
            cells.append(human_bytes(r["per_rank_bytes"]))
        note = r["note"] or ""
        cells.append(f"[red]{note}[/red]" if r["status"] != "ok" else f"[yellow]{note}[/yellow]")
        table.add_row(*cells)
    console.print(table)


def plot_memory(rows: Sequence[Mapping[str, Any]], meta: Mapping[str, Any], path: Path) -> None:
    """Stacked horizontal bars (GiB): parameters, gradients, master copies, optimizer state."""
    from .report import _pyplot

    plt = _pyplot()
    shown = [r for r in rows if r["state_bytes"] is not None]
    fig, ax = plt.subplots(figsize=(9, 0.45 * len(shown) + 1.6), dpi=110, layout="constrained")
    gib = 1024**3
    parts = (("params", lambda r: r["param_bytes"]), ("grads", lambda r: r["grad_bytes"]),
             ("master copies", lambda r: r["master_bytes"] or 0),
             ("optimizer state", lambda r: r["state_bytes"] - (r["master_bytes"] or 0)))  # fmt: skip
    left = [0.0] * len(shown)
    labels = [r["name"] for r in shown]
    for label, value in parts:
        widths = [value(r) / gib for r in shown]
        ax.barh(labels, widths, left=left, label=label)
        left = [a + b for a, b in zip(left, widths)]
    ax.invert_yaxis()
    ax.set_xlabel("GiB (whole model, before sharding)")
    ax.set_title(f"optcore memory: {_title(meta)}", fontsize=10)
    ax.legend(fontsize=8, loc="lower right")
    ax.grid(alpha=0.3, axis="x")
    fig.savefig(path)
    plt.close(fig)

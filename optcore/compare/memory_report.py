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


def _sharding(args: argparse.Namespace) -> str | None:
    """``--sharding``, with the older ``--zero-stage K`` read as ``--sharding zeroK``."""
    sharding = getattr(args, "sharding", None)
    if args.zero_stage is not None:
        if sharding is not None and sharding != f"zero{args.zero_stage}":
            raise ConfigError(f"--zero-stage {args.zero_stage} and --sharding {sharding} disagree: give --sharding "
                              "alone (fsdp2, zero1, zero2 or zero3).", problems=[("zero_stage", "conflicts")])  # fmt: skip
        sharding = f"zero{args.zero_stage}"
    if args.world_size < 1:
        raise ConfigError(f"--world-size must be at least 1, got {args.world_size}.", problems=[("world_size", "< 1")])
    if args.world_size > 1 and sharding is None:
        raise ConfigError(f"--world-size {args.world_size} says how many ranks, not what they shard: add --sharding "
                          "fsdp2|zero1|zero2|zero3.", problems=[("sharding", "missing")])  # fmt: skip
    return sharding


def run_memory_command(args: argparse.Namespace) -> int:
    from ..files import load_config_file
    from .lineup import default_entries, entries_from_file, entries_from_names, unique_names
    from .memory import _accumulations, predict_all
    from .memory_check import differences, measure

    sharding = _sharding(args)
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
    rows = predict_all(entries, factory, args.precision, args.memory_efficient, args.world_size, sharding, twin)
    check = getattr(args, "check", False)
    differ = False
    if check:
        for row in rows:
            if row["status"] != "ok" and row.get("per_rank") is None:
                continue
            try:
                row["measured"] = measure(row["config"], factory, _accumulations(row["config"]), sharding, args.world_size,
                                          whole=row["status"] == "ok")  # fmt: skip
            except Exception as exc:  # noqa: BLE001 - shown in the row; the other configs still run
                row["measured"], row["differences"] = None, [f"the real step failed: {type(exc).__name__}: {exc}"]
            else:
                row["differences"] = differences(row, row["measured"])
            differ = differ or bool(row["differences"])
    meta = {"model": what, "n_params": rows[0]["n_params"] if rows else None, "precision": args.precision,
            "memory_efficient": args.memory_efficient, "world_size": args.world_size, "sharding": sharding,
            "check": check}  # fmt: skip
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
    return 1 if differ else 0


def _title(meta: Mapping[str, Any]) -> str:
    text = f"{meta['model']}, {meta['precision']}{' memory-efficient' if meta['memory_efficient'] else ''}"
    if meta.get("sharding"):
        text += f", {meta['sharding']} over {meta['world_size']} ranks"
    return text


def render_memory(rows: Sequence[Mapping[str, Any]], meta: Mapping[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(soft_wrap=False)
    if not console.is_terminal:
        console = Console(soft_wrap=False, width=170)
    sharded, check = bool(meta.get("sharding")), bool(meta.get("check"))
    caption = ("state: optimizer state incl. master copies (the fp32 copies and their gradients of a precision "
               "wrapper, also shown alone); total: state + gradients + parameters (resident); step peak: what a "
               "step allocates on top and frees (foreach/fused temporaries); activations are not included. "
               "Predicted from the optimizer built on the meta device and stepped.")  # fmt: skip
    if sharded:
        caption += " per rank: rank 0's parameters + gradients + state (see `optcore.compare.memory_shard`)."
    if check:
        caption += " measured: a real step on the CPU (tensor storages); a red figure differs."
    table = Table(title=f"optcore memory: {_title(meta)}", caption=caption)
    columns = ["config (built)", "state", "master", "grads", "params", "total", "B/param", "step peak"]
    if sharded:
        columns += ["per rank", "rank step peak"]
    for col in [*columns, "note"]:
        table.add_column(col, justify="left" if col in ("config (built)", "note") else "right",
                         no_wrap=col != "note", overflow="fold")  # fmt: skip
    for r in rows:
        real = r.get("measured") or {}
        rank, real_rank = r.get("per_rank") or {}, real.get("per_rank") or {}
        cells = [f"[bold]{r['name']}[/bold]\n[dim]{r['built'] or '-'}[/dim]", _cell(r, real, "state_bytes"),
                 human_bytes(r["master_bytes"]) if r["master_bytes"] else "-", _cell(r, real, "grad_bytes"),
                 _cell(r, real, "param_bytes"), human_bytes(r["total_bytes"]), fmt(r["total_bytes_per_param"], ".1f"),
                 _cell(r, real, "transient_bytes")]  # fmt: skip
        if sharded:
            cells += [_cell(rank, real_rank, "total_bytes"), _cell(rank, real_rank, "transient_bytes")]
        notes = [n for n in (r["note"], r.get("per_rank_note")) if n]
        notes += r.get("differences") or []
        note = "; ".join(notes)
        cells.append(f"[red]{note}[/red]" if r["status"] != "ok" or r.get("differences") else f"[yellow]{note}[/yellow]")
        table.add_row(*cells)
    console.print(table)


def _cell(predicted: Mapping[str, Any], measured: Mapping[str, Any], key: str) -> str:
    """A predicted figure, and the measured one under it where ``--check`` ran (red where they differ)."""
    text = human_bytes(predicted.get(key))
    if key not in measured or measured[key] is None:
        return text
    same = measured[key] == predicted.get(key)
    real = human_bytes(measured[key])
    return f"{text}\n[{'green' if same else 'red'}]{real}[/]"


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

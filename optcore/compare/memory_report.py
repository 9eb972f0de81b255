"""What ``optcore memory`` shows: a table, JSON, and a stacked bar chart of
parameters, gradients, master copies and optimizer state per config."""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from optcore import ConfigError

from .._values import clean_text
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
    """One line per config, at most 100 columns where the output is not a terminal
    (a terminal's own width otherwise; the note column folds). Names come from the
    user's files, so they are shown as text, never as markup."""
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    console = Console(soft_wrap=False)
    if not console.is_terminal:
        console = Console(soft_wrap=False, width=100)
    sharded, check = bool(meta.get("sharding")), bool(meta.get("check"))
    caption = ("state: optimizer state incl. master copies (the fp32 copies and their gradients of a precision "
               "wrapper, also shown alone); total: state + gradients + parameters (resident); step peak: what a "
               "step allocates on top and frees (foreach/fused temporaries); activations are not included. "
               "Predicted from the optimizer built on the meta device and stepped.")  # fmt: skip
    if sharded:
        caption += " per rank: rank 0's parameters + gradients + state (see `optcore.compare.memory_shard`)."
    if check:
        caption += (" check: a real step on the CPU counted the same tensor storages (ok), or the note says which "
                    "figure differs.")  # fmt: skip
    from rich import box

    table = Table(title=Text(f"optcore memory: {_title(meta)}"), box=box.SIMPLE_HEAD, pad_edge=False)
    # what every config shares (the model's parameters and gradients) goes above the table, not in a column
    # (from the configs that were predicted: one whose build failed has no precision applied to show)
    predicted = [r for r in rows if r["state_bytes"] is not None] or list(rows)
    shared = {key: {r[key] for r in predicted} for key in ("param_bytes", "grad_bytes")}
    common = [f"{label} {human_bytes(next(iter(shared[key])))}" for key, label in
              (("param_bytes", "params"), ("grad_bytes", "grads")) if len(shared[key]) == 1]  # fmt: skip
    columns = ["config", "state"]
    columns += ["master"] if any(r["master_bytes"] for r in rows) else []
    columns += [label for key, label in (("grad_bytes", "grads"), ("param_bytes", "params")) if len(shared[key]) > 1]
    columns += ["total", "B/param", "step peak"]
    if sharded:
        columns += ["per rank", "rank peak"]
    if check:
        columns.append("check")
    notes: list[Any] = []
    body: list[list[Any]] = []
    for r in rows:
        rank = r.get("per_rank") or {}
        values = {"state": human_bytes(r["state_bytes"]), "master": human_bytes(r["master_bytes"]) if r["master_bytes"]
                  else "-", "grads": human_bytes(r["grad_bytes"]), "params": human_bytes(r["param_bytes"]),
                  "total": human_bytes(r["total_bytes"]), "B/param": fmt(r["total_bytes_per_param"], ".1f"),
                  "step peak": human_bytes(r["transient_bytes"]), "per rank": human_bytes(rank.get("total_bytes")),
                  "rank peak": human_bytes(rank.get("transient_bytes")), "check": _check_cell(r)}  # fmt: skip
        said = [n for n in (r["note"], r.get("per_rank_note")) if n] + list(r.get("differences") or [])
        bad = r["status"] != "ok" or bool(r.get("differences"))
        if said:
            notes.append(Text(f"{len(notes) + 1}. {_label(r)}: {'; '.join(said)}", style="red" if bad else "yellow"))
        body.append([Text(_label(r), style="bold"), *(values[c] for c in columns[1:]), str(len(notes)) if said else ""])
    headers = _headers([*columns, "note"], body, console.width)
    for col, header in zip([*columns, "note"], headers):
        table.add_column(header, justify="left" if col == "config" else "right", no_wrap=col != "config",
                         overflow="fold")
    for cells in body:
        table.add_row(*cells)
    if common:
        table.caption = Text(f"every config: {', '.join(common)}")
    console.print(table)
    for note in notes:  # under the table, so that long notes leave its columns their width
        console.print(note)
    console.print(Text(caption, style="dim"))


def _headers(columns: list[str], body: list[list[Any]], width: int) -> list[str]:
    """The column headers: on two lines ("step" over "peak") where the figures
    would otherwise leave the config column less than its longest word (at least
    16 characters, at most 30) of ``width``: figures never wrap; the config
    column wraps between words."""
    def figures(headers: list[str]) -> int:
        cells = [max(len(line) for line in h.split("\n")) for h in headers[1:]]
        for row in body:
            cells = [max(w, len(str(c))) for w, c in zip(cells, row[1:])]
        return sum(cells) + 3 * len(cells) + 2  # a space each side and a separator; the edges

    word = max((len(w) for row in body for w in str(row[0]).split()), default=6)
    if width - figures(columns) - 3 >= min(max(word, 16), 30):
        return columns
    return [c if c == "config" else c.replace(" ", "\n") for c in columns]


def _label(row: Mapping[str, Any]) -> str:
    """The config's name, and what it resolved to where that is not torch's class of the same name."""
    name, built = clean_text(row["name"], 60), row.get("built")
    if not built or built in (name, f"torch:{name}"):
        return name
    return f"{name} ({clean_text(built, 60)})"


def _check_cell(row: Mapping[str, Any]) -> Any:
    from rich.text import Text

    if "measured" not in row:
        return Text("-", style="dim")
    if row.get("differences"):
        return Text("differs", style="red")
    return Text("ok", style="green")


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

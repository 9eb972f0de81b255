"""Generate the schedule reference of docs/schedulers.md and one plot per schedule.

    python docs/gen_schedule_plots.py            # rewrite plots and the reference section
    python docs/gen_schedule_plots.py --check    # exit 1 if the markdown is stale

Every built-in schedule (and transformers' ``reduce_lr_on_plateau``, which is
torch's ``ReduceLROnPlateau``) is built from its ``example`` config through
``optcore.build_scheduler`` on a 1-parameter SGD with lr 1e-3, and stepped for
1000 steps; metric-driven schedules see a fixed, seeded loss curve, epoch
schedules start a new epoch every 100 steps. The curve is saved to
``docs/img/schedules/<name>.png`` and the section between the GENERATED
markers of ``docs/schedulers.md`` is rewritten from the registry (formula
docstrings, schema fields, example configs), so the docs cannot drift from
the code.
"""

from __future__ import annotations

import argparse
import inspect
import random
import re
import sys
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402

import optcore  # noqa: E402
from optcore.schedulers import BUILTINS  # noqa: E402

DOCS = Path(__file__).resolve().parent
IMG = DOCS / "img" / "schedules"
PAGE = DOCS / "schedulers.md"
BEGIN, END = "<!-- BEGIN GENERATED: schedules -->", "<!-- END GENERATED: schedules -->"
STEPS, LR, EPOCH = 1000, 1e-3, 100

#: name -> example config for the schedules that are not optcore classes
EXTRA_EXAMPLES: dict[str, dict[str, Any]] = {"reduce_lr_on_plateau": {"patience": 20, "factor": 0.5, "min_lr": 1e-5}}


def loss_curve(n: int, seed: int = 0) -> list[float]:
    """A noisy loss: fast progress, a plateau, slow progress, a plateau."""
    rng = random.Random(seed)
    out, value = [], 3.0
    for t in range(n):
        drift = -0.004 if t < 300 else (0.0 if t < 500 else (-0.001 if t < 750 else 0.0))
        value += drift + rng.gauss(0.0, 0.002)
        out.append(value)
    return out


def curve(name: str, example: dict[str, Any]) -> list[float]:
    param = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.SGD([param], lr=LR)
    spec = optcore.resolve_scheduler(name)
    scheduler = optcore.build_scheduler({"type": name, **example}, optimizer, num_training_steps=STEPS)
    losses = loss_curve(STEPS)
    lrs = [optimizer.param_groups[0]["lr"]]
    for t in range(STEPS):
        optimizer.step()
        if spec.needs_metric:
            scheduler.step(losses[t])
        else:
            scheduler.step()
        if hasattr(scheduler, "step_begin_epoch") and (t + 1) % EPOCH == 0:
            scheduler.step_begin_epoch()
        lrs.append(optimizer.param_groups[0]["lr"])
    return lrs


def plot(name: str, example: dict[str, Any], lrs: list[float], path: Path) -> None:
    fig, ax = plt.subplots(figsize=(6.0, 2.4), dpi=100)
    ax.plot(range(len(lrs)), [lr / LR for lr in lrs], color="#1f77b4", linewidth=1.6)
    ax.set_xlabel("step")
    ax.set_ylabel(f"lr / {LR:g}")
    ax.set_xlim(0, len(lrs) - 1)
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    shown = ", ".join(f"{k}={v}" for k, v in example.items())
    ax.set_title(f"{name}({shown})" if shown else name, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, metadata={"Software": None})
    plt.close(fig)


# ------------------------------------------------------------------ markdown
def _type(prop: dict[str, Any]) -> str:
    if "anyOf" in prop:
        return " \\| ".join(_type(p) for p in prop["anyOf"])
    if "enum" in prop:
        return " \\| ".join(f'`"{v}"`' for v in prop["enum"])
    kind = prop.get("type")
    names = {"integer": "int", "number": "float", "boolean": "bool", "string": "str", "null": "None", "object": "dict"}
    if kind == "array":
        if "prefixItems" in prop:
            text = f"({', '.join(_type(p) for p in prop['prefixItems'])})"
        else:
            text = f"list[{_type(prop.get('items', {}))}]"
    else:
        text = names.get(kind, "any") if kind else "any"
    bounds = [
        (("ge", "minimum"), ">="),
        (("gt", "exclusiveMinimum"), ">"),
        (("le", "maximum"), "<="),
        (("lt", "exclusiveMaximum"), "<"),
    ]
    for keys, sym in bounds:
        for key in keys:
            if key in prop:
                text += f" {sym} {prop[key]}"
    return text


def fields_table(schema: Any) -> str:
    props = schema.model_json_schema().get("properties", {})
    if not props:
        return "No hyper-parameters.\n"
    rows = ["| field | type | default | meaning |", "|---|---|---|---|"]
    for name, info in schema.model_fields.items():
        prop = props.get(name, {})
        default = "required" if info.is_required() else f"`{info.default!r}`"
        rows.append(f"| `{name}` | {_type(prop)} | {default} | {(info.description or '').replace('|', '/')} |")
    return "\n".join(rows) + "\n"


def section(name: str, example: dict[str, Any]) -> str:
    spec = optcore.resolve_scheduler(name)
    target = spec.target
    doc = inspect.getdoc(target) or ""
    if spec.source == "torch":  # the torch docstring is long; its first paragraph is enough
        doc = (
            doc.split("\n\n", 1)[0]
            + f"\n\n`{name}` is `torch.optim.lr_scheduler.{target.__name__}` (as in transformers)."
        )
    flags = []
    if spec.needs_total:
        flags.append(f"needs the run length (`{spec.total_field}`, or `num_training_steps=`)")
    if spec.needs_metric:
        flags.append("stepped with a metric: `scheduler.step(metric)`")
    if hasattr(target, "step_begin_epoch"):
        flags.append("call `scheduler.step_begin_epoch()` at the start of each epoch")
    config = {"type": name, **example}
    doc = doc.replace("::\n", ":\n").replace("``", "`")  # reST literals -> markdown
    parts = [f"### `{name}`\n", doc + "\n"]
    if flags:
        parts.append("*" + "; ".join(flags) + ".*\n")
    parts.append(fields_table(spec.schema))
    parts.append(f"Plotted config (1000 steps, lr 1e-3): `{config}`\n")
    parts.append(f"![{name}](img/schedules/{name}.png)\n")
    return "\n".join(parts)


def schedules() -> list[tuple[str, dict[str, Any]]]:
    items = [(cls.name, dict(cls.example)) for cls in BUILTINS]
    hf_end = next(i for i, (n, _) in enumerate(items) if n == "greedy")
    items.insert(hf_end, ("reduce_lr_on_plateau", EXTRA_EXAMPLES["reduce_lr_on_plateau"]))
    return items


def summary_table(items: list[tuple[str, dict[str, Any]]]) -> str:
    rows = ["| name | from | what it does |", "|---|---|---|"]
    for name, _ in items:
        spec = optcore.resolve_scheduler(name)
        origin = "fairseq" if "(fairseq's" in spec.description else "transformers"
        if spec.source == "torch":
            what = f"torch's `{spec.name}`: lower the lr when the metric stops improving"
        else:  # the docstring's first sentence, without its "(transformers' ...)" credit
            what = re.sub(r"\s*\((transformers'|fairseq's)[^)]*\)", "", spec.description).rstrip(".")
        rows.append(f"| [`{name}`](#{name}) | {origin} | {what.replace('``', '`')} |")
    return "\n".join(rows) + "\n"


def generated() -> str:
    items = schedules()
    body = [BEGIN, "", "<!-- written by docs/gen_schedule_plots.py from the registry; do not edit by hand -->", ""]
    body.append(summary_table(items))
    for name, example in items:
        body.append(section(name, example))
    body.append(END)
    return "\n".join(body)


def render_page() -> str:
    text = PAGE.read_text()
    head, _, rest = text.partition(BEGIN)
    _, _, tail = rest.partition(END)
    return head + generated() + tail


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only check that docs/schedulers.md is up to date")
    args = parser.parse_args()
    page = render_page()
    if args.check:
        if page != PAGE.read_text():
            print("docs/schedulers.md is stale: run python docs/gen_schedule_plots.py", file=sys.stderr)
            return 1
        return 0
    IMG.mkdir(parents=True, exist_ok=True)
    for name, example in schedules():
        plot(name, example, curve(name, example), IMG / f"{name}.png")
    PAGE.write_text(page)
    print(f"wrote {len(schedules())} plots to {IMG.relative_to(DOCS.parent)} and the reference of {PAGE.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

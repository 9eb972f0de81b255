"""The ``optcore`` command: list, show, check, schema (and compare/train when installed).

Output is a rich table on a terminal and plain JSON with ``--json``; errors are
printed as the user-facing message (no traceback) with exit code 1.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

from ._errors import OptcoreError


def _console() -> Any:
    from rich.console import Console

    return Console(soft_wrap=False)


def _flags(spec: Any) -> dict[str, bool]:
    try:
        return spec.capabilities.as_dict()
    except OptcoreError:
        return {}


def cmd_list(args: argparse.Namespace) -> int:
    if args.schedulers:
        from .schedulers import list_schedulers

        specs = list_schedulers(all=args.all)
    else:
        from ._registry import list_optimizers

        specs = list_optimizers(all=args.all)
    rows = []
    for spec in specs:
        row = spec.describe()
        if not args.schedulers and args.flags:
            row["capabilities"] = _flags(spec)
        rows.append(row)
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    from rich.table import Table

    table = Table(title=f"optcore {'schedulers' if args.schedulers else 'optimizers'} ({len(rows)})")
    for col in ("name", "source", "provider", "select with", "shadows"):
        table.add_column(col)
    if not args.schedulers and args.flags:
        table.add_column("fp16-mem / scale / flat / groups")
    for row in rows:
        cells = [row["name"], row["source"], row["provider"], row["qualified"], ", ".join(row["shadowed"])]
        if "capabilities" in row:
            cells.append(" ".join("✓" if v else "·" for v in row["capabilities"].values()))
        table.add_row(*cells)
    _console().print(table)
    return 0


def _schema_rows(schema: Any) -> list[dict[str, Any]]:
    rows = []
    # Hyper-parameters first, implementation switches last.
    switches = ("maximize", "foreach", "differentiable", "fused", "capturable")
    ordered = sorted(schema.model_fields.items(), key=lambda item: item[0] in switches)
    for name, info in ordered:
        constraints = [str(m) for m in info.metadata if type(m).__name__ not in ("BeforeValidator",)]
        rows.append(
            {
                "field": name,
                "type": _type_name(info.annotation),
                "default": "required" if info.is_required() else repr(info.default),
                "constraints": ", ".join(constraints),
                "description": info.description or "",
            }
        )
    return rows


def _type_name(annotation: Any) -> str:
    text = getattr(annotation, "__name__", None) or str(annotation)
    return text.replace("typing.", "").replace("NoneType", "None")


def describe(name: str, scheduler: bool = False) -> dict[str, Any]:
    """Everything ``optcore show`` prints, as data (the docs generator uses it too).
    A name that is no optimizer is looked up as a scheduler."""
    if not scheduler:
        from ._errors import OptimizerNotFoundError, SchedulerNotFoundError
        from ._registry import resolve as _resolve

        try:
            _resolve(name)
        except OptimizerNotFoundError as exc:
            try:
                return describe(name, scheduler=True)
            except SchedulerNotFoundError:
                raise exc from None
    if scheduler:
        from .schedulers import resolve_scheduler

        spec = resolve_scheduler(name)
    else:
        from ._registry import resolve

        spec = resolve(name)
    out = spec.describe()
    out["description"] = spec.description
    out["fields"] = _schema_rows(spec.schema)
    if not scheduler:
        out["capabilities"] = _flags(spec)
        if spec.source == "torch" and "fused" in spec.schema.model_fields:
            out["implementation"] = (
                "fused kernel by default where the params' device and dtype support it (CPU and CUDA float "
                "tensors); foreach/for-loop when the config sets foreach or fused"
            )
        elif spec.source == "torch":
            out["implementation"] = "torch's default (foreach on accelerators, for-loop on CPU)"
    return out


def cmd_show(args: argparse.Namespace) -> int:
    info = describe(args.name, scheduler=args.scheduler)
    if args.json:
        print(json.dumps(info, indent=2, default=str))
        return 0
    from rich.table import Table

    console = _console()
    console.print(f"[bold]{info['name']}[/bold]  ({info['source']}, {info['provider']}; select with {info['qualified']!r})")
    if info.get("description"):
        console.print(info["description"])
    if info.get("shadowed"):
        console.print(f"Shadows: {', '.join(info['shadowed'])}")
    if info.get("capabilities"):
        console.print("Capabilities: " + ", ".join(f"{k}={v}" for k, v in info["capabilities"].items()))
    if info.get("implementation"):
        console.print(f"Implementation: {info['implementation']}")
    table = Table(title="hyper-parameters")
    for col in ("field", "type", "default", "constraints", "description"):
        table.add_column(col)
    for row in info["fields"]:
        table.add_row(*(str(row[c]) for c in ("field", "type", "default", "constraints", "description")))
    console.print(table)
    return 0


def check_config(data: Any) -> list[str]:
    """Validate a config (optimizer alone, or optimizer + lr_scheduler) without
    building anything; return the error messages (empty when valid)."""
    from ._config import WRAPPER_KEYS, optimizer_config, to_plain
    from ._registry import resolve
    from ._schema import parse_optim_args, validate_hparams

    errors: list[str] = []
    plain = to_plain(data)
    configs: list[tuple[str, Any]] = []
    total = plain.get("num_training_steps") if isinstance(plain, dict) else None
    if isinstance(plain, dict) and ("lr_scheduler" in plain or "scheduler" in plain):
        configs = [("optimizer", plain.get("optimizer")), ("lr_scheduler", plain.get("lr_scheduler", plain.get("scheduler")))]
    elif isinstance(plain, list) or (isinstance(plain, dict) and "configs" in plain):
        from .compare.lineup import entries_from_file  # an `optcore compare` file: a list of runs

        configs = []
        entries, options = entries_from_file(plain)
        total = options.get("num_training_steps", total)
        for entry in entries:
            configs.append(("optimizer", entry.get("optimizer", entry)))
            if entry.get("lr_scheduler") is not None:
                configs.append(("lr_scheduler", entry["lr_scheduler"]))
    else:
        configs = [("optimizer", plain)]
    for kind, cfg in configs:
        try:
            if kind == "lr_scheduler":
                from .schedulers import validate_scheduler_config

                validate_scheduler_config(cfg, total)
                continue
            cfg = optimizer_config(cfg)
            spec = resolve(cfg.pop("type"))
            for key in (*WRAPPER_KEYS, "param_groups", "no_decay"):
                cfg.pop(key, None)
            if spec.is_wrapper:
                inner = cfg.pop("optimizer", None)
                errors += check_config(inner) if inner is not None else ["wrapper config has no 'optimizer'"]
            args = cfg.pop("optim_args", None)
            if isinstance(args, str):
                cfg.update(parse_optim_args(args))
            validate_hparams(spec.schema, cfg, spec.name)
        except OptcoreError as exc:
            errors.append(str(exc))
    return errors


def cmd_check(args: argparse.Namespace) -> int:
    from ._config import load_config_file

    try:
        data = load_config_file(args.config)
        errors = check_config(data)
    except OptcoreError as exc:
        errors = [str(exc)]
    if errors:
        for e in errors:
            print(e, file=sys.stderr)
        return 1
    print(f"{args.config}: OK")
    return 0


def cmd_schema(args: argparse.Namespace) -> int:
    from ._registry import list_optimizers

    if args.all:
        out = {}
        from .schedulers import list_schedulers

        for spec in [*list_optimizers(), *list_schedulers()]:
            try:
                out[spec.name] = spec.schema.model_json_schema()
            except Exception as exc:  # noqa: BLE001 - one broken provider must not hide the rest
                print(f"skipping {spec.qualified}: {exc}", file=sys.stderr)
        print(json.dumps(out, indent=2, default=str))
    else:
        if not args.name:
            raise OptcoreError("optcore schema needs a NAME or --all.")
        print(json.dumps(describe_schema(args.name), indent=2, default=str))
    return 0


def describe_schema(name: str) -> dict[str, Any]:
    from ._errors import OptimizerNotFoundError
    from ._registry import resolve

    try:
        return resolve(name).schema.model_json_schema()
    except OptimizerNotFoundError:
        from .schedulers import resolve_scheduler

        return resolve_scheduler(name).schema.model_json_schema()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="optcore", description="Pick, configure and extend PyTorch optimizers.")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("list", help="list every optimizer (or scheduler) name and where it comes from")
    p.add_argument("--all", action="store_true", help="also list shadowed providers")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--schedulers", action="store_true", help="list LR schedulers instead")
    p.add_argument("--no-flags", dest="flags", action="store_false", help="skip capability flags (faster: no imports)")
    p.set_defaults(func=cmd_list)

    p = sub.add_parser("show", help="schema, defaults, capabilities and origin of one name")
    p.add_argument("name")
    p.add_argument("--json", action="store_true")
    p.add_argument("--scheduler", action="store_true", help="NAME is a scheduler")
    p.set_defaults(func=cmd_show)

    p = sub.add_parser("check", help="validate a JSON/YAML/TOML config without building (exit 1 on errors)")
    p.add_argument("config")
    p.set_defaults(func=cmd_check)

    p = sub.add_parser("schema", help="JSON Schema of an optimizer's config (for editor completion)")
    p.add_argument("name", nargs="?")
    p.add_argument("--all", action="store_true")
    p.set_defaults(func=cmd_schema)

    try:
        from .compare import commands as _compare  # the main job; optional module
    except ImportError:
        pass
    else:
        _compare.add_commands(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except OptcoreError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

"""``optcore show NAME`` (one name: its schema, flags, origin, other providers)
and ``optcore show --config FILE`` (a config's build plan)."""

from __future__ import annotations

import argparse
import inspect
import json
import sys
import types
import typing
from collections.abc import Mapping
from typing import Any

from .._errors import OptcoreError, OptimizerNotFoundError, SchedulerNotFoundError
from .._torch_facts import PARAM_RULES
from ._output import console, table

#: Implementation switches are listed after the hyper-parameters.
_SWITCHES = ("maximize", "foreach", "differentiable", "fused", "capturable")


def describe(name: str, scheduler: bool = False) -> dict[str, Any]:
    """Everything ``optcore show`` prints, as data (the docs generator uses it too).
    A name that is no optimizer is looked up as a scheduler."""
    if scheduler:
        from ..schedulers import resolve_scheduler  # pydantic and torch's schedulers: only when asked

        spec = resolve_scheduler(name)
    else:
        from .._registry import resolve

        try:
            spec = resolve(name)
        except OptimizerNotFoundError as exc:
            try:
                return describe(name, scheduler=True)
            except SchedulerNotFoundError:
                raise exc from None
    out = spec.describe(load=True) if scheduler else spec.describe()
    out["description"] = description(spec.target)
    out["providers"] = [{"provider": s.provider, "source": s.source, "type": s.qualified} for s in spec.shadowed]
    out["fields"] = _schema_rows(spec.schema)
    if not scheduler:
        try:
            out["capabilities"] = spec.capabilities.as_dict()
        except OptcoreError:
            out["capabilities"] = {}
        rules = PARAM_RULES.get(spec.name, ()) if spec.source == "torch" else ()
        out["parameters"] = [text for _, _, text in rules]  # what it takes of each parameter
        if spec.source == "torch" and "fused" in spec.schema.model_fields:
            out["implementation"] = (
                "fused kernel by default where the params' device and dtype support it (CPU and CUDA float "
                "tensors); foreach/for-loop when the config sets foreach or fused"
            )
        elif spec.source == "torch":
            out["implementation"] = "torch's default (foreach on accelerators, for-loop on CPU)"
    return out


def description(target: Any) -> str:
    """The first paragraph of the target's *own* docstring, else its module's.
    An inherited docstring ("Base class for all optimizers.") describes
    something else, so it is never used."""
    own = vars(target).get("__doc__") if isinstance(target, type) else getattr(target, "__doc__", None)
    if not own:
        own = getattr(sys.modules.get(getattr(target, "__module__", "") or ""), "__doc__", None)
    doc = inspect.cleandoc(own) if own else ""
    return doc.split("\n\n", 1)[0].replace("\n", " ").strip()


def _schema_rows(schema: Any) -> list[dict[str, Any]]:
    rows = []
    ordered = sorted(schema.model_fields.items(), key=lambda item: item[0] in _SWITCHES)
    for name, info in ordered:
        constraints = [c for c in map(_constraint, info.metadata) if c] + _member_constraints(info.annotation)
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


#: annotated_types' bounds, as a reader writes them
_BOUNDS = {"gt": ">", "ge": ">=", "lt": "<", "le": "<=", "multiple_of": "multiple of", "min_length": "length >=",
           "max_length": "length <="}


def _constraint(meta: Any) -> str:
    """A field's metadata as a reader's constraint (``>= 0.0``, ``finite``);
    validators and pydantic's strictness switches say nothing to a user."""
    bounds = [f"{op} {getattr(meta, attr)}" for attr, op in _BOUNDS.items() if getattr(meta, attr, None) is not None]
    if getattr(meta, "allow_inf_nan", None) is False:
        bounds.append("finite")
    return ", ".join(bounds)


def _member_constraints(annotation: Any) -> list[str]:
    """A tuple's or list's constraints on its members (``betas``: each ``>= 0.0, < 1.0``);
    of a union (or an optional tuple), those all its alternatives share."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        found = {tuple(_member_constraints(a)) for a in typing.get_args(annotation) if a is not type(None)}
        return list(found.pop()) if len(found) == 1 else []
    if typing.get_origin(annotation) not in (tuple, list):
        return []
    parts = []
    for member in (a for a in typing.get_args(annotation) if a is not Ellipsis):
        union = typing.get_origin(member) in (typing.Union, types.UnionType)
        extras = [x for m in (typing.get_args(member) if union else [member])
                  if typing.get_origin(m) is typing.Annotated for x in typing.get_args(m)[1:]]
        metadata = [m for extra in extras for m in getattr(extra, "metadata", [extra])]
        parts.append(", ".join(c for c in map(_constraint, metadata) if c))
    if not any(parts):
        return []
    return [f"each {parts[0]}"] if len(set(parts)) == 1 else [f"[{i}] {p or 'any'}" for i, p in enumerate(parts)]


def _type_name(annotation: Any) -> str:
    """``float | None``, ``Literal['auto', 'c']``: a bare ``__name__`` would say
    ``Optional`` or ``Literal`` and hide what is allowed."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Annotated:
        return _type_name(args[0])
    if origin in (typing.Union, types.UnionType):
        return " | ".join(_type_name(a) for a in args)
    if origin is typing.Literal:
        return f"Literal[{', '.join(map(repr, args))}]"
    if args and origin is not None:
        return f"{getattr(origin, '__name__', origin)}[{', '.join(_type_name(a) for a in args)}]"
    text = getattr(annotation, "__name__", None) or str(annotation)
    return text.replace("typing.", "").replace("NoneType", "None")


def cmd_show(args: argparse.Namespace) -> int:
    if args.config:
        return _show_plan(args)
    if not args.name:
        raise OptcoreError("optcore show needs a NAME (e.g. `optcore show AdamW`) or --config FILE.")
    info = describe(args.name, scheduler=args.scheduler)
    if args.json:
        print(json.dumps(info, indent=2, default=str))
        return 0
    out = console()
    out.print(f"[bold]{info['name']}[/bold]  ({info['source']}, {info['provider']}; select with {info['qualified']!r})")
    if info.get("description"):
        out.print(info["description"], highlight=False)
    for other in info["providers"]:
        out.print(f"Also provided by {other['provider']} ({other['source']}): type={other['type']!r}", highlight=False)
    if info.get("capabilities"):
        out.print("Capabilities: " + ", ".join(f"{k}={v}" for k, v in info["capabilities"].items()))
    if info.get("parameters"):
        out.print(f"Parameters: {'; '.join(info['parameters'])}", highlight=False)
    if info.get("implementation"):
        out.print(f"Implementation: {info['implementation']}")
    columns = ("field", "type", "default", "constraints", "description")
    fields = table("hyper-parameters", columns)
    for row in info["fields"]:
        fields.add_row(*(str(row[c]) for c in columns))
    out.print(fields)
    return 0


def _show_plan(args: argparse.Namespace) -> int:
    """What a build of a config file does: the optimizer's plan (resolved type,
    validated hyper-parameters, regex and automatic param groups, the wrapper
    chain) and the schedule; every run of an ``optcore compare`` file."""
    from .._plan import plan
    from ..files import load_config_file
    from ._check import configs_of, scheduler_plan

    configs, total = configs_of(load_config_file(args.config))
    if getattr(args, "model", None):
        return _show_routing(plan, [cfg for _, kind, cfg in configs if kind == "optimizer"], args)
    runs: list[dict[str, Any]] = []
    for label, kind, cfg in configs:
        if kind == "optimizer":
            runs.append({**({"name": label} if label else {}), **_plan_info(plan(cfg))})
        else:
            runs[-1]["lr_scheduler"] = _scheduler_info(*scheduler_plan(cfg, total))
    if args.json:
        print(json.dumps(runs if len(runs) > 1 or "name" in runs[0] else runs[0], indent=2, default=str))
        return 0
    out = console()
    for run in runs:
        if "name" in run:
            out.print(f"[bold]run {run['name']}[/bold]", highlight=False)
        _print_level(out, run, "  " if "name" in run else "")
        sched = run.get("lr_scheduler")
        if sched is not None:
            pad = "  " if "name" in run else ""
            out.print(f"{pad}lr_scheduler: [bold]{sched['type']}[/bold] ({sched['source']}, {sched['provider']})",
                      highlight=False)
            for key, value in sched["arguments"].items():
                out.print(f"{pad}  {key} = {value!r}", highlight=False)
            if sched.get("note"):
                out.print(f"{pad}  note: {sched['note']}", highlight=False)
    return 0


def _print_level(out: Any, level: dict[str, Any] | None, pad: str) -> None:
    while level is not None:
        out.print(f"{pad}[bold]{level['type']}[/bold] ({level['source']}, {level['provider']})", highlight=False)
        for key, value in level["hparams"].items():
            mark = "" if key in level["explicit"] else "  [dim](default)[/dim]"
            out.print(f"{pad}  {key} = {value!r}{mark}", highlight=False)
        if level.get("no_decay_group"):
            out.print(f"{pad}  no-decay group: {level['no_decay_group']}", highlight=False)
        for i, group in enumerate(level.get("param_groups", [])):
            out.print(f"{pad}  param_groups[{i}]: {group}", highlight=False)
        if level.get("step_in_backward"):
            out.print(f"{pad}  step_in_backward: each parameter steps as its gradient is ready", highlight=False)
        for part in level.get("parts", [])[1:]:
            given = ", ".join(f"{k}={v!r}" for k, v in part["hparams"].items() if k in part["explicit"])
            out.print(f"{pad}  and {part['type']} ({given or 'defaults'}) for the parameters routed to it", highlight=False)
        level = level.get("wraps")
        if level is not None:
            out.print(f"{pad}  wraps:")
        pad += "    "


def routing_rows(plan_: Any, model: Any) -> list[dict[str, Any]]:
    """One row per parameter: name, shape, the optimizer that steps it, effective lr and
    weight decay (a composite's routing table; for one optimizer, its groups')."""
    if plan_.routing:
        return [dict(row) for row in plan_.routing]
    while plan_.inner is not None:
        plan_ = plan_.inner
    names = {id(p): n for n, p in model.named_parameters()}
    return [
        {"name": names.get(id(p), ""), "shape": tuple(p.shape), "optimizer": plan_.spec.name, "why": "main",
         "lr": group.get("lr", plan_.hparams.get("lr")), "weight_decay": group.get("weight_decay", plan_.hparams.get("weight_decay"))}
        for group in plan_.groups for p in group["params"]
    ]


def _show_routing(plan: Any, optimizers: list[Any], args: argparse.Namespace) -> int:
    """``optcore show --config FILE --model MOD:FN``: which optimizer steps which parameter."""
    from ..compare.memory import factory_from_spec

    factory = factory_from_spec(args.model)
    tables = []
    for cfg in optimizers:
        model = factory()
        tables.append(routing_rows(plan(cfg, model), model))
    if args.json:
        print(json.dumps(tables[0] if len(tables) == 1 else tables, indent=2, default=str))
        return 0
    out = console()
    for rows in tables:
        grid = table(f"routing of {args.config} over {args.model}", ("parameter", "shape", "optimizer", "lr", "weight_decay", "why"))
        for row in rows:
            grid.add_row(row["name"], str(tuple(row["shape"])), row["optimizer"], f"{_jsonable(row['lr'])}",
                         f"{_jsonable(row['weight_decay'])}", row["why"])
        out.print(grid)
    return 0


def _plan_info(plan_: Any) -> dict[str, Any]:
    """A plan without parameters as JSON-ready data (the plan is a frozen record;
    rendering it is the CLI's business)."""
    out: dict[str, Any] = {
        "type": plan_.spec.qualified,
        "source": plan_.spec.source,
        "provider": plan_.spec.provider,
        "hparams": {k: _jsonable(v) for k, v in plan_.hparams.items()},
        "explicit": sorted(plan_.explicit),
    }
    if plan_.inner is None:
        no_decay = _no_decay_group(plan_)
        if no_decay:
            out["no_decay_group"] = no_decay
    if plan_.group_specs:
        out["param_groups"] = [_jsonable(g) for g in plan_.group_specs]
    if not plan_.no_decay:
        out["no_decay"] = False
    if plan_.inner is not None:
        out["wraps"] = _plan_info(plan_.inner)
    if plan_.parts:
        out["parts"] = [_plan_info(part) for part in plan_.parts]
    if plan_.step_in_backward:
        out["step_in_backward"] = True
    return out


def _no_decay_group(plan_: Any) -> str | None:
    """The group the build adds on its own over a model (API.md), in words."""
    if "weight_decay" not in plan_.spec.schema.model_fields:
        return None
    decay = plan_.hparams.get("weight_decay")
    if not plan_.no_decay:
        return f"none ('no_decay': false): biases and normalisation weights keep weight_decay={decay!r}"
    if not decay:
        return None
    return ("weight_decay=0.0 for biases and normalisation weights, when built over an nn.Module "
            "('no_decay': false turns it off)")


def _scheduler_info(spec: Any, kwargs: dict[str, Any], note: str | None) -> dict[str, Any]:
    arguments = {k: _jsonable(v) for k, v in kwargs.items()}
    if note and spec.total_field in arguments:
        arguments[spec.total_field] = "given at build: optcore.build(..., num_training_steps=N)"
    return {"type": spec.qualified, "source": spec.source, "provider": spec.provider, "arguments": arguments,
            **({"note": note} if note else {})}


def _jsonable(value: Any) -> Any:
    import torch

    if isinstance(value, torch.Tensor):
        return value.item() if value.numel() == 1 else f"<tensor {tuple(value.shape)}>"
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return repr(value)

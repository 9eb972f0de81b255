"""``optcore schema``: JSON Schema of optcore's config *files*.

A hyper-parameter schema alone would flag ``type:`` in every real file, so the
exported schemas describe what a file holds: ``type`` (the spellings that
select this optimizer), the hyper-parameters, the build keys every optimizer
config takes (``param_groups``, ``optim_args``, ``no_decay``, ``layer_decay``) and the keys
installed plugins add (hook ``optcore_config_keys``: ``precision``,
``loss_scaler``, ...). ``--all`` is one schema for every file optcore reads:
an optimizer config, a run file (``{"optimizer", "lr_scheduler",
"num_training_steps", "seed"}``) or an ``optcore compare`` file.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable
from typing import Any

from .._errors import OptcoreError
from .._names import normalize

DIALECT = "https://json-schema.org/draft/2020-12/schema"

#: The keys of an optimizer config that the build reads besides the hyper-parameters.
BUILD_KEYS: dict[str, Any] = {
    "param_groups": {
        "description": "extra param groups, selected by a regex over parameter names, with their own hyper-parameters",
        "type": "array",
        "items": {
            "type": "object",
            "properties": {
                "params": {"type": "string", "description": "regex over parameter names"},
                "name": {"type": "string"},
                "lr_scale": {"type": "number", "minimum": 0},
            },
            "required": ["params"],
        },
    },
    "optim_args": {
        "description": "more hyper-parameters, as a 'key=value, ...' string (Hugging Face style) or a mapping",
        "type": ["string", "object"],
    },
    "no_decay": {
        "description": "put biases and normalisation weights in a weight_decay=0 group (default true)",
        "type": "boolean",
    },
    "layer_decay": {
        "description": "layer-wise lr decay (timm's): layer i of 0..L trains at lr * layer_decay ** (L - i)",
        "type": ["number", "null"],
        "exclusiveMinimum": 0,
        "maximum": 1,
    },
}


def _plugin_keys() -> tuple[dict[str, Any], dict[str, Any]]:
    """(the properties installed plugins add to an optimizer config, their ``$defs``)."""
    from .._hooks import get_plugin_manager

    keys: dict[str, Any] = {}
    defs: dict[str, Any] = {}
    for i, result in enumerate(get_plugin_manager().hook.optcore_config_keys()):
        result = dict(result or {})
        own = result.pop("$defs", {})
        renames = {f"#/$defs/{k}": f"#/$defs/plugin{i}__{k}" for k in own}
        defs.update({f"plugin{i}__{k}": _rename_refs(v, renames) for k, v in own.items()})
        keys.update(_rename_refs(result.get("properties", {}), renames))
    return keys, defs


def _spellings(spec: Any, winners: set[str]) -> list[str]:
    """``type`` values that select ``spec``: its qualified name always, the
    plain name (as written and lower-case) when the plain name resolves to it."""
    names = [spec.qualified]
    if spec.qualified in winners:
        names += [spec.name, spec.name.lower()]
    return sorted(set(names))


def optimizer_file_schema(
    spec: Any,
    *,
    winners: set[str] | None = None,
    plugin_keys: tuple[dict[str, Any], dict[str, Any]] | None = None,
    defs: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The schema of one optimizer's config as written in a file.

    With ``defs``, the schema's own ``$defs`` are moved there (prefixed with
    the optimizer's name) so that many schemas can share one document.
    """
    if winners is None:
        winners = _winner_of(spec.name)
    base = spec.schema.model_json_schema()
    own_defs = base.pop("$defs", {})
    plugin_props, plugin_defs = plugin_keys if plugin_keys is not None else _plugin_keys()
    prefix = normalize(spec.qualified).replace(":", "_")
    if defs is not None:
        renames = {f"#/$defs/{k}": f"#/$defs/{prefix}__{k}" for k in own_defs}
        for key, value in own_defs.items():
            defs[f"{prefix}__{key}"] = _rename_refs(value, renames)
        base = _rename_refs(base, renames)
    properties: dict[str, Any] = {
        "type": {"description": f"selects {spec.qualified}", "enum": _spellings(spec, winners)},
        **base.get("properties", {}),
    }
    if spec.is_wrapper:
        properties["optimizer"] = {"description": "the optimizer this one wraps", "type": ["object", "string"]}
    else:
        properties.update({k: v for k, v in BUILD_KEYS.items() if k not in properties})
        for key, schema in plugin_props.items():
            properties.setdefault(key, schema)
        if defs is not None:
            defs.update(plugin_defs)
        else:
            own_defs = {**own_defs, **plugin_defs}
    out: dict[str, Any] = {
        "title": f"{spec.qualified} config",
        "type": "object",
        "properties": properties,
        "required": ["type", *base.get("required", []), *(["optimizer"] if spec.is_wrapper else [])],
        "additionalProperties": False,
    }
    if defs is None:
        out = {"$schema": DIALECT, **out}
        if own_defs:
            out["$defs"] = own_defs
    return out


def config_file_schema(specs: Iterable[Any] | None = None, schedulers: Iterable[Any] | None = None) -> dict[str, Any]:
    """One schema for every config file optcore reads (see the module docstring)."""
    from .._registry import list_optimizers
    from ..schedulers import list_schedulers

    all_specs = list(specs) if specs is not None else list_optimizers(all=True)
    winners = {s.qualified for s in list_optimizers()}
    plugin_keys = _plugin_keys()
    defs: dict[str, Any] = {}
    optimizers = []
    for spec in all_specs:
        try:
            optimizers.append(optimizer_file_schema(spec, winners=winners, plugin_keys=plugin_keys, defs=defs))
        except Exception as exc:  # noqa: BLE001 - one broken provider must not hide the rest
            print(f"skipping {spec.qualified}: {exc}", file=sys.stderr)
    scheduler_schemas = []
    for spec in schedulers if schedulers is not None else list_schedulers():
        try:
            base = spec.schema.model_json_schema()
        except Exception as exc:  # noqa: BLE001
            print(f"skipping scheduler {spec.qualified}: {exc}", file=sys.stderr)
            continue
        own = base.pop("$defs", {})
        prefix = "sched_" + normalize(spec.qualified).replace(":", "_")
        renames = {f"#/$defs/{k}": f"#/$defs/{prefix}__{k}" for k in own}
        defs.update({f"{prefix}__{k}": _rename_refs(v, renames) for k, v in own.items()})
        base = _rename_refs(base, renames)
        scheduler_schemas.append(
            {
                "type": "object",
                "properties": {"type": {"enum": sorted({spec.name, spec.name.lower(), spec.qualified})}, **base.get("properties", {})},
                "required": ["type"],
            }
        )
    defs["optimizer_config"] = {"anyOf": [*optimizers, {"type": "string"}]}
    defs["scheduler_config"] = {"anyOf": [*scheduler_schemas, {"type": "string"}]}
    defs["run_file"] = {
        "type": "object",
        "properties": {
            "optimizer": {"$ref": "#/$defs/optimizer_config"},
            "lr_scheduler": {"$ref": "#/$defs/scheduler_config"},
            "num_training_steps": {"type": "integer", "minimum": 1},
            "seed": {"type": "integer"},
        },
        "required": ["optimizer"],
        "additionalProperties": False,
    }
    defs["search_space"] = _search_space_schema()
    entry = {
        "anyOf": [
            {
                "type": "object",
                "properties": {
                    "name": {"type": "string"},
                    "optimizer": {"$ref": "#/$defs/optimizer_config"},
                    "lr_scheduler": {"$ref": "#/$defs/scheduler_config"},
                    "search_space": {"$ref": "#/$defs/search_space"},
                },
                "required": ["optimizer"],
                "additionalProperties": False,
            },
            {"$ref": "#/$defs/optimizer_config"},
        ]
    }
    defs["compare_file"] = {
        "anyOf": [
            {"type": "array", "items": entry, "minItems": 1},
            {
                "type": "object",
                "properties": {
                    "configs": {"type": "array", "items": entry, "minItems": 1},
                    "num_training_steps": {"type": "integer", "minimum": 1},
                    "seed": {"type": "integer"},
                },
                "required": ["configs"],
                "additionalProperties": False,
            },
        ]
    }
    return {
        "$schema": DIALECT,
        "title": "optcore config file",
        "anyOf": [{"$ref": "#/$defs/optimizer_config"}, {"$ref": "#/$defs/run_file"}, {"$ref": "#/$defs/compare_file"}],
        "$defs": defs,
    }


def _winner_of(name: str) -> set[str]:
    import warnings

    from .._registry import resolve

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return {resolve(name).qualified}
        except OptcoreError:
            return set()


def _rename_refs(node: Any, renames: dict[str, str]) -> Any:
    if isinstance(node, dict):
        return {k: (renames.get(v, v) if k == "$ref" and isinstance(v, str) else _rename_refs(v, renames)) for k, v in node.items()}
    if isinstance(node, list):
        return [_rename_refs(v, renames) for v in node]
    return node


def cmd_schema(args: argparse.Namespace) -> int:
    if args.all:
        print(json.dumps(config_file_schema(), indent=2, default=str))
        return 0
    if not args.name:
        raise OptcoreError("optcore schema needs a NAME (e.g. `optcore schema AdamW`) or --all.")
    from .._registry import resolve

    try:
        spec = resolve(args.name)
    except OptcoreError:
        from ..schedulers import resolve_scheduler

        print(json.dumps(resolve_scheduler(args.name).schema.model_json_schema(), indent=2, default=str))
        return 0
    print(json.dumps(optimizer_file_schema(spec), indent=2, default=str))
    return 0


def _search_space_schema() -> dict[str, Any]:
    """A compare entry's ``search_space`` (what ``optcore.compare.lineup.parse_space``
    reads): each name a range ``[low, high]``, ``[low, high, "log"|"linear"]`` or
    ``{low, high, log}``."""
    from ..compare.lineup import SPACE_DIMS

    number = {"type": "number"}
    dim = {
        "anyOf": [
            {"type": "array", "prefixItems": [number, number], "minItems": 2, "maxItems": 2},
            {"type": "array", "prefixItems": [number, number, {"enum": ["log", "linear"]}], "minItems": 3,
             "maxItems": 3},
            {"type": "object", "properties": {"low": number, "high": number, "log": {"type": "boolean"}},
             "required": ["low", "high"], "additionalProperties": False},
        ]
    }  # fmt: skip
    return {
        "type": "object",
        "description": "the ranges --trials draws this config's points from (docs/choosing.md)",
        "properties": {name: {**dim, "description": what} for name, what in SPACE_DIMS.items()},
        "additionalProperties": False,
    }

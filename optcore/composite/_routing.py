"""Which optimizer of a composite config steps which parameter.

Rules, strongest first: a ``param_groups`` entry with its own ``"optimizer"``
claims what its regex matches; the main type takes what it can and should
take; the ``fallback`` takes the rest. For an optimizer that orthogonalises
whole matrices (Muon) "can" is "is 2-D" (torch's Muon refuses anything else)
and "should" leaves out embeddings and the output head, as Muon's authors, timm
(``simple_params_list`` and its suitability rule) and DeepSpeed's
``MuonWithAuxAdam`` recipes do. A parameter no rule can place, or placed
where its optimizer cannot take it, is a :class:`ConfigError` listing it.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

import torch
from torch import Tensor, nn

from .._config import to_plain
from .._errors import ConfigError
from .._group_rules import check_config
from .._params import build_param_groups
from .._values import as_flag, short_repr
from ..placement import ShardedMuon, is_dtensor, layout_problem

#: Top-level module names that are a model's output head (HF ``lm_head``, timm ``head``/``classifier``).
HEAD_NAMES = frozenset({"lm_head", "head", "classifier", "fc_out", "output_layer", "output_projection", "logits", "score"})
_EMBEDDING_NAME = re.compile(r"(^|[._])(embed\w*|wte|wpe|word_embeddings|tok_embeddings)($|[._])")
#: Keys of a fallback's or group optimizer's config that belong to the composite, not to it.
_PARAM_KEYS = ("param_groups", "no_decay", "layer_decay", "fallback", "step_in_backward")


def matrix_only(target: Any) -> bool:
    """Whether ``target`` orthogonalises each whole 2-D update (torch's Muon and its
    subclasses, or a class declaring ``optcore_matrix_only = True``)."""
    cls = getattr(target, "adapted_from", target)
    muon = getattr(torch.optim, "Muon", None)
    if getattr(cls, "optcore_matrix_only", False):
        return True
    return isinstance(cls, type) and muon is not None and issubclass(cls, muon)


def routed_groups(group_specs: list[dict[str, Any]]) -> bool:
    """Whether a config's ``param_groups`` give any group its own optimizer."""
    return any(isinstance(g, Mapping) and "optimizer" in g for g in group_specs)


def part_links(links: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The one config of a fallback or group optimizer: no wrapper, no parameter keys."""
    if len(links) > 1:
        raise ConfigError(
            f"A fallback or param-group optimizer is one optimizer; {links[0]['type']} wraps another. Put precision "
            "wrappers around the whole composite config instead.",
            problems=[("fallback", "a wrapper")],
        )
    stray = [k for k in _PARAM_KEYS if k in links[0]]
    if stray:
        raise ConfigError(
            f"{stray} belong to the whole composite config, not to a fallback or param-group optimizer: move them "
            "beside the main 'type'.",
            problems=[(k, "inside a part's config") for k in stray],
        )
    return links


def plan_composite(plan_: Any, fallback: Any, params_or_model: Any, *, part: Callable[[Any], Any], finish: Callable[..., Any]) -> Any:
    """``plan_`` (the main type's) as a composite: ``parts``, one plan per optimizer
    (main first, then the groups' own, then the fallback), each over its groups;
    and with parameters, ``routing``: one row per parameter."""
    if part is None:
        raise ConfigError("A composite config ('fallback', or a param group's 'optimizer') cannot be nested inside another.")
    main_label = plan_.spec.name
    labels: dict[Any, tuple[str, Any]] = {}  # a part's config (hashable) -> (label, plan)

    def label_of(config: Any, where: str) -> str:
        plain = to_plain(config)
        if not isinstance(plain, (Mapping, str)):
            raise ConfigError(
                f"{where} must be an optimizer config such as {{'type': 'AdamW', 'lr': 3e-4}}, got {short_repr(config)}.",
                problems=[(where, "not an optimizer config")],
            )
        key = _hashable(plain)
        if key not in labels:
            planned = part(plain)
            taken = {label for label, _ in labels.values()} | {main_label}
            label = next(n for n in (planned.spec.name, *(f"{planned.spec.name}-{k}" for k in range(2, 99))) if n not in taken)
            labels[key] = (label, planned)
        return labels[key][0]

    group_specs = [dict(g) for g in plan_.group_specs]
    for i, g in enumerate(group_specs):
        if "optimizer" in g:
            g["optimizer"] = label_of(g["optimizer"], f"param_groups[{i}].optimizer")
    if fallback is not None:
        fallback = _shared_lr(plan_, to_plain(fallback))
    fallback_label = label_of(fallback, "fallback") if fallback is not None else None
    main = replace(plan_, group_specs=())
    if fallback_label is not None and not matrix_only(plan_.spec.target):
        raise ConfigError(
            f"'fallback' takes the parameters {main_label} cannot or should not take, and {main_label} takes every "
            "parameter, so the fallback would step none. Drop it, or route parameters with a param group's "
            "'optimizer' (e.g. {'params': '^head\\\\.', 'optimizer': {'type': 'AdamW'}}).",
            problems=[("fallback", f"{main_label} takes every parameter")],
        )
    parts = {main_label: main, **{label: planned for label, planned in labels.values()}}
    if params_or_model is None:
        stripped = [{k: v for k, v in g.items() if k != "optimizer"} for g in plan_.group_specs]
        check_config(stripped)
        return replace(plan_, parts=tuple(parts.values()))
    return _route(plan_, parts, fallback_label, group_specs, params_or_model, finish)


def _route(plan_: Any, parts: dict[str, Any], fallback: str | None, group_specs: list[dict[str, Any]],
           params_or_model: Any, finish: Callable[..., Any]) -> Any:
    main_label = plan_.spec.name
    model = params_or_model if isinstance(params_or_model, nn.Module) else None
    policies: list[Mapping[str, Any]] = []
    if model is not None:
        results = plan_.hooks.optcore_param_group_policies(model=model, config={**plan_.hparams, "type": main_label})
        policies = [policy for result in results if result for policy in result]
    decays = [p.hparams.get("weight_decay") for p in parts.values() if "weight_decay" in p.spec.schema.model_fields]
    groups = build_param_groups(
        params_or_model, group_specs, weight_decay=next((w for w in decays if w), None), no_decay=plan_.no_decay,
        policies=policies, layer_decay=plan_.layer_decay,
    )
    names = _names(params_or_model)
    avoid = _avoid(model, names)
    per_part: dict[str, list[dict[str, Any]]] = {label: [] for label in parts}
    reasons: dict[int, str] = {}
    unplaced: list[str] = []
    cannot: list[str] = []
    for group in groups:
        claimed = group.pop("optimizer", None)
        if claimed is not None and not isinstance(claimed, str):  # explicit param-group dicts carry the config
            claimed = _explicit_label(claimed, parts, plan_)
        split: dict[str, list[Tensor]] = {}
        for p in group["params"]:
            name = names.get(id(p), f"<unnamed {tuple(p.shape)}>")
            if claimed is not None:
                label, reasons[id(p)] = claimed, "param group"
                if matrix_only(parts[label].spec.target) and p.ndim != 2:
                    cannot.append(f"{name} {tuple(p.shape)} -> {label}")
            else:
                why_not = _why_not_main(plan_.spec.target, p, avoid.get(id(p)))
                if why_not is None:
                    label, reasons[id(p)] = main_label, "2-D hidden matrix" if matrix_only(plan_.spec.target) else "main"
                elif fallback is not None:
                    label, reasons[id(p)] = fallback, why_not
                else:
                    unplaced.append(f"{name} {tuple(p.shape)} ({why_not})")
                    continue
            split.setdefault(label, []).append(p)
        for label, tensors in split.items():
            entry = {**group, "params": tensors, "optimizer": label}
            if "param_names" in group:  # torch's named groups: the names of this part's tensors
                entry["param_names"] = [names.get(id(t), "") for t in tensors]
            per_part[label].append(entry)
    unnamed = _unnamed_matrices(per_part[main_label], names) if matrix_only(plan_.spec.target) else []
    if unnamed:
        warnings.warn(
            f"{main_label} takes {len(unnamed)} 2-D parameter(s) given without a name (shapes {unnamed[:4]}): "
            "without names, embeddings and the output head cannot be told from hidden matrices and go to "
            f"{main_label} too. Pass the model, dict(model.named_parameters()), or param groups with 'param_names'.",
            stacklevel=4,
        )
    if cannot:
        raise ConfigError(
            "These parameters are routed by a param group to an optimizer that takes only 2-D matrices: "
            + "; ".join(cannot) + ". Narrow the group's regex, or route them to another optimizer.",
            problems=[(entry.split(" ")[0], "not 2-D") for entry in cannot],
        )
    if unplaced:
        raise ConfigError(
            f"No optimizer takes these parameters: {'; '.join(unplaced)}. {main_label} takes only 2-D matrices; "
            f"give a fallback for the rest, e.g. {{'type': '{main_label}', 'fallback': {{'type': 'AdamW', 'lr': 3e-4}}}}.",
            problems=[(entry.split(" ")[0], "claimed by no optimizer") for entry in unplaced],
        )
    if not per_part[main_label]:
        raise ConfigError(
            f"{main_label} is routed no parameter (every one went to another optimizer), so it would step nothing. "
            f"Check the routing table (`optcore show --config FILE --model MOD:FN`), or make another optimizer the main type.",
            problems=[("type", f"{main_label} takes no parameter")],
        )
    finished = {label: finish(parts[label], tensors_groups) for label, tensors_groups in per_part.items() if tensors_groups}
    rows = []
    for label, planned in finished.items():
        for group in planned.groups:
            for p in group["params"]:
                rows.append({
                    "name": names.get(id(p), ""), "shape": tuple(p.shape), "optimizer": label, "why": reasons[id(p)],
                    "lr": group.get("lr", planned.hparams.get("lr")),
                    "weight_decay": group.get("weight_decay", planned.hparams.get("weight_decay")),
                })
    all_groups = tuple(g for planned in finished.values() for g in planned.groups)
    return replace(plan_, parts=tuple(finished.values()), groups=all_groups, routing=tuple(rows))


def _unnamed_matrices(groups: list[dict[str, Any]], names: dict[int, str]) -> list[tuple[int, ...]]:
    """The shapes of the matrices in ``groups`` that carry no name."""
    return [tuple(p.shape) for g in groups for p in g["params"] if p.ndim == 2 and id(p) not in names]


def _shared_lr(plan_: Any, fallback: Any) -> Any:
    """With ``adjust_lr_fn="match_rms_adamw"`` Muon scales each update to AdamW's RMS
    (0.2 * sqrt(max(rows, cols))), so one lr serves both halves: a fallback that
    gives no ``lr`` takes the main type's. Under torch's "original" rule Muon's lr
    is on another scale (0.02 against AdamW's 3e-4), and nothing is shared."""
    if plan_.hparams.get("adjust_lr_fn") != "match_rms_adamw" or "lr" not in plan_.hparams:
        return fallback
    config = {"type": fallback} if isinstance(fallback, str) else fallback
    if isinstance(config, Mapping) and "lr" not in config and "optimizer" not in config:
        return {**config, "lr": plan_.hparams["lr"]}
    return fallback


def _explicit_label(config: Any, parts: dict[str, Any], plan_: Any) -> str:
    raise ConfigError(
        "An explicit param-group dict names its own 'optimizer'; give the parameters by name instead (a model, or "
        "a dict of name -> tensor) with regex 'param_groups' entries carrying 'optimizer', so optcore can route them.",
        problems=[("optimizer", "in an explicit param-group dict")],
    )


def _why_not_main(target: Any, p: Tensor, avoided: str | None) -> str | None:
    """Why the main type does not take ``p``, or ``None`` when it does."""
    if not matrix_only(target):
        return None
    if p.ndim != 2:
        return f"{p.ndim}-D"
    return avoided


def _names(params_or_model: Any) -> dict[int, str]:
    """Each parameter's name, from every form that carries one: a model, a dict
    of name -> tensor, ``(name, tensor)`` pairs, or param-group dicts with torch's
    ``param_names``."""
    if isinstance(params_or_model, nn.Module):
        return {id(p): n for n, p in reversed(list(params_or_model.named_parameters()))}
    if isinstance(params_or_model, Mapping):
        return {id(p): str(n) for n, p in params_or_model.items() if isinstance(p, Tensor)}
    if isinstance(params_or_model, (list, tuple)):
        names: dict[int, str] = {}
        for item in params_or_model:
            if isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str) and isinstance(item[1], Tensor):
                names[id(item[1])] = item[0]
            elif isinstance(item, Mapping) and isinstance(item.get("param_names"), (list, tuple)):
                tensors = item.get("params")
                tensors = [tensors] if isinstance(tensors, Tensor) else list(tensors or [])
                names.update((id(t), str(n)) for n, t in zip(item["param_names"], tensors) if isinstance(t, Tensor))
        return names
    return {}


def _avoid(model: nn.Module | None, names: dict[int, str]) -> dict[int, str]:
    """The matrices a matrix optimizer should leave to the fallback: embeddings and
    the output head. The name rule applies to every form that carries names (so a
    model and ``dict(model.named_parameters())`` route alike); a model adds what
    only its modules tell (``nn.Embedding`` under any name, HF's
    ``get_output_embeddings()``, timm's ``pretrained_cfg["classifier"]``)."""
    out: dict[int, str] = {}
    for pid, name in names.items():
        parts = name.split(".")
        if parts[0] in HEAD_NAMES or "lm_head" in parts:
            out[pid] = "output head"
        elif _EMBEDDING_NAME.search(name):
            out[pid] = "embedding"
    if model is None:
        return out
    heads: list[nn.Module] = []
    get_output = getattr(model, "get_output_embeddings", None)
    if callable(get_output):
        try:
            found = get_output()
        except (NotImplementedError, AttributeError):
            found = None
        if isinstance(found, nn.Module):
            heads.append(found)
    classifier = (getattr(model, "pretrained_cfg", None) or {}).get("classifier") if isinstance(getattr(model, "pretrained_cfg", None), Mapping) else None
    for path in [classifier] if isinstance(classifier, str) else list(classifier or []):
        try:
            heads.append(model.get_submodule(path))
        except AttributeError:
            pass
    for module_name, module in model.named_modules():
        top = module_name.split(".")
        if module_name and (top[0] in HEAD_NAMES or top[-1] == "lm_head"):
            heads.append(module)
        if isinstance(module, (nn.Embedding, nn.EmbeddingBag)):
            out.update((id(p), "embedding") for p in module.parameters(recurse=False))
    for head in heads:
        out.update((id(p), "output head") for p in head.parameters() if id(p) not in out)
    return out


def place_sharded_matrices(spec: Any, groups: list[dict[str, Any]]) -> Any:
    """The spec to build over FSDP2's DTensor shards. An update of the whole tensor
    (the ``per_tensor`` sharding capability) must never be computed per shard:
    torch's ``Muon`` is built as :class:`~optcore.placement.ShardedMuon` (each
    matrix orthogonalised whole on an owner rank, the rest on the local rows);
    any other whole-tensor update (GaLore's projection, a trust ratio, a
    subclass of ``Muon`` with its own step) is refused, since optcore cannot
    vouch that its code sees whole tensors."""
    if not (matrix_only(spec.target) or getattr(spec.capabilities, "sharding", None) == "per_tensor"):
        return spec
    params = [p for g in groups for p in g["params"]]
    sharded = [tuple(p.shape) for p in params if is_dtensor(p)]
    if not sharded:
        return spec
    muon = getattr(torch.optim, "Muon", None)
    if muon is not None and getattr(spec.target, "adapted_from", spec.target) is muon:
        problem = layout_problem(params)
        if problem is None:
            return replace(spec, loader=lambda: ShardedMuon)
        raise ConfigError(
            f"{spec.name} over DTensor parameters is built to orthogonalise each whole matrix on one owner rank, "
            f"which needs each matrix split by rows over one mesh dimension (fully_shard, or HSDP), and {problem}. "
            "Shard with fully_shard (a 1-D mesh, or HSDP's 2-D one), or train Muon under DDP.",
            problems=[("type", f"{spec.name} over an unsupported DTensor layout")],
        )
    if getattr(spec.target, "optcore_matrix_only", False):  # GaLore
        why = ("projects each gradient with a per-matrix projector (an SVD of the whole gradient) and keeps its "
               "moments in the projected shape (rank x columns), which are no shards of the parameter: neither "
               "the projection nor its state can be split by FSDP2's rows, and DCP could not reshard them")
    else:
        why = "computes its update over each whole tensor, and optcore cannot see that its code gathers it"
    raise ConfigError(
        f"{spec.name} {why}; {len(sharded)} of its parameters are DTensor shards (FSDP2; shapes {sharded[:4]}), and "
        "a per-shard update would silently differ from one process. What works: train it unsharded under DDP "
        "(one optimizer per rank over whole parameters), or under FSDP2 use Muon for the matrices "
        "({'type': 'Muon', 'fallback': {'type': 'AdamW'}}: each matrix is orthogonalised whole on an owner rank) "
        "or an elementwise optimizer (AdamW).",
        problems=[("type", f"{spec.name} over DTensor parameters")],
    )


def backward_flag(value: Any) -> bool:
    try:
        return as_flag(value, "step_in_backward")
    except ValueError as exc:
        raise ConfigError(
            f"{exc}: it says whether each parameter is stepped as soon as its gradient is ready (default false).",
            problems=[("step_in_backward", "must be true or false")],
        ) from None


def refuse_wrapped_step_in_backward(wrappers: list[str]) -> None:
    raise ConfigError(
        f"step_in_backward cannot run inside {', '.join(wrappers)}: a precision wrapper unscales, checks for "
        "overflow and may skip the step after the whole backward, and with step_in_backward every parameter is "
        "already stepped by then. Use bf16 autocast without loss scaling, or drop step_in_backward.",
        problems=[("step_in_backward", "with a precision wrapper")],
    )


def _hashable(v: Any) -> Any:
    if isinstance(v, list):
        return tuple(_hashable(x) for x in v)
    if isinstance(v, Mapping):
        return tuple(sorted((str(k), _hashable(x)) for k, x in v.items()))
    return v

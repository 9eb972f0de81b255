"""Bare tensors from DeepSpeed's client optimizer callable.

``deepspeed.initialize(optimizer=callable)`` calls ``callable(model_parameters)``
from ``DeepSpeedEngine._configure_optimizer`` with the parameters as bare
tensors: the names that optcore's param groups are made from (the no-decay
group, the config's regex ``param_groups``, a composite's routing of embeddings
and heads) stay with the engine's model. A build over them would decay every
bias and norm weight and differ from ``build_optimizer(config, model)``
without a word, so the plan asks here for that model
(:func:`deepspeed_client_model`) and plans over both (:func:`plan_without_names`):
the same groups build, other groups are refused by name.
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable, Mapping
from typing import Any

import torch

from .._errors import ConfigError
from .._values import short_repr
from ._dcp_flat import frame_of

#: frames between the callable DeepSpeed calls and the plan's question: the
#: user's function, build_optimizer, plan, with room to spare
_DEPTH = 32

#: a parameter's group settings, comparable between two plans
Settings = tuple[tuple[str, str], ...]


def deepspeed_client_model() -> torch.nn.Module | None:
    """The model of the DeepSpeed engine whose ``_configure_optimizer`` calls
    a client optimizer callable above us on the stack, or ``None`` (DeepSpeed
    not imported, or not building an optimizer from a callable)."""
    engine = getattr(sys.modules.get("deepspeed.runtime.engine"), "DeepSpeedEngine", None)
    method = getattr(engine, "_configure_optimizer", None)
    code = getattr(inspect.unwrap(method), "__code__", None) if method is not None else None
    frame = frame_of(code, start=1, depth=_DEPTH)
    if frame is None or not callable(frame.f_locals.get("client_optimizer")):
        return None
    model = getattr(frame.f_locals.get("self"), "module", None)
    return model if isinstance(model, torch.nn.Module) else None


def plan_without_names(params: Any, model: torch.nn.Module, planned: Callable[[Any], Any]) -> Any:
    """``planned(params)`` (a :class:`~optcore.BuildPlan`), or a
    :class:`ConfigError` when ``planned(model)`` puts any of the bare tensors
    ``params`` in another group; param-group dicts, named tensors and tensors
    that are not ``model``'s are planned as given."""
    if not isinstance(params, (Mapping, torch.Tensor)):
        params = list(params)  # an iterator is read once: here and by the plan
    names = {id(p): n for n, p in model.named_parameters()}
    bare = isinstance(params, list) and all(isinstance(p, torch.Tensor) for p in params)
    if not bare or not any(id(p) in names for p in params):
        return planned(params)
    named_plan = planned(model)
    named, failure = _settings_by_param(named_plan), ""
    try:
        unnamed_plan = planned(params)
    except ConfigError as exc:  # e.g. regex param_groups, which need names
        unnamed_plan, failure = None, exc.message
    got = _settings_by_param(unnamed_plan) if unnamed_plan is not None else {}
    moved = [(names[i], named[i], got.get(i)) for i in map(id, params) if i in named and named[i] != got.get(i)]
    if unnamed_plan is not None and not moved:
        return unnamed_plan
    if unnamed_plan is not None:
        name, want, have = moved[0]
        shown = ", ".join(repr(n) for n, _, _ in moved[:6]) + f" and {len(moved) - 6} more" * (len(moved) > 6)
        what = (f"{len(moved)} of the {len(params)} parameters ({shown}) would be in other groups than over the "
                f"model: {name!r} gets {_difference(want, have)}")
    else:
        what = f"over the bare tensors the build stops: {failure}"
    spec_name = named_plan.spec.name
    raise ConfigError(
        "deepspeed.initialize called the client optimizer callable with the model's parameters as bare tensors, "
        f"without their names, and {spec_name}'s param groups come from names (the no-decay group for biases and "
        f"norms, regex 'param_groups', a composite's fallback): {what}. The run would differ from "
        "build_optimizer(config, model) without an error. Build over the model instead: pass "
        "optimizer=optcore.build_optimizer(config, model) (an optimizer, not a callable), or call "
        "optcore.integrations.deepspeed.initialize(model, ds_config, optimizer=config), which also refuses what "
        "ZeRO's flat partitions would change. To give every parameter the same settings on purpose, set "
        "\"no_decay\": false and give no 'param_groups'.",
        problems=[("params", "bare tensors from DeepSpeed's client optimizer callable")],
        target=spec_name,
    )


def _settings_by_param(plan_: Any) -> dict[int, Settings]:
    """Each parameter's group settings: the optimizer's defaults under the
    group's overrides (in a composite, with the optimizer that steps it); the
    groups' names are labels, not settings."""
    while plan_.inner is not None:
        plan_ = plan_.inner
    out = {}
    for group in plan_.groups or ():
        settings = {**plan_.hparams, **{k: v for k, v in group.items() if k not in ("params", "name")}}
        key = tuple(sorted((k, short_repr(v)) for k, v in settings.items()))
        out.update({id(p): key for p in group["params"]})
    return out


def _difference(want: Settings, have: Settings | None) -> str:
    a, b = dict(want), dict(have or ())
    keys = sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))
    return ", ".join(f"{k}={a.get(k, '(unset)')} over the model and {b.get(k, '(unset)')} bare" for k in keys)

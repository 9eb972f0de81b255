"""``plan``: the one road from a config to an optimizer, stopping short of building it.

Builds, ``optcore check``, the argparse flags and the conformance kit all go
through it, so a config ``check`` accepts is one the build accepts; the steps
are in docs/architecture.md ("The road of a config").
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

import torch

from . import composite
from ._config import chain
from ._errors import ConfigError
from ._group_rules import GROUP_META_KEYS, MATCH_KEYS, check_config
from ._hooks import get_plugin_manager, load_failure
from ._params import build_param_groups
from ._plugins import HOOKS_GROUP, declared, switched_off, switches_note
from ._registry import resolve
from ._schema import validate_groups, validate_hparams
from ._spec import OptimizerSpec
from ._torch_facts import PARAM_RULES
from .placement import deepspeed_client_model, plan_without_names, refuse_on_shards

#: Plugin-owned config keys, only to name the plugin when none claims one.
PLUGIN_KEY_HINTS = dict.fromkeys(("precision", "memory_efficient", "loss_scaler"), "optcore-fp16")


@dataclass(frozen=True)
class BuildPlan:
    """Everything decided before construction; ``explicit``: the hyper-parameters
    the config set; ``groups`` and ``implementation`` only with parameters."""

    spec: OptimizerSpec
    hparams: Mapping[str, Any]
    explicit: frozenset[str] = frozenset()
    group_specs: tuple[Mapping[str, Any], ...] = ()
    no_decay: bool = True
    layer_decay: float | None = None  # the config's rate (:mod:`.layerwise`), None when off
    inner: BuildPlan | None = None
    groups: tuple[dict[str, Any], ...] | None = field(default=None, repr=False)
    implementation: str | None = None
    #: the hook plugins' callers (pluggy's), collected once for the whole road
    hooks: Any = field(default=None, repr=False, compare=False)
    #: a composite's optimizers (:mod:`.composite`), and with parameters its routing table
    parts: tuple[BuildPlan, ...] = ()
    routing: tuple[Mapping[str, Any], ...] = field(default=(), repr=False)
    step_in_backward: bool = False

    @property
    def chain(self) -> tuple[OptimizerSpec, ...]:
        """The specs from the outermost wrapper to the optimizer that steps."""
        return (self.spec, *(self.inner.chain if self.inner else ()))

    @property
    def param_dtype(self) -> torch.dtype | None:
        """The dtype a precision wrapper needs the parameters in, or ``None``."""
        for plan in (self, *((self.inner,) if self.inner else ())):
            wanted = getattr(plan.spec.target, "param_dtype_for", None)
            if callable(wanted):
                return wanted(dict(plan.hparams))
        return None


def plan(config: Any, params_or_model: Any = None, *, allow_import_paths: bool | None = None) -> BuildPlan:
    """The :class:`BuildPlan` for ``config`` (over ``params_or_model`` if given);
    raises what a build would. ``allow_import_paths=False`` (or
    ``OPTCORE_ALLOW_IMPORT_PATHS=0``): only registered and plugin optimizers."""
    if params_or_model is not None and not isinstance(params_or_model, torch.nn.Module):
        model = deepspeed_client_model()  # None unless DeepSpeed calls a client optimizer callable
        if model is not None:  # its bare tensors: refused where the model's names would change the groups
            return plan_without_names(params_or_model, model, lambda over: _plan(config, over, allow_import_paths))
    return _plan(config, params_or_model, allow_import_paths)


def _plan(config: Any, params_or_model: Any, allow_import_paths: bool | None) -> BuildPlan:
    hooks = get_plugin_manager().hook
    links = chain(config, hooks.optcore_rewrite_config)
    specs = [resolve(link.pop("type"), allow_import_paths=allow_import_paths) for link in links]
    wrappers = []
    for spec, cfg, inner in zip(specs, links, specs[1:]):
        if not spec.is_wrapper:
            raise ConfigError(
                f"{spec.name} is not a wrapper optcore builds (its class declares no wraps_optimizer), so "
                "'optimizer' is not one of its keys: give its hyper-parameters directly, or use a wrapper type "
                "such as FP16Optimizer.",
                problems=[("optimizer", f"{spec.name} is not a wrapper")],
            )
        hparams = validate_hparams(spec.schema, cfg, spec.name)
        check = getattr(spec.target, "check_inner", None)
        if callable(check):
            check(inner, hparams)  # e.g. memory-efficient fp16 needs an optimizer that computes in fp32
        wrappers.append((spec, hparams, frozenset(cfg)))

    def part(config: Any) -> BuildPlan:  # a fallback's or a param group's own optimizer
        (link,) = composite.part_links(chain(config, hooks.optcore_rewrite_config))
        return _plan_optimizer(resolve(link.pop("type"), allow_import_paths=allow_import_paths), link, None, hooks)

    plan_ = _plan_optimizer(specs[-1], links[-1], params_or_model, hooks, part)
    if wrappers and plan_.step_in_backward:
        composite.refuse_wrapped_step_in_backward([spec.name for spec, _, _ in wrappers])
    for spec, hparams, explicit in reversed(wrappers):
        plan_ = BuildPlan(spec=spec, hparams=MappingProxyType(hparams), explicit=explicit, inner=plan_, hooks=hooks)
    return plan_


def _plan_optimizer(spec: OptimizerSpec, cfg: dict[str, Any], params_or_model: Any, hooks: Any, part: Any = None) -> BuildPlan:
    """The plan of the optimizer that steps (the innermost of a chain); ``part``
    plans the other optimizers of a composite config."""
    if spec.is_wrapper:
        raise ConfigError(
            f"{spec.name} wraps another optimizer: give it as 'optimizer', e.g. "
            f"{{'type': '{spec.name}', 'optimizer': {{'type': 'AdamW', 'lr': 3e-4}}}}.",
            problems=[("optimizer", "missing")],
        )
    group_specs = [dict(g) for g in cfg.pop("param_groups", None) or []]
    no_decay, layer_decay = cfg.pop("no_decay", True), cfg.pop("layer_decay", None)
    fallback, in_backward = cfg.pop("fallback", None), cfg.pop("step_in_backward", False)
    _reject_plugin_keys(spec, cfg)
    try:
        hparams = validate_hparams(spec.schema, cfg, spec.name)
    except ConfigError as exc:
        if not spec.shadowed:
            raise
        others = ", ".join(repr(s.qualified) for s in spec.shadowed)
        raise ConfigError(  # the fields may be another provider's: torch's Adafactor has no beta1, HF's does
            f"{exc.message}\n{spec.name!r} resolved to {spec.qualified} ({spec.source}), first in the resolution "
            f"order; also installed: {others}. If you meant one of those, give it as the type.",
            exc.problems, exc.accepted, exc.target,
        ) from None
    plan_ = BuildPlan(
        spec=spec,
        hparams=MappingProxyType(hparams),
        explicit=frozenset(cfg),
        group_specs=tuple(MappingProxyType(g) for g in group_specs),
        no_decay=no_decay,
        layer_decay=layer_decay,
        hooks=hooks,
        step_in_backward=in_backward is not False and composite.backward_flag(in_backward),
    )
    if fallback is not None or any(isinstance(g, Mapping) and "optimizer" in g for g in group_specs):
        return composite.plan_composite(plan_, fallback, params_or_model, part=part, finish=with_groups)
    if params_or_model is not None:
        return _with_params(plan_, params_or_model)
    check_config(group_specs)  # what matching would reject, without parameters to match
    _check_overrides(plan_, [])
    return plan_


def _reject_plugin_keys(spec: OptimizerSpec, cfg: dict[str, Any]) -> None:
    stray = [k for k in cfg if k in PLUGIN_KEY_HINTS and k not in spec.schema.model_fields]
    if stray:
        needs = sorted({PLUGIN_KEY_HINTS[k] for k in stray})
        raise ConfigError(
            f"{stray} are not hyper-parameters of {spec.name}: they are config keys of the "
            f"{' and '.join(needs)} plugin, and no plugin in use claims them. "
            + " ".join(_why_unclaimed(dist) for dist in needs) + " Or drop the keys.",
            problems=[(k, f"needs {PLUGIN_KEY_HINTS[k]}") for k in stray],
            target=spec.name,
        )


def _why_unclaimed(distribution: str) -> str:
    """What to do about a plugin that claims no key: installed but off, broken or too old; or not installed."""
    failed, off = load_failure(distribution), switched_off(distribution, HOOKS_GROUP)
    if failed:
        return f"{distribution} is installed and failed to load ({failed}): reinstall or upgrade it."
    if off:
        return f"{distribution} is installed, but {off}."
    if declared(distribution, HOOKS_GROUP):
        return f"{distribution} is installed and loaded, and claims none of them: upgrade it (`pip install -U {distribution}`)."
    note = switches_note()
    return (
        f"Install it (`pip install {distribution}`, or `pip install ./plugins/<name>` in optcore's repository)"
        + (f"; discovery now finds {note}, so let it find {distribution} too." if note else ".")
    )


def _check_overrides(plan_: BuildPlan, groups: list[dict[str, Any]]) -> None:
    """Validates the overrides of the config's ``param_groups`` and of the built
    ``groups`` over the plan's hyper-parameters, and writes the latter's in."""
    name = plan_.spec.name
    labelled = [(f"{name} param_groups[{i}]", g) for i, g in enumerate(plan_.group_specs)]
    labelled += [(f"{name} param group {g.get('name', i)}", g) for i, g in enumerate(groups)]
    overrides = [(label, {k: v for k, v in g.items() if k not in GROUP_META_KEYS and k not in MATCH_KEYS}) for label, g in labelled]
    checked = validate_groups(plan_.spec.schema, plan_.hparams, overrides)
    for group, values in zip(groups, checked[len(plan_.group_specs):]):
        group.update(values)


def _with_params(plan_: BuildPlan, params_or_model: Any) -> BuildPlan:
    spec, hparams = plan_.spec, plan_.hparams
    policies: list[Mapping[str, Any]] = []
    if isinstance(params_or_model, torch.nn.Module):
        results = plan_.hooks.optcore_param_group_policies(
            model=params_or_model, config={**hparams, "type": spec.name}
        )
        policies = [policy for result in results if result for policy in result]
    groups = build_param_groups(
        params_or_model,
        [dict(g) for g in plan_.group_specs],
        weight_decay=hparams.get("weight_decay") if "weight_decay" in spec.schema.model_fields else None,
        no_decay=plan_.no_decay,
        policies=policies,
        leaf_only=not hparams.get("differentiable", False),  # torch steps non-leaf params only then
        rules=PARAM_RULES.get(spec.name, ()) if spec.source == "torch" else (),
        owner=spec.name,
        layer_decay=plan_.layer_decay,
    )
    return with_groups(plan_, groups)


def with_groups(plan_: BuildPlan, groups: list[dict[str, Any]]) -> BuildPlan:
    """The plan completed with ``groups``: their overrides validated, ``lr_scale``
    applied, the implementation chosen (``optcore check`` passes stand-in groups)."""
    spec, hparams = plan_.spec, dict(plan_.hparams)
    if any(hasattr(p, "device_mesh") for g in groups for p in g["params"]):  # FSDP2's DTensor shards
        spec = composite.place_sharded_matrices(spec, groups)
        refuse_on_shards(spec, hparams, groups)
    _check_overrides(plan_, groups)
    for group in groups:
        # a tensor lr stays a tensor (torch.compile's recipe), one per group: a scheduler fills it in place
        base, scale = group.get("lr", hparams.get("lr")), group.get("lr_scale")
        if isinstance(base, torch.Tensor):
            group["lr"] = base.detach().clone() if scale is None else base * scale
        elif base is not None and scale is not None:
            group["lr"] = float(base) * scale
    implementation = None
    if spec.source == "torch" and "fused" in hparams:
        # torch's fused kernel (its fastest path) where the config did not choose and the params allow it
        if not (plan_.explicit & {"fused", "foreach"} or hparams.get("differentiable") or hparams.get("capturable")):
            hparams["fused"] = fused_supported([p for g in groups for p in g["params"]])
        implementation = "fused" if hparams.get("fused") else ("foreach" if hparams.get("foreach") else None)
    return replace(plan_, spec=spec, hparams=MappingProxyType(hparams), groups=tuple(groups), implementation=implementation)


def fused_supported(params: list[torch.Tensor]) -> bool:
    """Whether torch's fused optimizer kernels accept all of ``params``."""
    from torch.utils._foreach_utils import _get_fused_kernels_supported_devices

    devices = set(_get_fused_kernels_supported_devices())
    floating = (torch.float16, torch.float32, torch.float64, torch.bfloat16)
    # DTensor (FSDP2) has no sharding rule for the fused kernels: plain tensors only
    plain = (torch.Tensor, torch.nn.Parameter)
    return bool(params) and all(
        type(p) in plain and p.device.type in devices and p.dtype in floating and not p.is_sparse for p in params
    )

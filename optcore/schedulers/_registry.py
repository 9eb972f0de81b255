"""Learning-rate schedulers by name: resolve, build, register, list.

Names resolve like optimizer names (case, ``_`` and ``-`` do not matter), in
this order:

1. ``torch.optim.lr_scheduler`` classes (``StepLR``, ``OneCycleLR``,
   ``ReduceLROnPlateau``, which is also transformers' ``reduce_lr_on_plateau``);
2. the built-in named schedules of :mod:`optcore.schedulers.builtin` (transformers' and
   fairseq's names);
3. ``register_scheduler`` in user code, then entry points in group
   ``optcore.schedulers`` (a plugin is imported when one of its names is asked
   for; a broken one fails for its own names only).

The machinery is the optimizers' :class:`~optcore._resolution.Registry`; this
module adds :class:`SchedulerSpec` and the build rules shared by every
schedule: warm-up is ``warmup_steps`` (``num_warmup_steps`` and fairseq's
``warmup_updates`` are the same key), the run length is ``num_training_steps``
(config or call), and a schedule that needs it and lacks it is a
:class:`ConfigError`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import torch

from .._config import merge_kwargs, typed_config
from .._contract import LR_SCHEDULES
from .._errors import ConfigError, OptcoreError, SchedulerNotFoundError, rejected_config, warn_user
from .._plugins import SCHEDULERS_GROUP
from .._resolution import Registry
from .._literals import parse_literal
from .._schema import validate_hparams
from .._values import short_repr
from .._spec import OptimizerSpec
from .._torch_facts import known_lr_schedule
from .._version import __version__
from ._torch import NON_DECAYING, TOTAL_FIELDS, construct, scale_absolute_lrs, torch_scheduler_names, torch_schema
from .builtin import BUILTINS

#: The spellings of the warm-up length; a schedule's schema has at most one.
WARMUP_KEYS = ("warmup_steps", "num_warmup_steps", "warmup_updates")
#: Config keys that carry more hyper-parameters (transformers' spellings).
KWARGS_KEYS = ("scheduler_specific_kwargs", "lr_scheduler_kwargs")


@dataclass(frozen=True, eq=False)
class SchedulerSpec(OptimizerSpec):
    """One scheduler name and where it comes from.

    ``target`` (the class or factory) and ``schema`` load on first access, as
    for :class:`~optcore.OptimizerSpec`; ``needs_metric`` says that
    ``step(metric)`` drives it, ``needs_total`` that it cannot be built
    without ``num_training_steps``.
    """

    kind: str = "scheduler"

    def __reduce__(self) -> tuple[Any, ...]:
        return (resolve_scheduler, (self.qualified,))

    @cached_property
    def schema(self) -> Any:
        if self.explicit_schema is not None:
            return self.explicit_schema
        declared = getattr(self.target, "config_schema", None)
        if declared is not None:
            return declared

        return torch_schema(self.target)

    def _flag(self, attr: str) -> bool | None:
        value = getattr(self.target, attr, None)
        return value if isinstance(value, bool) else None

    @property
    def needs_metric(self) -> bool:
        flag = self._flag("needs_metric")
        if flag is not None:
            return flag
        return isinstance(self.target, type) and issubclass(self.target, torch.optim.lr_scheduler.ReduceLROnPlateau)

    @property
    def total_field(self) -> str | None:
        """The field that holds the run length (filled from ``num_training_steps``)."""
        declared = getattr(self.target, "total_field", None)
        if isinstance(declared, str):
            return declared

        if self.source == "torch" and self.name in TOTAL_FIELDS:
            return TOTAL_FIELDS[self.name][0]
        return "num_training_steps" if "num_training_steps" in self.schema.model_fields else None

    @property
    def needs_total(self) -> bool:
        flag = self._flag("needs_total")
        if flag is not None:
            return flag
        field = self.total_field
        return field is not None and field in self.schema.model_fields and self.schema.model_fields[field].is_required()

    @property
    def warmup_field(self) -> str | None:
        """The schema's spelling of the warm-up length, if it has one."""
        return next((k for k in WARMUP_KEYS if k in self.schema.model_fields), None)

    @property
    def decays(self) -> bool:
        flag = self._flag("decays")
        if flag is not None:
            return flag

        return not (self.source == "torch" and self.name in NON_DECAYING)

    def describe(self, load: bool = False) -> dict[str, Any]:
        """A JSON-ready summary. ``needs_metric``, ``needs_total`` and
        ``description`` come from the target: for torch's and the built-in
        schedules (and any target already loaded) always; for a plugin's or a
        package's only with ``load=True`` (``optcore show``), else ``None``, so
        that ``optcore list`` imports no plugin code and lists a broken one."""
        out = super().describe()
        if load or self.loaded:
            out.update(needs_metric=self.needs_metric, needs_total=self.needs_total, description=self.description)
        else:
            out.update(needs_metric=None, needs_total=None, description=None)
        return out


def _torch_specs() -> list[SchedulerSpec]:
    from torch.optim import lr_scheduler as tls


    return [
        SchedulerSpec(
            name=name,
            source="torch",
            provider="torch",
            qualified=f"torch:{name}",
            loader=(lambda name=name: getattr(tls, name)),
            version=torch.__version__,
        )
        for name in torch_scheduler_names()
    ]


def _builtin_specs() -> list[SchedulerSpec]:

    return [
        SchedulerSpec(
            name=cls.name,
            source="builtin",  # type: ignore[arg-type]
            provider="optcore",
            qualified=f"optcore:{cls.name}",
            loader=(lambda cls=cls: cls),
            version=__version__,
        )
        for cls in BUILTINS
    ]


class _SchedulerRegistry(Registry):
    def _searched(self) -> list[str]:
        return [
            "torch.optim.lr_scheduler",
            "optcore built-in schedules",
            "register_scheduler()",
            f"plugins (entry points {self.group})",
        ]


SCHEDULERS = _SchedulerRegistry(
    "scheduler",
    SCHEDULERS_GROUP,
    [_torch_specs, _builtin_specs],
    not_found=SchedulerNotFoundError,
    spec_class=SchedulerSpec,
)


# ------------------------------------------------------------------ look-up
def resolve_scheduler(name: Any, *, allow_import_paths: bool | None = None) -> SchedulerSpec:
    """The :class:`SchedulerSpec` for ``name`` (a name, ``"torch:StepLR"``,
    ``"optcore:cosine"``, ``"pkg.mod:Class"``, or a class); raises
    :class:`SchedulerNotFoundError` with the closest names if none.
    ``allow_import_paths`` as for :func:`optcore.resolve`."""
    return SCHEDULERS.resolve(name, allow_import_paths=allow_import_paths)  # type: ignore[return-value]


def list_schedulers(all: bool = False) -> list[SchedulerSpec]:
    """Every resolvable scheduler name once (``all=True``: shadowed providers too)."""
    return SCHEDULERS.list(all=all)  # type: ignore[return-value]


def register_scheduler(
    name_or_target: Any = None, target: Any = None, *, schema: Any = None, override: bool = False
) -> Any:
    """Register a scheduler class or factory (called as ``target(optimizer,
    **hparams)``), like :func:`optcore.register_optimizer`::

        @register_scheduler("my_sched", schema=MySchedConfig)
        class MySched(torch.optim.lr_scheduler.LRScheduler): ...

        register_scheduler("my_sched", make_my_sched)
        register_scheduler(MySched)

    Without ``schema``, the class's ``config_schema`` or its signature is used.
    Class attributes ``needs_metric``, ``needs_total``, ``total_field`` and
    ``decays`` (bools / a field name) tell optcore how to build and step it.
    """
    return SCHEDULERS.register(name_or_target, target, schema=schema, override=override)


def unregister_scheduler(name: str) -> None:
    """Remove a ``register_scheduler`` registration."""
    SCHEDULERS.unregister(name)


# -------------------------------------------------------------------- build
def build_scheduler(
    config: Any,
    optimizer: torch.optim.Optimizer,
    num_training_steps: int | None = None,
    *,
    allow_import_paths: bool | None = None,
) -> Any:
    """Build the scheduler ``config`` describes for ``optimizer``.

    ``config``: ``{"type": "cosine", "warmup_steps": 500, ...}``, a type name,
    the nested form ``{"lr_scheduler": {...}}``, a pydantic model or an
    OmegaConf ``DictConfig``; ``None`` gives ``None``. ``num_training_steps``
    fills the schedule's run length unless the config sets it.

    What the optimizer does with its ``lr`` is its ``lr_schedule`` capability
    (the contract's; optcore knows it of the third-party schedule-free classes).
    Warns when the combination is likely wrong (a decaying schedule on a
    schedule-free optimizer, a warm-up longer than the run); raises
    :class:`ConfigError` for bad or missing fields, and for a schedule other
    than ``pass_through`` on an optimizer that has no lr or ignores it.
    """
    if config is None:
        return None
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise ConfigError(
            f"build_scheduler needs a torch.optim.Optimizer, got {type(optimizer).__name__}; build one with "
            "optcore.build_optimizer(...) first.",
            problems=[("optimizer", "not a torch.optim.Optimizer")],
        )
    spec, kwargs = validate_scheduler_config(config, num_training_steps, allow_import_paths=allow_import_paths)
    if spec.name != "pass_through" and (
        any(g.get("lr") is None for g in optimizer.param_groups) or lr_schedule(optimizer) == "none"
    ):
        raise ConfigError(
            f"{type(optimizer).__name__} computes its own step size (its lr is None or unused, e.g. Adafactor in "
            f"relative-step mode), so there is nothing for {spec.name!r} to schedule. Use {{'type': 'pass_through'}}, "
            "or give the optimizer an lr to schedule (for Adafactor: relative_step=False, scale_parameter=False "
            "and an lr).",
            problems=[("type", "optimizer has no lr")],
            target=spec.name,
        )
    _warn_about_combination(spec, kwargs, optimizer)
    saved = _snapshot(optimizer)
    try:
        with rejected_config(spec, config=config):
            return _construct(spec, optimizer, kwargs)
    except BaseException:
        _restore(optimizer, saved)  # a constructor that failed half-way has set initial_lr / lr already
        raise


def _snapshot(optimizer: torch.optim.Optimizer) -> list[dict[str, Any]]:
    """Each group's settings (not its params), tensor values copied."""
    def copy(v: Any) -> Any:
        return v.detach().clone() if isinstance(v, torch.Tensor) else None

    return [{k: (v, copy(v)) for k, v in g.items() if k != "params"} for g in optimizer.param_groups]


def _restore(optimizer: torch.optim.Optimizer, saved: list[dict[str, Any]]) -> None:
    for group, before in zip(optimizer.param_groups, saved):
        for key in [k for k in group if k != "params" and k not in before]:
            del group[key]
        for key, (value, copy) in before.items():
            if copy is not None:
                with torch.no_grad():
                    value.copy_(copy)
            group[key] = value


def validate_scheduler_config(
    config: Any, num_training_steps: int | None = None, *, allow_import_paths: bool | None = None
) -> tuple[SchedulerSpec, dict[str, Any]]:
    """Resolve and validate a scheduler config without building anything
    (``optcore check`` uses it): the spec and the keyword arguments the
    schedule would be built with, or a :class:`ConfigError` naming every bad
    field (nested ``SequentialLR``/``ChainedScheduler`` configs included)."""
    cfg = _scheduler_config(config)
    spec = resolve_scheduler(cfg.pop("type"), allow_import_paths=allow_import_paths)
    problems: list[tuple[str, str]] = []
    values = _normalise_keys(spec, cfg, _run_length(num_training_steps, problems), problems)
    kwargs = validate_hparams(spec.schema, values, spec.name, problems)
    if spec.source == "torch" and isinstance(kwargs.get("schedulers"), list):
        for sub in kwargs["schedulers"]:
            if isinstance(sub, (Mapping, str)):
                validate_scheduler_config(sub)
    return spec, kwargs


def _scheduler_config(config: Any) -> dict[str, Any]:
    plain = typed_config(config, "scheduler", ("lr_scheduler", "scheduler"), "{'type': 'cosine', 'warmup_steps': 500}")
    for key in KWARGS_KEYS:
        merge_kwargs(plain, key)
    return plain


def _run_length(
    value: Any, problems: list[tuple[str, str]], where: str = "build_scheduler(num_training_steps=...)"
) -> Any:
    """``num_training_steps`` as a positive int (``"1000"`` is read as 1000);
    anything else is recorded in ``problems`` and read as absent."""
    if value is None:
        return None
    number = parse_literal(value) if isinstance(value, str) else value
    if isinstance(number, int) and not isinstance(number, bool) and number > 0:
        return number
    if isinstance(number, float) and number.is_integer() and number > 0:
        return int(number)
    shown = short_repr(value)
    problems.append(("num_training_steps", f"{where} must be a positive whole number of steps, got {shown}"))
    return None


def _normalise_keys(
    spec: SchedulerSpec, cfg: dict[str, Any], call_total: int | None, problems: list[tuple[str, str]]
) -> dict[str, Any]:
    """One spelling of warm-up and run length, whatever the reference's.
    What is wrong is appended to ``problems`` (reported together with the
    schema's findings); the fields at fault are left out of the result."""
    warm = spec.warmup_field
    given = [k for k in WARMUP_KEYS if k in cfg]
    if warm is not None and given:
        values = [cfg.pop(k) for k in given]
        if any(v != values[0] for v in values[1:]):
            problems.append((
                warm,
                f"the warm-up length is given twice with different values ({', '.join(given)}); keep one "
                f"({warm!r} is the schedule's own spelling)",
            ))
        else:
            cfg[warm] = values[0]

    total = spec.total_field
    if "num_training_steps" in cfg and total != "num_training_steps":
        alias = _run_length(cfg.pop("num_training_steps"), problems, "num_training_steps")
        # schedules without a run length ignore a valid one, as they would a call argument
        if total is not None and alias is not None:
            if cfg.get(total) is not None and cfg[total] != alias:
                shown = short_repr(cfg.pop(total))
                problems.append((total, f"num_training_steps={alias} and {total}={shown} disagree; keep one"))
            else:
                cfg[total] = alias
    if total is not None and call_total is not None:

        replaced_by = TOTAL_FIELDS.get(spec.name, ("", ()))[1] if spec.source == "torch" else ()
        if cfg.get(total) is None and not any(k in cfg for k in replaced_by):
            cfg[total] = call_total
        elif cfg.get(total) is not None and cfg[total] != call_total:
            warn_user(
                f"{spec.name}: the config's {total}={short_repr(cfg[total])} wins over "
                f"build_scheduler(num_training_steps={call_total}).", UserWarning)
    reported = {f for f, _ in problems}
    if spec.needs_total and cfg.get(total) is None and not reported & {total, "num_training_steps"}:
        cfg.pop(total, None)  # type: ignore[arg-type]
        problems.append((
            str(total),
            f"missing: {spec.name} needs the length of the run; pass build_scheduler(..., num_training_steps=N) "
            f"(optcore.build passes its num_training_steps) or set {total!r} in the scheduler config",
        ))
    return cfg


def lr_schedule(optimizer: Any) -> str:
    """What ``optimizer`` does with the group lr (one of ``LR_SCHEDULES``): the first
    declaration other than ``"any"`` on it or on the optimizers it wraps
    (``.optimizer``, as precision wrappers and training stacks hold them), each
    the object's ``lr_schedule`` or what optcore knows of its class."""
    for _ in range(4):  # the wrappers of the training stacks nest two or three deep
        if optimizer is None:
            break
        value = getattr(optimizer, "lr_schedule", None) or known_lr_schedule(type(optimizer)) or "any"
        if value not in LR_SCHEDULES:
            raise OptcoreError(
                f"{type(optimizer).__name__}.lr_schedule is {value!r}; it must be one of {', '.join(LR_SCHEDULES)} "
                "(the contract page says what each means). Fix the optimizer class's declaration."
            )
        if value != "any":
            return value
        optimizer = getattr(optimizer, "optimizer", None)
    return "any"


def _warn_about_combination(spec: SchedulerSpec, kwargs: dict[str, Any], optimizer: Any) -> None:
    warm, total = spec.warmup_field, spec.total_field
    w = kwargs.get(warm) if warm else None
    n = kwargs.get(total) if total else None
    if isinstance(w, int) and isinstance(n, int) and w > n:
        warn_user(
            f"{spec.name}: {warm}={w} is longer than the run ({total}={n}); the learning rate never reaches its "
            "peak. Shorten the warm-up or check num_training_steps.", UserWarning)
    if not spec.decays:
        return
    if lr_schedule(optimizer) == "constant":
        warn_user(
            f"{type(optimizer).__name__} is schedule-free: it replaces the decay by iterate averaging, and a "
            f"decaying schedule ({spec.name!r}) works against it. Use 'constant' or 'constant_with_warmup'.", UserWarning)


def _construct(spec: SchedulerSpec, optimizer: torch.optim.Optimizer, kwargs: dict[str, Any]) -> Any:
    target = spec.target
    if spec.source == "torch":

        kwargs = scale_absolute_lrs(spec.name, kwargs, optimizer)
        return construct(target, optimizer, kwargs, lambda sub: build_scheduler(sub, optimizer))
    return target(optimizer, **kwargs)

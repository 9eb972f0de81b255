"""The Hugging Face ``Trainer`` with an optimizer built by optcore.

Two ways in, one config:

- :func:`optimizers` for ``Trainer(optimizers=...)``: optcore builds the
  optimizer *and* the schedule of the config now, on the model as given::

      trainer = Trainer(model, args, train_dataset=data,
                        optimizers=hf.optimizers(config, model, args))

- :func:`optimizer_cls_and_kwargs` for ``Trainer(optimizer_cls_and_kwargs=...)``:
  the Trainer builds the optcore optimizer itself when training starts (after
  it has moved or wrapped the model) and keeps its own ``lr_scheduler_type``
  and ``warmup_steps``::

      trainer = Trainer(model, args, train_dataset=data,
                        optimizer_cls_and_kwargs=hf.optimizer_cls_and_kwargs({"type": "Lion", "lr": 3e-4}))

**The optcore config wins.** Both ways keep optcore's param groups (biases and
norm weights at ``weight_decay=0``, the config's regex ``param_groups``) and
its validated hyper-parameters, so ``TrainingArguments.learning_rate``,
``weight_decay``, ``adam_beta1/2``, ``adam_epsilon``, ``optim`` and
``optim_args`` do not apply. :func:`optimizers` warns when one of them was
set to something other than its default, naming the config value that applies
instead; to go the other way, :func:`config_from_training_args` turns
``TrainingArguments`` into the optcore config that builds what the Trainer
would (the :data:`OPTIM_TABLE` row for ``args.optim``).

Adafactor in relative-step mode (``lr`` unset) has no ``lr`` to schedule: a
schedule of the Trainer's would fail on it, and ``learning_rate`` would log as
``None``. :func:`optimizers` returns an :class:`AppliedLR` schedule then, whose
``get_last_lr()`` (what the Trainer logs) is the step size the optimizer
applied.

The Trainer wraps the optimizer in accelerate's ``AcceleratedOptimizer``,
which hides the contract; ``callbacks=[hf.ContractCallback()]`` gives
``trainer.optimizer`` the contract again when training starts (``get_lr``,
``clip_grad_norm``, ``step(scale=)``, ... with accelerate's step rules kept).

``transformers`` is imported only by the functions that need it (and by
``ContractCallback``, when it is first asked for).
"""

from __future__ import annotations

import dataclasses
import re
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from .._build import build, build_optimizer
from .._config import to_plain
from .._errors import ConfigError
from .._plan import plan
from .unwrap import unwrap

__all__ = [
    "OPTIM_TABLE",
    "AppliedLR",
    "ContractCallback",  # noqa: F822  (made by __getattr__ below)
    "HFOptim",
    "OptcoreFactory",
    "config_from_training_args",
    "galore_config",
    "optimizer_cls_and_kwargs",
    "optimizers",
]


def __getattr__(name: str) -> Any:
    """``ContractCallback`` subclasses transformers' ``TrainerCallback``, so it
    is imported when first asked for, not with this module."""
    if name == "ContractCallback":
        from ._hf_contract import ContractCallback

        return ContractCallback
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# ------------------------------------------------------------ one config, two ways in
def optimizers(
    config: Any, model: torch.nn.Module, args: Any = None, *, num_training_steps: int | None = None
) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler | None]:
    """``(optimizer, scheduler)`` for ``Trainer(optimizers=...)`` from an optcore config.

    ``config`` is ``{"optimizer": {...}, "lr_scheduler": {...}}`` or an
    optimizer config alone. The schedule needs the number of optimizer steps:
    ``num_training_steps``, else ``args.max_steps`` when it is set. Without an
    ``lr_scheduler`` the scheduler is ``None`` and the Trainer's own
    ``lr_scheduler_type`` applies to the config's lr, as with any optimizer
    handed to it, except for relative-step Adafactor, which gets
    :class:`AppliedLR`.
    """
    plain = _nested(config)
    if num_training_steps is None and args is not None and getattr(args, "max_steps", -1) > 0:
        num_training_steps = int(args.max_steps)
    optimizer, scheduler = build(plain, model, num_training_steps=num_training_steps)
    if args is not None:
        _warn_unused_training_args(args, optimizer)
    if scheduler is None and any(g.get("lr") is None for g in optimizer.param_groups):
        scheduler = AppliedLR(optimizer)
    return optimizer, scheduler


class OptcoreFactory:
    """What ``optimizer_cls_and_kwargs`` names: transformers (5.x) calls
    ``OptcoreFactory()(model, **kwargs)`` for anything that is not an
    optimizer class, and the kwargs are the optimizer config."""

    def __call__(self, model: torch.nn.Module, **config: Any) -> torch.optim.Optimizer:
        optimizer = build_optimizer(config, model)
        if any(g.get("lr") is None for g in optimizer.param_groups):
            raise ConfigError(
                f"{config.get('type')} computes its own step size (no lr), which the Trainer's "
                "lr_scheduler_type cannot schedule: pass Trainer(optimizers=optcore.integrations.hf.optimizers("
                "config, model, args)) instead, or set an lr (Adafactor: relative_step=False, lr=...).",
                problems=[("lr", "unset: the optimizer computes its own step size")],
            )
        return optimizer


def optimizer_cls_and_kwargs(config: Any) -> tuple[type[OptcoreFactory], dict[str, Any]]:
    """``(factory, optimizer_config)`` for ``Trainer(optimizer_cls_and_kwargs=...)``.

    The config is checked now (a typo fails when the Trainer is made, not when
    training starts); the Trainer builds the optimizer on its model later.
    A schedule in the config is an error: on this road the Trainer makes its
    own (``lr_scheduler_type``); use :func:`optimizers` to train with the
    config's.
    """
    plain = to_plain(config)
    if isinstance(plain, str):
        plain = {"type": plain}
    if not isinstance(plain, Mapping):
        raise ConfigError(f"an optimizer config is a mapping with a 'type', not {type(plain).__name__}")
    if "lr_scheduler" in plain or "scheduler" in plain:
        raise ConfigError(
            "optimizer_cls_and_kwargs() builds the optimizer only; the Trainer schedules it with "
            "TrainingArguments.lr_scheduler_type. Use Trainer(optimizers=optcore.integrations.hf.optimizers("
            "config, model, args)) to train with the config's lr_scheduler.",
            problems=[("lr_scheduler", "not used on this road")],
        )
    optimizer = dict(plain["optimizer"]) if "optimizer" in plain and "type" not in plain else dict(plain)
    plan(optimizer)  # validate now, without parameters
    return OptcoreFactory, optimizer


def _nested(config: Any) -> dict[str, Any]:
    plain = to_plain(config)
    if isinstance(plain, str):
        return {"optimizer": {"type": plain}}
    if not isinstance(plain, Mapping):
        raise ConfigError(f"an optcore config is a mapping, not {type(plain).__name__}")
    if "optimizer" in plain and "type" not in plain:
        return dict(plain)
    return {"optimizer": dict(plain)}


#: The TrainingArguments fields an optcore optimizer ignores, with the
#: optimizer hyper-parameter that applies instead (None: no counterpart).
_IGNORED_ARGS = {
    "learning_rate": "lr",
    "weight_decay": "weight_decay",
    "adam_beta1": "betas",
    "adam_beta2": "betas",
    "adam_epsilon": "eps",
    "optim": None,
    "optim_args": None,
}


def _warn_unused_training_args(args: Any, optimizer: torch.optim.Optimizer, ignore: tuple[str, ...] = ()) -> None:
    """Say which TrainingArguments were set but lose to the optcore config
    (``ignore``: fields that carry the config itself, like swift's optim_args)."""
    defaults = {f.name: f.default for f in dataclasses.fields(type(args))} if dataclasses.is_dataclass(args) else {}
    effective = getattr(unwrap(optimizer), "optimizer_config", {}) or {}
    lines = []
    for name, replacement in _IGNORED_ARGS.items():
        if name in ignore or name not in defaults or not hasattr(args, name):
            continue
        value, default = getattr(args, name), defaults[name]
        if value == default or (name == "optim" and str(value) == str(default)):
            continue
        instead = f"the config's {replacement}={effective[replacement]!r}" if replacement in effective else "none"
        lines.append(f"TrainingArguments.{name}={value!r} (applies instead: {instead})")
    if lines:
        warnings.warn(
            "optcore's config sets the optimizer, so these TrainingArguments do not apply: "
            + "; ".join(lines)
            + ". Put the values in the optcore config, or build the config from them with "
            "optcore.integrations.hf.config_from_training_args(args).",
            UserWarning,
            stacklevel=3,
        )


# ------------------------------------------------------------ what the Trainer logs
class AppliedLR(torch.optim.lr_scheduler.LRScheduler):
    """A schedule that changes nothing and reports the learning rate the
    optimizer applied, for optimizers that compute their own step size
    (relative-step Adafactor). The Trainer logs ``get_last_lr()[0]``; with
    this schedule that is the optimizer's ``get_lr()`` (the plugin reports the
    step size last applied), instead of ``None``."""

    def __init__(self, optimizer: torch.optim.Optimizer, last_epoch: int = -1) -> None:
        self._inner = unwrap(optimizer)
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list[Any]:  # what step() writes back: the groups' own lr, untouched
        return [group["lr"] for group in self.optimizer.param_groups]

    def get_last_lr(self) -> list[float]:
        """The applied learning rate of every group."""
        try:
            lrs = [float(lr) for lr in self._inner.get_lrs()]
        except (TypeError, ValueError):  # a group lr is None: the optimizer knows the step size it applied
            lrs = [float(self._inner.get_lr())] * len(self.optimizer.param_groups)
        return lrs


# ------------------------------------------------------------ TrainingArguments.optim -> optcore
@dataclass(frozen=True)
class HFOptim:
    """One ``TrainingArguments.optim`` name and the optcore config that builds
    the same optimizer: ``type`` (``None`` when optcore cannot build it, with
    ``note`` saying why), ``fixed`` hyper-parameters, ``adam`` (takes
    ``betas``/``eps`` from ``adam_beta1/2``/``adam_epsilon``), and the
    ``optim_args`` keys it reads with their types."""

    type: str | None
    fixed: Mapping[str, Any] = field(default_factory=dict)
    adam: bool = False
    betas: bool = False  # takes betas (not eps) from adam_beta1/2, as bitsandbytes' Lion
    optim_args: Mapping[str, Callable[[str], Any]] = field(default_factory=dict)
    defaults: Mapping[str, Any] = field(default_factory=dict)  # optim_args defaults the Trainer fills in
    weight_decay_kwarg: bool = False  # the Trainer passes args.weight_decay as a constructor kwarg too
    note: str = ""


def _bool(value: str) -> bool:
    return value.strip().lower() in ("true", "1", "yes")


def _dtype(value: str) -> torch.dtype:
    dtype = getattr(torch, value, None)
    if not isinstance(dtype, torch.dtype):
        raise ConfigError(f"{value!r} is not a torch dtype (e.g. float32, bfloat16)")
    return dtype


def _bnb(cls: str, bits: int, paged: bool) -> HFOptim:
    fixed = {"optim_bits": bits, "is_paged": paged}
    return HFOptim(f"bitsandbytes.optim:{cls}", fixed, adam=cls == "AdamW", betas=cls == "Lion")


_NOT_BY_CONFIG = (
    "needs per-module projection settings (optim_target_modules) or the model in its constructor, "
    "which an optcore config does not express: keep TrainingArguments.optim for it"
)

#: ``optim`` -> (GaLore's class, galore_torch's class for the other parameters, what the Trainer fixes)
_GALORE: Mapping[str, tuple[str, str, Mapping[str, Any]]] = {
    "galore_adamw": ("GaLoreAdamW", "galore_torch.adamw:AdamW", {}),
    "galore_adamw_8bit": ("GaLoreAdamW8bit", "galore_torch.adamw8bit:AdamW8bit", {}),
    "galore_adafactor": ("GaLoreAdafactor", "galore_torch.adafactor:Adafactor",
                         {"scale_parameter": False, "relative_step": False}),
}
_GALORE_NOTE = "needs the model (optim_target_modules names its modules): galore_config(args, model)"
_LAYERWISE = (
    "steps each parameter with its own optimizer from a gradient hook inside backward (the Trainer's "
    "LayerWiseDummyOptimizer), which no optcore config builds: that optimizer has no param groups or state to "
    "save, schedule or clip. Use the optim name without _layerwise (hf.galore_config(args, model)) and add "
    "\"step_in_backward\": true to the config: optcore then steps each parameter as its gradient is ready, "
    "with one state_dict and a scheduler that works"
)

#: Every ``transformers.training_args.OptimizerNames`` value (transformers 5.x)
#: and the optcore optimizer config that builds the same optimizer.
OPTIM_TABLE: Mapping[str, HFOptim] = {
    # the Trainer's torch classes with torch's own default path (fused=None), not optcore's fused default
    "adamw_torch": HFOptim("torch.optim:AdamW", {"fused": None}, adam=True),
    "adamw_torch_fused": HFOptim("torch.optim:AdamW", {"fused": True}, adam=True),
    "adamw_torch_xla": HFOptim("torch_xla.amp.syncfree:AdamW", adam=True),
    "adamw_torch_npu_fused": HFOptim("torch_npu.optim:NpuFusedAdamW", adam=True),
    "adafactor": HFOptim("transformers.optimization:Adafactor", {"scale_parameter": False, "relative_step": False}),
    "adamw_anyprecision": HFOptim(
        "torchdistx.optimizers:AnyPrecisionAdamW",
        adam=True,
        optim_args={
            "use_kahan_summation": _bool,
            "momentum_dtype": _dtype,
            "variance_dtype": _dtype,
            "compensation_buffer_dtype": _dtype,
        },
        defaults={
            "use_kahan_summation": False,
            "momentum_dtype": torch.float32,
            "variance_dtype": torch.float32,
            "compensation_buffer_dtype": torch.bfloat16,
        },
    ),
    "adamw_torch_4bit": HFOptim(
        "torchao.optim:AdamW4bit",
        adam=True,
        optim_args={"block_size": int, "bf16_stochastic_round": _bool},
        defaults={"block_size": 256, "bf16_stochastic_round": False},
    ),
    "adamw_torch_8bit": HFOptim(
        "torchao.optim:AdamW8bit",
        adam=True,
        optim_args={"block_size": int, "bf16_stochastic_round": _bool},
        defaults={"block_size": 256, "bf16_stochastic_round": False},
    ),
    "sgd": HFOptim(
        "torch.optim:SGD",
        {"fused": None},
        optim_args={"momentum": float, "dampening": float, "weight_decay": float, "nesterov": _bool},
    ),
    "adagrad": HFOptim("torch.optim:Adagrad", {"fused": None}, optim_args={"lr_decay": float, "weight_decay": float, "eps": float}),
    "rmsprop": HFOptim(
        "torch.optim:RMSprop",
        optim_args={"momentum": float, "alpha": float, "eps": float, "weight_decay": float, "centered": _bool},
    ),
    "adamw_bnb_8bit": _bnb("AdamW", 8, False),
    "adamw_8bit": _bnb("AdamW", 8, False),
    "paged_adamw_32bit": _bnb("AdamW", 32, True),
    "paged_adamw_8bit": _bnb("AdamW", 8, True),
    "ademamix": HFOptim("bitsandbytes.optim:AdEMAMix", {"optim_bits": 32, "is_paged": False}),
    "ademamix_8bit": HFOptim("bitsandbytes.optim:AdEMAMix", {"optim_bits": 8, "is_paged": False}),
    "paged_ademamix_32bit": HFOptim("bitsandbytes.optim:AdEMAMix", {"optim_bits": 32, "is_paged": True}),
    "paged_ademamix_8bit": HFOptim("bitsandbytes.optim:AdEMAMix", {"optim_bits": 8, "is_paged": True}),
    "lion_32bit": _bnb("Lion", 32, False),
    "lion_8bit": _bnb("Lion", 8, False),
    "paged_lion_32bit": _bnb("Lion", 32, True),
    "paged_lion_8bit": _bnb("Lion", 8, True),
    "rmsprop_bnb": HFOptim(
        "bitsandbytes.optim:RMSprop", {"optim_bits": 32}, optim_args={"alpha": float, "eps": float, "momentum": float}
    ),
    "rmsprop_bnb_8bit": HFOptim(
        "bitsandbytes.optim:RMSprop", {"optim_bits": 8}, optim_args={"alpha": float, "eps": float, "momentum": float}
    ),
    "rmsprop_bnb_32bit": HFOptim(
        "bitsandbytes.optim:RMSprop", {"optim_bits": 32}, optim_args={"alpha": float, "eps": float, "momentum": float}
    ),
    **{name: HFOptim(f"galore_torch:{cls}", note=_GALORE_NOTE) for name, (cls, _, _) in _GALORE.items()},
    **dict.fromkeys(("galore_adamw_layerwise", "galore_adamw_8bit_layerwise", "galore_adafactor_layerwise"),
                    HFOptim(None, note=_LAYERWISE)),
    **{name: HFOptim(None, note=_NOT_BY_CONFIG) for name in ("apollo_adamw", "apollo_adamw_layerwise", "lomo", "adalomo")},
    "grokadamw": HFOptim(
        "grokadamw:GrokAdamW",
        optim_args={
            "alpha_init": float,
            "lamb": float,
            "gamma": float,
            "grokking_signal_decay_rate": float,
            "gradient_clipping": float,
        },
        defaults={"alpha_init": 0.98, "lamb": 2.0, "gamma": 0.1, "grokking_signal_decay_rate": 0.1, "gradient_clipping": 1.0},
    ),
    "schedule_free_radam": HFOptim(
        "schedulefree:RAdamScheduleFree",
        adam=True,
        optim_args={"weight_lr_power": float, "r": float},
        defaults={"weight_lr_power": 2.0, "r": 0.0},
        weight_decay_kwarg=True,
    ),
    "schedule_free_adamw": HFOptim(
        "schedulefree:AdamWScheduleFree",
        adam=True,
        optim_args={"weight_lr_power": float, "r": float},
        defaults={"weight_lr_power": 2.0, "r": 0.0},
        weight_decay_kwarg=True,
        note="warmup_steps from TrainingArguments.warmup_steps",
    ),
    "schedule_free_sgd": HFOptim(
        "schedulefree:SGDScheduleFree",
        optim_args={"weight_lr_power": float, "r": float},
        defaults={"weight_lr_power": 2.0, "r": 0.0},
        weight_decay_kwarg=True,
        note="warmup_steps from TrainingArguments.warmup_steps",
    ),
    "stable_adamw": HFOptim(
        "optimi:StableAdamW",
        adam=True,
        # transformers reads decouple_lr/kahan_sum with bool(str): any non-empty value is True
        optim_args={"decouple_lr": bool, "max_lr": float, "kahan_sum": bool},
        defaults={"decouple_lr": False, "max_lr": None, "kahan_sum": None},
        weight_decay_kwarg=True,
    ),
}


def config_from_training_args(args: Any, model: torch.nn.Module | None = None) -> dict[str, Any]:
    """The optcore optimizer config that builds what the Trainer would build
    from ``args`` (``optim``, ``optim_args``, ``learning_rate``,
    ``weight_decay``, ``adam_*``), with the Trainer's param groups (optcore's
    no-decay group); GaLore's names need ``model`` (:func:`galore_config`).
    Raises :class:`~optcore.ConfigError` for the few ``optim`` values that a
    config cannot express (layer-wise GaLore, APOLLO, LOMO)."""
    name = str(getattr(args.optim, "value", args.optim))
    row = OPTIM_TABLE.get(name)
    if row is None:
        raise ConfigError(f"unknown TrainingArguments.optim {name!r}; known: {', '.join(sorted(OPTIM_TABLE))}")
    if name in _GALORE:
        if model is None:
            raise ConfigError(f"TrainingArguments.optim={name!r} {row.note}; pass model=.", problems=[("optim", name)])
        return galore_config(args, model)
    if row.type is None:
        raise ConfigError(f"TrainingArguments.optim={name!r} {row.note}", problems=[("optim", name)])
    config: dict[str, Any] = {"type": row.type, "lr": args.learning_rate, **row.fixed}
    if row.adam:
        config["betas"] = (args.adam_beta1, args.adam_beta2)
        config["eps"] = args.adam_epsilon
    elif row.betas:
        config["betas"] = (args.adam_beta1, args.adam_beta2)
    if name.startswith(("ademamix", "paged_ademamix")):
        config.update(_ademamix(args))
    given = _parse_optim_args(getattr(args, "optim_args", None))
    config.update(row.defaults)
    for key, convert in row.optim_args.items():
        if key in given:
            config[key] = convert(given[key])
    if name.startswith("schedule_free") and name != "schedule_free_radam":
        config["warmup_steps"] = args.warmup_steps
    if args.weight_decay or row.weight_decay_kwarg:  # the decay group's value; optcore zeroes the no-decay group
        config["weight_decay"] = args.weight_decay
    return config


def galore_config(args: Any, model: torch.nn.Module) -> dict[str, Any]:
    """The optcore config that builds what the Trainer builds for
    ``optim="galore_adamw" | "galore_adamw_8bit" | "galore_adafactor"``: the
    ``nn.Linear`` weights ``optim_target_modules`` names (a list of names or
    substrings, a regex, or ``"all-linear"``, matched as the Trainer matches
    them) go to GaLore with ``optim_args``' ``rank``, ``update_proj_gap``,
    ``scale`` and ``proj_type``; every other parameter to galore_torch's own
    class without a projection, as the Trainer's second param group is. Only
    ``learning_rate`` applies (the Trainer passes no betas, eps or weight decay
    to GaLore), so the numbers are the Trainer's, bit for bit. The ``_layerwise``
    names are refused: add ``"step_in_backward": true`` to this config instead."""
    name = str(getattr(args.optim, "value", args.optim))
    if name not in _GALORE:
        note = _LAYERWISE if name.endswith("_layerwise") and name.startswith("galore") else "is not a GaLore optim"
        raise ConfigError(f"TrainingArguments.optim={name!r} {note}.", problems=[("optim", name)])
    from transformers.trainer_utils import check_target_module_exists

    targets = args.optim_target_modules
    if not isinstance(targets, (list, str)) or not targets:
        raise ConfigError(
            f"optim={name!r} needs optim_target_modules: the modules whose nn.Linear weights GaLore projects (a list "
            "of names, a regex, or 'all-linear').",
            problems=[("optim_target_modules", "missing")],
        )
    all_linear = isinstance(targets, str) and targets.replace("_", "-") == "all-linear"
    names = [f"{module_name}.weight" for module_name, module in model.named_modules() if isinstance(module, torch.nn.Linear)
             and (all_linear or check_target_module_exists(targets, module_name))]  # fmt: skip
    in_model = {n for n, _ in model.named_parameters()}
    names = [n for n in names if n in in_model]  # a weight tied to another name is stepped under that one
    if not names:
        raise ConfigError(
            f"optim_target_modules={targets!r} names no nn.Linear of the model (GaLore projects only their weights).",
            problems=[("optim_target_modules", "matches no nn.Linear")],
        )
    given = _parse_optim_args(getattr(args, "optim_args", None))
    unknown = sorted(set(given) - {"rank", "update_proj_gap", "scale", "proj_type"})
    if unknown:
        raise ConfigError(
            f"optim_args {unknown} are not GaLore's settings (rank, update_proj_gap, scale, proj_type); the Trainer "
            "would ignore them. Drop them.",
            problems=[(k, "not a GaLore setting") for k in unknown],
        )
    projection = {"rank": int(given.get("rank", 128)), "update_proj_gap": int(given.get("update_proj_gap", 200)),
                  "scale": float(given.get("scale", 0.25)), "proj_type": given.get("proj_type", "std")}  # fmt: skip
    galore, plain, fixed = _GALORE[name]
    pattern = "^(?:" + "|".join(re.escape(n) for n in names) + ")$"
    return {
        "type": plain, "lr": args.learning_rate, **fixed, "no_decay": False,
        "param_groups": [
            {"params": pattern, "optimizer": {"type": galore, "lr": args.learning_rate, **fixed, **projection}},
        ],
    }


def _ademamix(args: Any) -> dict[str, Any]:
    given = _parse_optim_args(getattr(args, "optim_args", None))
    out: dict[str, Any] = {
        "betas": (
            float(given.get("beta1", args.adam_beta1)),
            float(given.get("beta2", args.adam_beta2)),
            float(given.get("beta3", 0.9999)),
        ),
        "alpha": float(given.get("alpha", 5.0)),
        "eps": float(given.get("eps", args.adam_epsilon)),
    }
    for key in ("t_alpha", "t_beta3"):
        if key in given:
            out[key] = int(given[key])
    return out


def _parse_optim_args(text: str | None) -> dict[str, str]:
    """``"a=1, b=x"`` -> ``{"a": "1", "b": "x"}`` (strings, as the Trainer reads them)."""
    out: dict[str, str] = {}
    for item in (text or "").replace(" ", "").split(","):
        if item:
            key, sep, value = item.partition("=")
            if not sep:
                raise ConfigError(f"optim_args entry {item!r} is not key=value")
            out[key] = value
    return out

"""The default line-up, and compare entries from names or a compare file.

An entry is ``{"name": label, "optimizer": {...}, "lr_scheduler": {...}?}``.
A plain name means what :func:`optcore.resolve` says, here as everywhere
(``build_optimizer``, ``optcore show``, ``optcore check``); the line-up itself
names qualified implementations (``optcore-lion:Lion``) so that it is the same
on every machine where they are installed.
"""

from __future__ import annotations

import copy
import re
import warnings
from collections.abc import Mapping
from typing import Any

from optcore import ConfigError, OptcoreError, resolve

from .._config import to_plain, typed_config

#: The default line-up: label, implementations in order of preference (the first
#: installed one is used), hyper-parameters. Learning rates were picked on a 3x grid
#: (1e-3, 3e-3, 1e-2, 3e-2, ...) by held-out loss on the char-lm task at 300 steps,
#: seed 0; Prodigy keeps its authors' rule lr=1. Adafactor uses a fixed lr (relative
#: step off): its relative-step default reached 2.41 where lr=1e-2 reached 2.18.
DEFAULTS: tuple[tuple[str, tuple[str, ...], dict[str, Any]], ...] = (
    ("AdamW", ("torch:AdamW",), {"lr": 1e-2, "weight_decay": 0.01}),
    ("Adam", ("torch:Adam",), {"lr": 1e-2}),
    ("NAdam", ("torch:NAdam",), {"lr": 1e-2}),
    ("SGD", ("torch:SGD",), {"lr": 0.3, "momentum": 0.9, "nesterov": True}),
    ("RMSprop", ("torch:RMSprop",), {"lr": 3e-3}),
    ("Adagrad", ("torch:Adagrad",), {"lr": 3e-2}),
    ("Lion", ("optcore-lion:Lion", "lion_pytorch:Lion"), {"lr": 3e-3, "weight_decay": 0.1}),
    ("Adafactor", ("optcore-adafactor:Adafactor", "torch:Adafactor"),
     {"lr": 1e-2, "relative_step": False, "scale_parameter": False}),
    ("Prodigy", ("pytorch_optimizer:Prodigy",), {"lr": 1.0}),
    ("ScheduleFreeAdamW", ("pytorch_optimizer:ScheduleFreeAdamW",), {"lr": 1e-2}),
    # A composite: Muon on the hidden matrices, AdamW on the rest (torch >= 2.9). match_rms_adamw puts
    # Muon's updates at AdamW's RMS, so AdamW's pick serves both halves (not swept on its own).
    ("Muon+AdamW", ("torch:Muon",),
     {"lr": 1e-2, "adjust_lr_fn": "match_rms_adamw", "fallback": {"type": "torch:AdamW", "weight_decay": 0.01}}),
)  # fmt: skip


def _key(name: str) -> str:
    """``"optcore-lion:Lion"``, ``"lion_pytorch.Lion"`` and ``"lion"`` -> ``"lion"``."""
    return re.sub(r"[-_]", "", re.split(r"[:.]", name)[-1]).lower()


def _quiet_resolve(name: str) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # shadowing is reported when the config is built
        return resolve(name)


def _fitting(hparams: Mapping[str, Any], spec: Any) -> dict[str, Any]:
    """``hparams`` when ``spec``'s schema takes them all, else nothing (library defaults)."""
    return dict(hparams) if set(hparams) - {"fallback"} <= set(spec.schema.model_fields) else {}


def default_entries() -> list[dict[str, Any]]:
    """The default line-up, restricted to what is installed."""
    entries = []
    for label, candidates, hparams in DEFAULTS:
        for name in candidates:
            try:
                spec = _quiet_resolve(name)
            except OptcoreError:
                continue
            entries.append({"name": label, "optimizer": {"type": name, **_fitting(hparams, spec)}})
            break
    return entries


def entries_from_names(names: str) -> list[dict[str, Any]]:
    """``"Lion,AdamW,torch:SGD"`` -> one entry per name, each building exactly
    what ``build_optimizer({"type": name})`` builds. The line-up's
    hyper-parameters are added when the resolved class is in the line-up and its
    schema takes them; library defaults otherwise. A name that does not resolve
    is kept: its build fails and is reported in the table."""
    entries = []
    for name in (n.strip() for n in names.split(",")):
        if not name:
            continue
        hparams: dict[str, Any] = {}
        try:
            spec = _quiet_resolve(name)
        except OptcoreError:
            spec = None
        if spec is not None:
            for label, _, line_up in DEFAULTS:
                if _key(label) == _key(spec.name):
                    hparams = _fitting(line_up, spec)
                    break
        entries.append({"name": name, "optimizer": {"type": name, **hparams}})
    return entries


def built_name(optimizer_cfg: Any) -> str | None:
    """The qualified name ``optimizer_cfg`` builds (``lion_pytorch:Lion`` for
    ``Lion``), shown in the table; ``None`` when it does not resolve."""
    try:
        cfg = typed_config(optimizer_cfg)
        spec = _quiet_resolve(cfg["type"])
        if spec.is_wrapper and cfg.get("optimizer") is not None:
            return f"{spec.qualified}({built_name(cfg['optimizer'])})"
        return str(spec.qualified)
    except Exception:  # noqa: BLE001 - the build reports a bad config with its own message
        return None


def entries_from_file(data: Any) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """A compare file: a list of configs, or ``{"configs": [...], "num_training_steps": N,
    "seed": S}``. Each config is ``{"name": ..., "optimizer": {...}, "lr_scheduler": {...}}``
    or a bare optimizer config ``{"type": ..., ...}``. Returns the entries and the
    file's run settings."""
    options: dict[str, Any] = {}
    if isinstance(data, Mapping) and "configs" in data:
        options = {k: v for k, v in data.items() if k != "configs"}
        unknown = sorted(set(options) - {"num_training_steps", "seed"})
        if unknown:
            raise ConfigError(
                f"Unknown keys {unknown} at the top of the compare file; accepted: configs, num_training_steps, seed.",
                problems=[(k, "unknown") for k in unknown],
                accepted=["configs", "num_training_steps", "seed"],
            )
        data = data["configs"]
    if not isinstance(data, list) or not data:
        raise ConfigError(
            "A compare file is a non-empty list of configs (or a mapping with a 'configs' list), e.g.\n"
            "- {name: AdamW, optimizer: {type: AdamW, lr: 3e-3}}\n- {type: Lion, lr: 3e-4}",
            problems=[("configs", "not a non-empty list")],
        )
    return [normalise_entry(raw, i) for i, raw in enumerate(data)], options


def normalise_entry(raw: Any, index: int = 0) -> dict[str, Any]:
    """``{"name", "optimizer", "lr_scheduler"?}`` from any accepted form of one config."""
    plain = to_plain(raw)
    if isinstance(plain, str):
        plain = {"type": plain}
    if not isinstance(plain, Mapping):
        raise ConfigError(f"Config #{index + 1} must be a mapping, got {plain!r}.", problems=[(f"#{index + 1}", "bad")])
    plain = dict(plain)
    name = plain.pop("name", None)
    if "num_training_steps" in plain:
        raise ConfigError(
            f"Config #{index + 1} sets num_training_steps: every config of a comparison runs the same number of "
            "steps; set it once at the top of the file (or pass --steps).",
            problems=[("num_training_steps", "per-config")],
        )
    if "optimizer" in plain and "type" not in plain:
        entry = {"optimizer": plain.pop("optimizer")}
        for key in ("lr_scheduler", "scheduler"):
            if key in plain:
                entry["lr_scheduler"] = plain.pop(key)
        if plain:
            raise ConfigError(
                f"Config #{index + 1} has unknown keys {sorted(plain)}; accepted: name, optimizer, lr_scheduler.",
                problems=[(k, "unknown") for k in plain],
                accepted=["name", "optimizer", "lr_scheduler"],
            )
    else:
        entry = {"optimizer": plain}
    if name is None:
        opt = entry["optimizer"]
        name = opt.get("type", f"config {index + 1}") if isinstance(opt, Mapping) else str(opt)
    return {"name": str(name), **entry}


def unique_names(entries: list[dict[str, Any]]) -> None:
    """``AdamW``, ``AdamW #2``, ...: every row and curve has its own label."""
    seen: dict[str, int] = {}
    for entry in entries:
        count = seen[entry["name"]] = seen.get(entry["name"], 0) + 1
        if count > 1:
            entry["name"] = f"{entry['name']} #{count}"


# ------------------------------------------------------------ learning rates
def _lr_holder(optimizer_cfg: dict[str, Any]) -> dict[str, Any]:
    """The mapping whose ``lr`` is the learning rate: a wrapper's inner config."""
    inner = optimizer_cfg.get("optimizer")
    return _lr_holder(inner) if isinstance(inner, dict) and "lr" not in optimizer_cfg else optimizer_cfg


def base_lr(entry: Mapping[str, Any]) -> float | None:
    """The entry's learning rate, else its optimizer's documented default; ``None``
    when it has neither (an lr sweep then skips it, saying so)."""
    try:
        cfg = typed_config(entry["optimizer"])
        holder = _lr_holder(cfg)
        if holder.get("lr") is not None:
            return float(holder["lr"])
        field = _quiet_resolve(holder["type"]).schema.model_fields.get("lr")
        default = None if field is None or field.is_required() else field.default
        return float(default) if isinstance(default, (int, float)) and default > 0 else None
    except Exception:  # noqa: BLE001 - the build reports a bad config with its own message
        return None


def with_lr(entry: Mapping[str, Any], lr: float) -> dict[str, Any]:
    """A copy of ``entry`` whose optimizer runs at ``lr``."""
    cfg = copy.deepcopy(typed_config(entry["optimizer"]))
    _lr_holder(cfg)["lr"] = lr
    return {**entry, "optimizer": cfg}

"""The default line-up (:data:`.defaults.DEFAULTS`, re-exported here), and compare
entries from names or a compare file.

An entry is ``{"name": label, "optimizer": {...}, "lr_scheduler": {...}?}``.
A plain name means what :func:`optcore.resolve` says, here as everywhere
(``build_optimizer``, ``optcore show``, ``optcore check``); the line-up itself
names qualified implementations (``optcore-lion:Lion``) so that it is the same
on every machine where they are installed.
"""

from __future__ import annotations

import copy
import math
import re
import warnings
from collections.abc import Mapping
from typing import Any

from optcore import ConfigError, OptcoreError, resolve

from .._config import to_plain, typed_config
from .defaults import DEFAULTS



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
    for label, candidates, hparams, _ in DEFAULTS:
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
    schema takes them; library defaults otherwise. A line-up composite's label
    (``Muon+AdamW``) is that entry. A name that does not resolve is kept: its
    build fails and is reported in the table."""
    entries = []
    for name in (n.strip() for n in names.split(",")):
        if not name:
            continue
        hparams: dict[str, Any] = {}
        try:
            spec = _quiet_resolve(name)
        except OptcoreError:
            spec = None
            composite = next((e for e in default_entries() if e["name"] == name and "fallback" in e["optimizer"]), None)
            if composite is not None:  # a line-up composite by its label ("Muon+AdamW"): no class has that name
                entries.append(copy.deepcopy(composite))
                continue
        if spec is not None:
            for label, _, line_up, _ in DEFAULTS:
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
    space = plain.pop("search_space", None)
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
                f"Config #{index + 1} has unknown keys {sorted(plain)}; accepted: name, optimizer, lr_scheduler, "
                "search_space.",
                problems=[(k, "unknown") for k in plain],
                accepted=["name", "optimizer", "lr_scheduler", "search_space"],
            )
    else:
        entry = {"optimizer": plain}
    if name is None:
        opt = entry["optimizer"]
        name = opt.get("type", f"config {index + 1}") if isinstance(opt, Mapping) else str(opt)
    if space is not None:
        entry["search_space"] = parse_space(space, f"search_space of config #{index + 1}")
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


# ------------------------------------------------------------ search spaces
#: What each search-space name sets in a config, for ``--trials``. ``warmup`` is a
#: fraction of the run: a linear warm-up of that many steps (added as
#: ``constant_with_warmup`` when the entry has no scheduler of its own).
SPACE_DIMS: dict[str, str] = {
    "lr": "the learning rate (a wrapper's inner optimizer's)",
    "weight_decay": "weight_decay",
    "beta1": "betas[0]",
    "beta2": "betas[1]",
    "momentum": "momentum",
    "warmup": "a fraction of the steps spent warming the lr up linearly",
}
#: The schema field a name needs (``None``: any optimizer takes it).
_NEEDS = {"lr": None, "weight_decay": "weight_decay", "beta1": "betas", "beta2": "betas", "momentum": "momentum",
          "warmup": None}  # fmt: skip
#: An entry with neither a line-up space nor one of its own tunes its lr over this
#: factor either side of its own lr (log scale).
LR_SPAN = 30.0


def _space_error(where: str, text: str, name: str = "search_space") -> ConfigError:
    return ConfigError(f"{where}: {text}", problems=[(name, text)], accepted=sorted(SPACE_DIMS))


def parse_space(raw: Any, where: str = "search_space") -> dict[str, dict[str, Any]]:
    """``{lr: [1e-4, 1e-2], weight_decay: {low: 0, high: 0.1}}`` -> ``{name: {low, high, log}}``.

    A dimension is ``[low, high]``, ``[low, high, "log"]`` or ``{low, high, log}``;
    ``lr`` is on a log scale unless it says ``log: false``, the others linear unless
    they say ``log: true`` (a log scale needs ``low > 0``)."""
    plain = to_plain(raw)
    if not isinstance(plain, Mapping):
        raise _space_error(where, f"a search space maps names to ranges, e.g. {{lr: [1.0e-4, 1.0e-2]}}; got {plain!r}")
    space: dict[str, dict[str, Any]] = {}
    for name, dim in plain.items():
        if name not in SPACE_DIMS:
            raise _space_error(where, f"unknown search-space name {name!r}; accepted: {', '.join(SPACE_DIMS)}", name)
        log = name == "lr"
        if isinstance(dim, Mapping) and set(dim) <= {"low", "high", "log"} and {"low", "high"} <= set(dim):
            low, high, log = dim["low"], dim["high"], bool(dim.get("log", log))
        elif isinstance(dim, (list, tuple)) and len(dim) in (2, 3) and (len(dim) == 2 or dim[2] in ("log", "linear")):
            low, high = dim[0], dim[1]
            log = log if len(dim) == 2 else dim[2] == "log"
        else:
            raise _space_error(where, f"{name}: a range is [low, high], [low, high, log|linear] or {{low, high, log}}; "
                               f"got {dim!r}", name)  # fmt: skip
        try:
            low, high = float(low), float(high)
        except (TypeError, ValueError):
            raise _space_error(where, f"{name}: low and high must be numbers, got {dim!r}", name) from None
        if not (math.isfinite(low) and math.isfinite(high) and low < high) or (log and low <= 0):
            raise _space_error(where, f"{name}: needs finite low < high{' and low > 0 on a log scale' if log else ''}, "
                               f"got [{low:g}, {high:g}]", name)  # fmt: skip
        if name == "warmup" and not 0 <= low < high <= 1:
            raise _space_error(where, f"warmup is a fraction of the run in [0, 1], got [{low:g}, {high:g}]", name)
        space[name] = {"low": low, "high": high, "log": log}
    return space


def _holder_spec(entry: Mapping[str, Any]) -> Any:
    try:
        return _quiet_resolve(_lr_holder(typed_config(entry["optimizer"]))["type"])
    except Exception:  # noqa: BLE001 - the build reports a bad config with its own message
        return None


def _takes(spec: Any, name: str) -> bool:
    need = _NEEDS[name]
    return need is None or spec is None or need in spec.schema.model_fields


def search_space(entry: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """The space ``--trials`` draws ``entry``'s configs from: its own ``search_space``
    (a compare file's, checked against the optimizer's schema), else its line-up
    entry's (by label, else by class; names its optimizer does not take are
    dropped), else its lr times 1/30 to 30 on a log scale; ``{}`` when it has no lr
    (it is then compared at its defaults only)."""
    spec = _holder_spec(entry)
    if entry.get("search_space") is not None:
        space = parse_space(entry["search_space"], f"search_space of {entry.get('name')!r}")
        refused = [n for n in space if not _takes(spec, n)]
        if refused:
            raise ConfigError(
                f"search_space of {entry.get('name')!r}: {spec.qualified} has no "
                f"{', '.join(sorted({str(_NEEDS[n]) for n in refused}))} field for {', '.join(refused)}.",
                problems=[(n, "not a field of the optimizer") for n in refused],
            )
        return space
    keys = {_key(str(entry.get("name", "")))} | ({_key(spec.name)} if spec is not None else set())
    for label, _, _, space in DEFAULTS:
        if _key(label) in keys:
            return {n: {"low": lo, "high": hi, "log": log} for n, (lo, hi, log) in space.items() if _takes(spec, n)}
    lr = base_lr(entry)
    return {} if lr is None else {"lr": {"low": lr / LR_SPAN, "high": lr * LR_SPAN, "log": True}}


def runnable(entry: Mapping[str, Any]) -> dict[str, Any]:
    """``entry`` without its ``search_space``: what a run builds."""
    return {k: v for k, v in entry.items() if k != "search_space"}


def apply_point(entry: Mapping[str, Any], point: Mapping[str, float], steps: int) -> dict[str, Any]:
    """A copy of ``entry`` (without its search space) set to one point of its space."""
    cfg = copy.deepcopy(typed_config(entry["optimizer"]))
    holder = _lr_holder(cfg)
    out = {**runnable(entry), "optimizer": cfg}
    for name, value in point.items():
        if name in ("lr", "weight_decay", "momentum"):
            holder[name] = float(value)
        elif name in ("beta1", "beta2"):
            holder["betas"] = list(holder.get("betas") or _default_betas(holder["type"]))
            holder["betas"][name == "beta2"] = float(value)
        elif name == "warmup":
            warm = int(round(float(value) * steps))
            sched = out.get("lr_scheduler")
            if sched is None:
                out["lr_scheduler"] = {"type": "constant_with_warmup", "warmup_steps": warm}
            else:
                sched = {"type": sched} if isinstance(sched, str) else dict(to_plain(sched))
                key = next((k for k in ("warmup_steps", "num_warmup_steps", "warmup_updates") if k in sched),
                           "warmup_steps")  # fmt: skip
                out["lr_scheduler"] = {**sched, key: warm}
    return out


def _default_betas(name: str) -> tuple[float, float]:
    field = _quiet_resolve(name).schema.model_fields.get("betas")
    default = None if field is None or field.is_required() else field.default
    return tuple(default) if isinstance(default, (list, tuple)) and len(default) == 2 else (0.9, 0.999)  # type: ignore[return-value]

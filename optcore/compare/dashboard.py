"""What a sweep's studies show to Optuna's own tools (optuna-dashboard, ``study.trials_dataframe()``).

The sweep keeps what it runs and measures in two JSON records per trial
(user attributes ``optcore`` and ``result``, :mod:`.records`), which a
dashboard shows as one long string cut at 1,024 characters. So every trial also
carries the same facts under readable names, written by the worker that runs it
and never read back by optcore (the records stay the only input it trusts):

- params: ``optimizer`` (categorical over the study's configs) and each number
  the run's config sets (``lr``, ``weight_decay``, ``beta1``/``beta2`` for
  ``betas``, ``fallback.lr`` for a composite's fallback, ``lr_scheduler.warmup_steps``),
  so that the dashboard's parameter plots and its table show them;
- user attributes ``optimizer``, ``phase``, ``seed`` and ``optimizer config``
  from the start, and ``status``, ``best held-out loss``, ``steps per second``
  and ``error`` once the run ended;
- intermediate values: the learning curve, the training loss averaged over the
  last :data:`CURVE_WINDOW` steps (what ``--prune`` reports to the pruner), at
  up to :data:`CURVE_POINTS` steps of the run;
- the objective's name (``study.set_metric_names``): the final held-out loss
  that Optuna is told.
"""

from __future__ import annotations

import json
import math
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

from .._values import clean_text
from .lineup import _lr_holder, base_lr

#: Steps of a run whose loss becomes an intermediate value (the last step always does).
CURVE_POINTS = 50
#: Training losses averaged into one point of the curve (``--prune`` reports the same mean).
CURVE_WINDOW = 5
#: Numbers of one config shown as params; a config with more shows its first ones.
MAX_PARAMS = 64
#: The longest text shown in one user attribute (optuna-dashboard cuts JSON at 1,024 characters).
MAX_SHOWN = 1000


def objective_name(loss_label: str = "loss") -> str:
    """The name of the value Optuna is told: the run's last held-out evaluation."""
    return f"final held-out {clean_text(loss_label, 80)}"


def label_study(study: Any, meta: Mapping[str, Any]) -> None:
    """Name the study's objective, and say what its intermediate values are."""
    import optuna

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)  # set_metric_names is marked experimental
        study.set_metric_names([objective_name(meta.get("loss_label") or "loss")])
    steps = int(meta["steps"])
    every = "every step" if curve_every(steps) == 1 else f"every {curve_every(steps)} steps"
    study.set_user_attr("learning curve", f"intermediate values: the training loss, mean of the last {CURVE_WINDOW} "
                        f"steps, at {every} of {steps} and the last")  # fmt: skip


def trial_attrs(attrs: Mapping[str, Any]) -> dict[str, Any]:
    """The readable user attributes of a trial about to be enqueued (``attrs``: its ``optcore`` record)."""
    shown: dict[str, Any] = {"optimizer": attrs["config"], "phase": attrs["phase"], "seed": attrs["seed"]}
    entry = attrs.get("entry")
    if entry is not None:
        shown.update(config_attrs(entry))
    return shown


def config_attrs(entry: Mapping[str, Any]) -> dict[str, str]:
    """A run's optimizer (and scheduler) config as compact JSON text, within what a dashboard shows."""
    shown = {"optimizer config": _compact(entry.get("optimizer"))}
    if entry.get("lr_scheduler") is not None:
        shown["lr_scheduler config"] = _compact(entry["lr_scheduler"])
    return shown


def _compact(value: Any) -> str:
    return clean_text(json.dumps(value, separators=(", ", ": "), default=str), MAX_SHOWN)


def result_attrs(result: Mapping[str, Any]) -> dict[str, Any]:
    """The readable user attributes of a finished run (``result``: :func:`optcore.compare.train.empty_result`)."""
    shown: dict[str, Any] = {"status": result["status"]}
    for key, name in (("best", "best held-out loss"), ("best_step", "best at step"), ("steps_per_s", "steps per second")):
        if result.get(key) is not None:
            shown[name] = result[key]
    if result.get("error"):
        shown["error"] = clean_text(result["error"], MAX_SHOWN)
    return shown


def hyperparameters(entry: Mapping[str, Any]) -> dict[str, float]:
    """Every number the run's config sets, by a readable name: the keys of the
    optimizer that holds the lr as they are (``lr``, ``weight_decay``, ``betas``
    as ``beta1``/``beta2``, the search space's names), the others by their path
    (``fallback.lr``, ``lr_scheduler.warmup_steps``); the lr the optimizer takes
    by default where the config gives none."""
    config = entry.get("optimizer")
    out: dict[str, float] = {}
    if isinstance(config, Mapping):
        holder = _lr_holder(config)  # type: ignore[arg-type]
        _numbers(holder, "", out)
        if holder is not config:  # a wrapper's own numbers, by their path
            _numbers(config, "", out, skip=holder)
    lr = base_lr(entry) if "lr" not in out else None
    if lr is not None:
        out["lr"] = lr
    if isinstance(entry.get("lr_scheduler"), Mapping):
        _numbers(entry["lr_scheduler"], "lr_scheduler.", out)
    return dict(list(out.items())[:MAX_PARAMS])


def _numbers(config: Mapping[str, Any], prefix: str, out: dict[str, float], skip: Any = None) -> None:
    for key, value in config.items():
        name = f"{prefix}{key}"
        if value is skip:
            continue
        if isinstance(value, Mapping):
            _numbers(value, name + ".", out, skip)
        elif isinstance(value, (list, tuple)) and value and all(_number(v) for v in value):
            betas = key == "betas" and len(value) == 2  # as the search space names them
            labels = [f"{prefix}beta1", f"{prefix}beta2"] if betas else [f"{name}[{i}]" for i in range(len(value))]
            for label, item in zip(labels, value):
                _put(out, label, item)
        elif _number(value):
            _put(out, name, value)


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _put(out: dict[str, float], name: str, value: Any) -> None:
    if name != "optimizer" and name not in out:
        out[name] = float(value)


def params(entry: Mapping[str, Any], config: str, configs: Sequence[str], taken: Sequence[str] = ()) -> list[tuple[str, float, Any]]:
    """``(name, internal value, distribution)`` of every param a trial of config
    ``config`` shows (besides ``taken``, those it suggested): ``optimizer`` over
    ``configs`` (the same choices in every trial of a study, as Optuna requires)
    and each of :func:`hyperparameters` as a one-point float distribution."""
    from optuna.distributions import CategoricalDistribution, FloatDistribution

    choices = tuple(dict.fromkeys(configs))
    out = [("optimizer", float(choices.index(config)), CategoricalDistribution(choices))] if config in choices else []
    for name, value in hyperparameters(entry).items():
        if name not in taken:
            out.append((name, value, FloatDistribution(value, value)))
    return out


def curve_every(steps: int) -> int:
    """How many steps apart the points of a run of ``steps`` steps' learning curve are."""
    return max(1, steps // CURVE_POINTS)


def curve(losses: Sequence[float | None], steps: int | None = None) -> list[tuple[int, float]]:
    """``(step, loss)`` points of a run's learning curve: every :func:`curve_every`-th step of
    ``steps`` (the planned ones) and the last one run, each the mean of the finite training
    losses of the last :data:`CURVE_WINDOW` steps up to it (``losses[i]`` is step ``i + 1``'s);
    a point without one is left out."""
    ran = len(losses)
    every = curve_every(steps or ran)
    points = []
    for step in sorted({*range(every, ran + 1, every), ran} - {0}):
        window = [v for v in losses[max(0, step - CURVE_WINDOW):step] if v is not None and math.isfinite(v)]
        if window:
            points.append((step, sum(window) / len(window)))
    return points

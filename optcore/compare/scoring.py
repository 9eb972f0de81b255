"""Time to target, targets, performance profiles and the AlgoPerf-style score.

A final loss says where an optimizer ended; it does not say how soon it got
somewhere useful. MLCommons AlgoPerf (Dahl et al., 2023, "Benchmarking Neural
Network Training Algorithms") scores training algorithms the other way round:

1. every task has a **target** held-out loss (given, or set from the runs as
   the loss that three in four configs reach: :func:`reference_target`);
2. a run's score on a task is its **time to target**: the steps (and training
   seconds) until its held-out loss first reaches the target, or a **miss**
   (:func:`time_to_target`);
3. over many problems (tasks, seeds), an optimizer's **performance profile**
   rho(tau) is the fraction of problems it solves within tau times the fastest
   optimizer's time (Dolan and Moré, 2002; :func:`performance_profile`);
4. the **score** is the area under the profile from tau = 1 to 4, divided by 3:
   1.0 is "fastest on every problem", 0.0 is "never within 4x of the fastest"
   (:func:`profile_score`).

These functions are pure (plain numbers in, plain numbers out) so the compare
command, a report rebuilt from stored trials and the tests share them;
:func:`summarise` is the one entry point that takes run results as the compare
command stores them. Nothing here imports torch, numpy or matplotlib.
"""

from __future__ import annotations

import math
import re
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from optcore import ConfigError

#: AlgoPerf integrates the profile up to a time ratio of 4: an optimizer that
#: needs more than 4x the fastest one's time on a problem earns nothing there.
MAX_TAU = 4.0


@dataclass(frozen=True)
class Reach:
    """When one run first reached a target: ``steps`` and ``seconds`` are None for a miss
    (``seconds`` is also None where the run recorded no times)."""

    target: float
    steps: int | None
    seconds: float | None

    @property
    def reached(self) -> bool:
        return self.steps is not None


def time_to_target(
    steps: Sequence[int], losses: Sequence[float | None], target: float, seconds: Sequence[float] | None = None
) -> Reach:
    """The first evaluation at which ``losses`` is at or below ``target``.

    ``steps[i]``, ``losses[i]`` and ``seconds[i]`` describe evaluation ``i``: the
    training steps taken, the held-out loss (None where it was not finite: a
    diverged run never reaches anything afterwards) and the training seconds
    spent before it (evaluation time excluded, as AlgoPerf excludes it). A run is
    only known to have reached the target at an evaluation, so the times have
    the resolution of the evaluation interval; between evaluations nothing is
    interpolated."""
    if len(steps) != len(losses) or (seconds is not None and len(seconds) != len(steps)):
        raise ValueError(
            f"time_to_target needs one step and one loss{' and one time' if seconds is not None else ''} per "
            f"evaluation, got {len(steps)} steps, {len(losses)} losses"
            + (f", {len(seconds)} times" if seconds is not None else "")
        )
    if any(b < a for a, b in zip(steps, steps[1:])):
        raise ValueError(f"time_to_target needs evaluations in step order, got steps {list(steps)}")
    for i, loss in enumerate(losses):
        if loss is not None and math.isfinite(loss) and loss <= target:
            return Reach(target, int(steps[i]), None if seconds is None else float(seconds[i]))
    return Reach(target, None, None)


#: The share of the configs that a target set from the runs is meant for: 3 in 4.
REACH_SHARE = 0.75


def reference_target(
    best_losses: Mapping[str, Sequence[float | None]], share: float = REACH_SHARE
) -> tuple[float, str] | None:
    """The target set from the runs, and the config whose runs set it.

    ``best_losses[name]`` holds, for each run (seed) of config ``name``, the
    best held-out loss that run reached by training (None for a failed run:
    :func:`trained_best`). As AlgoPerf
    does with its reference runs, each config stands for the median over its
    runs of that best loss (a failed run counts as never reaching anything, so a
    config that failed on half of its seeds or more has none and neither sets
    nor loosens the target).

    AlgoPerf takes the best of those medians: its references are tuned
    baselines, not the algorithms it scores, and its time budget is then set so
    that they reach the target well within it. Here the configs compared are the
    references, within one step budget, so the best median is reached only by
    the config that set it, at its last evaluations, and every other one misses
    it. The target is therefore the k-th lowest median, k = ceil(``share`` x
    the configs with one), at least 1: with ``share`` 0.75, three in four of
    the configs that trained reach it, and the times at which they do so are
    what separates them. ``share`` 0 gives AlgoPerf's best median. Ties rank by
    name. None when no config has a finite median."""
    if not 0.0 <= share <= 1.0:
        raise ValueError(f"share is the fraction of configs that reach the target, in [0, 1], got {share}")
    medians = {
        name: statistics.median([math.inf if v is None or not math.isfinite(v) else float(v) for v in values])
        for name, values in best_losses.items()
        if values
    }
    ranked = sorted((m, name) for name, m in medians.items() if math.isfinite(m))
    if not ranked:
        return None
    k = max(1, math.ceil(share * len(ranked) - 1e-9))  # 1e-9: 0.7 x 10 is 7.000000000000001 in floats
    loss, name = ranked[k - 1]
    return loss, name


def _aligned(times: Mapping[str, Sequence[float]]) -> int:
    lengths = {len(v) for v in times.values()}
    if len(lengths) > 1:
        counts = {name: len(values) for name, values in times.items()}
        raise ValueError(f"every optimizer needs one time per problem, got {counts}")
    for name, values in times.items():
        if any(math.isnan(t) or t < 0 for t in values):
            raise ValueError(f"times to target are >= 0 or inf (a miss), got {list(values)} for {name}")
    return lengths.pop() if lengths else 0


def profile_ratios(times: Mapping[str, Sequence[float]]) -> dict[str, list[float]]:
    """Each optimizer's time on each problem divided by the fastest time on it.

    ``times[name][p]`` is the time to target of optimizer ``name`` on problem
    ``p`` (math.inf for a miss). A miss is inf; a problem no optimizer solved is
    a miss for all; a problem solved at time 0 (the target is met before
    training) gives 1 to every optimizer at 0."""
    n = _aligned(times)
    ratios: dict[str, list[float]] = {name: [] for name in times}
    for p in range(n):
        fastest = min(values[p] for values in times.values())
        for name, values in times.items():
            t = values[p]
            if math.isinf(t):
                ratios[name].append(math.inf)
            elif fastest == 0:
                ratios[name].append(1.0 if t == 0 else math.inf)
            else:
                ratios[name].append(t / fastest)
    return ratios


def performance_profile(times: Mapping[str, Sequence[float]], taus: Sequence[float]) -> dict[str, list[float]]:
    """rho(tau) per optimizer: the fraction of problems it solved within ``tau`` times the fastest.

    The denominator is every problem, solved or not (AlgoPerf divides by the
    number of workloads), so the profile of an optimizer that misses a problem
    never reaches 1."""
    ratios = profile_ratios(times)
    return {
        name: [sum(r <= tau for r in rs) / len(rs) if rs else 0.0 for tau in taus] for name, rs in ratios.items()
    }


def profile_score(times: Mapping[str, Sequence[float]], max_tau: float = MAX_TAU) -> dict[str, float]:
    """The area under each performance profile from tau = 1 to ``max_tau``, divided by ``max_tau - 1``.

    rho is a step function, so the area is exact: a problem solved at ratio
    ``r <= max_tau`` adds ``(max_tau - r) / (max_tau - 1)`` divided by the number of
    problems, a slower one or a miss adds nothing. (AlgoPerf's code evaluates
    rho at 100 evenly spaced taus and integrates with the trapezoid rule, which
    differs from the exact area by less than one grid step, 3/99, per problem.)"""
    if not max_tau > 1:
        raise ValueError(f"max_tau must be above 1, got {max_tau}")
    ratios = profile_ratios(times)
    return {
        name: (sum(max(0.0, max_tau - r) for r in rs) / ((max_tau - 1) * len(rs)) if rs else 0.0)
        for name, rs in ratios.items()
    }


# ------------------------------------------------------------------ targets from the command line
def parse_targets(text: str, tasks: Sequence[str]) -> dict[str, float]:
    """``--target``: ``"2.1"`` (every task) or ``"char-lm=2.1,vision=0.4"`` (per task) -> {task: loss}."""
    pairs: dict[str, float] = {}
    parts = [p.strip() for p in text.split(",") if p.strip()]
    if not parts:
        raise ConfigError("--target named no loss; e.g. --target 2.1 or --target char-lm=2.1,vision=0.4.",
                          problems=[("target", "empty")])  # fmt: skip
    for part in parts:
        m = re.fullmatch(r"(?:(.+?)=)?\s*([-+0-9.eE]+|inf)", part)
        try:
            value = float(m[2]) if m else math.nan
        except ValueError:
            value = math.nan
        if m is None or not math.isfinite(value):
            raise ConfigError(f"--target takes a loss like 2.1 or TASK=LOSS pairs, got {part!r}.",
                              problems=[("target", part)])  # fmt: skip
        task = m[1].strip() if m[1] else None
        if task is None:
            if len(parts) > 1:
                raise ConfigError(f"--target {text!r}: give one loss for every task, or TASK=LOSS for each.",
                                  problems=[("target", text)])  # fmt: skip
            return {t: value for t in tasks}
        if task not in tasks:
            raise ConfigError(f"--target names task {task!r}, which is not compared here ({', '.join(tasks)}).",
                              problems=[("target", task)])  # fmt: skip
        pairs[task] = value
    return pairs


# ------------------------------------------------------------------ the entry point for stored runs
def _curve(run: Mapping[str, Any]) -> tuple[list[int], list[float | None], list[float] | None]:
    points = run.get("val_losses") or []
    steps = [int(s) for s, _ in points]
    losses = [v for _, v in points]
    seconds = run.get("eval_seconds")
    return steps, losses, (list(seconds) if seconds is not None and len(seconds) == len(points) else None)


def trained_best(run: Mapping[str, Any]) -> float | None:
    """The best held-out loss a run reached by training, as a target is set from it:
    the lowest finite loss at an evaluation after step 0. None (a failed run) where
    there is none, or where it is not below the run's loss before training: a run
    that diverged at its first steps, or never learned, would otherwise set a target
    at the untrained loss, which every run meets at step 0."""
    points = [(int(s), v) for s, v in run.get("val_losses") or [] if v is not None and math.isfinite(v)]
    later = [v for s, v in points if s > 0]
    if not later:
        return None
    start = [v for s, v in points if s == 0]
    best = min(later)
    return None if start and best >= start[0] else best


def summarise(
    runs_by_optimizer: Mapping[str, Sequence[Mapping[str, Any]]],
    target: float | Mapping[str, float] | None = None,
    reference: Sequence[str] | None = None,
    max_tau: float = MAX_TAU,
    share: float = REACH_SHARE,
) -> dict[str, Any]:
    """Targets, times to target, profiles and scores for a set of runs (a JSON-ready dict).

    ``runs_by_optimizer[name]`` are the runs that represent optimizer ``name``:
    for a tuned comparison, the runs of its chosen configuration (one per seed
    and task), never a run picked per seed, since that would tune the seed. A
    run is a mapping as the compare command stores it: ``val_losses``
    (``[[step, loss or None], ...]``), optionally ``eval_seconds`` (training
    seconds before each evaluation), ``seed`` and ``task``. A problem is a
    (task, seed) pair; where an optimizer has several runs of one problem, its
    fastest counts (AlgoPerf's best-trial rule), and where it has none, a miss.

    ``target``: one loss for every task, {task: loss}, or None; a task without
    one gets :func:`reference_target` over the ``reference`` optimizers (default:
    all of them), the loss that ``share`` of them reach; its entry in
    ``targets`` records that ``share``. Scores are by steps (reproducible: the same on any machine
    for the same runs) and by seconds (what a user waits for; only where every
    run recorded its times)."""
    problems = sorted({(str(r.get("task") or ""), r.get("seed")) for runs in runs_by_optimizer.values() for r in runs},
                      key=lambda p: (p[0], -1 if p[1] is None else p[1]))  # fmt: skip
    tasks = list(dict.fromkeys(task for task, _ in problems))
    given = {t: target for t in tasks} if isinstance(target, (int, float)) else dict(target or {})
    refs = list(reference) if reference else list(runs_by_optimizer)
    unknown = [name for name in refs if name not in runs_by_optimizer]
    if unknown:
        raise ConfigError(f"reference optimizer(s) {', '.join(unknown)} not among {', '.join(runs_by_optimizer)}.",
                          problems=[("reference", n) for n in unknown])  # fmt: skip
    targets: dict[str, dict[str, Any]] = {}
    for task in tasks:
        if task in given:
            targets[task] = {"loss": float(given[task]), "source": "given", "set_by": None}
            continue
        best = {name: [trained_best(r) for r in runs_by_optimizer[name] if str(r.get("task") or "") == task] for name in refs}
        found = reference_target(best, share)
        targets[task] = {"loss": None if found is None else found[0], "source": "reference",
                         "set_by": None if found is None else found[1], "share": share}  # fmt: skip

    reaches: dict[str, list[dict[str, Any]]] = {}
    for name, runs in runs_by_optimizer.items():
        rows = []
        for task, seed in problems:
            goal = targets[task]["loss"]
            mine = [r for r in runs if str(r.get("task") or "") == task and r.get("seed") == seed]
            found = [time_to_target(*_curve(r)[:2], goal, _curve(r)[2]) for r in mine] if goal is not None else []
            hit = [f for f in found if f.reached]
            fastest = min(hit, key=lambda f: (f.steps, f.seconds if f.seconds is not None else math.inf), default=None)
            rows.append({"task": task, "seed": seed, "ran": bool(mine),
                         "steps": None if fastest is None else fastest.steps,
                         "seconds": None if fastest is None else fastest.seconds})  # fmt: skip
        reaches[name] = rows

    def times(key: str) -> dict[str, list[float]]:
        return {name: [math.inf if r[key] is None else float(r[key]) for r in rows] for name, rows in reaches.items()}

    has_seconds = all(r["seconds"] is not None for rows in reaches.values() for r in rows if r["steps"] is not None)
    by_steps = profile_score(times("steps"), max_tau) if problems else {}
    by_seconds = profile_score(times("seconds"), max_tau) if problems and has_seconds else {}
    return {
        "max_tau": max_tau,
        "targets": targets,
        "problems": [{"task": t, "seed": s} for t, s in problems],
        "optimizers": {
            name: {
                "reached": sum(r["steps"] is not None for r in rows), "of": len(rows),
                "score_steps": by_steps.get(name), "score_seconds": by_seconds.get(name), "reach": rows,
            }  # fmt: skip
            for name, rows in reaches.items()
        },
    }


def profile_times(summary: Mapping[str, Any], by: str = "steps") -> dict[str, list[float]]:
    """The times to target in a :func:`summarise` result, ``by`` "steps" or "seconds" (inf: a miss),
    the input of :func:`performance_profile` for a plot."""
    return {
        name: [math.inf if r[by] is None else float(r[by]) for r in entry["reach"]]
        for name, entry in summary["optimizers"].items()
    }

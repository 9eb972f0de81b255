"""The tuned protocol's arithmetic: quasi-random points, the score of a study, the
chosen configuration, the unstable learning rates, and the table that shows them.

AlgoPerf's external-tuning rule, as ``optcore compare --trials K --studies S`` runs it:
every optimizer gets the same budget, K points drawn quasi-randomly (Optuna's
:class:`~optuna.samplers.QMCSampler`, scrambled Sobol or Halton, seeded) from its own
search space (:func:`optcore.compare.lineup.search_space`); S studies repeat the draw
with other seeds; the score of an optimizer is the median over studies of each
study's best trial. The seed of the runs is never tuned: the configuration behind
the score is run again on other seeds, and those runs are what the table ranks.

:func:`tuned_summary` is the seam for other rankings: it takes the finished trials
and returns one record per optimizer (its studies, score, chosen configuration,
re-seeded results and unstable region), which the table here, ``results.json`` and
any other score (time to target, performance profiles) read.
"""

from __future__ import annotations

import math
import statistics
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

#: ``--algoperf``: AlgoPerf's external-tuning defaults.
ALGOPERF_TRIALS = 5
ALGOPERF_STUDIES = 3
#: Re-seeds of the chosen configuration when ``--trials`` is given without ``--seeds``.
DEFAULT_RESEEDS = 3


def distributions(space: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """Optuna distributions of a search space (``{name: {low, high, log}}``)."""
    from optuna.distributions import FloatDistribution

    return {n: FloatDistribution(d["low"], d["high"], log=bool(d["log"])) for n, d in space.items()}


def draw_points(space: Mapping[str, Mapping[str, Any]], k: int, seed: int, qmc_type: str = "sobol") -> list[dict[str, float]]:
    """The first ``k`` points of Optuna's scrambled ``qmc_type`` sequence with ``seed``
    over ``space`` (to 4 significant digits): the same points on every machine for
    the same seed.

    They are drawn up front in a scratch study and enqueued, so that the K trials of
    a study are exactly the sampler's first K whoever runs them (QMCSampler keeps its
    position in a study attribute that concurrent workers may both read before
    either writes it)."""
    import optuna

    if not space or k < 1:
        return []
    dists = distributions(space)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # QMCSampler is marked experimental
        sampler = optuna.samplers.QMCSampler(qmc_type=qmc_type, scramble=True, seed=seed,
                                             warn_independent_sampling=False)  # fmt: skip
        scratch = optuna.create_study(sampler=sampler)
        # The sampler learns the space from a first trial, which it draws independently
        # (not part of the sequence); it stays running, so the next asks are relative.
        scratch.ask(dists)
        points = [scratch.ask(dists).params for _ in range(k)]
    return [{n: _round(v, space[n]) for n, v in p.items()} for p in points]


def _round(value: float, dim: Mapping[str, Any]) -> float:
    """4 significant digits (a config one can read and type), kept inside the range."""
    return min(max(float(f"{value:.4g}"), dim["low"]), dim["high"])


def median_best(bests: Sequence[float]) -> float | None:
    """AlgoPerf's score of one optimizer: the median over studies of each study's
    best; the lower median for an even count, so that it is a run that happened."""
    return statistics.median_low(bests) if bests else None


def unstable_region(trials: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The learning rates whose runs diverged: ``{"diverged_lrs", "largest_ok_lr",
    "from_lr"}``; ``from_lr`` is set when every diverged lr lies above every lr that
    finished (one unstable region: lr >= from_lr)."""
    diverged = sorted({t["lr"] for t in trials if t.get("status") == "diverged" and t.get("lr") is not None})
    ok = [t["lr"] for t in trials if t.get("status") == "ok" and t.get("lr") is not None]
    largest_ok = max(ok) if ok else None
    above = diverged and (largest_ok is None or diverged[0] > largest_ok)
    return {"diverged_lrs": diverged, "largest_ok_lr": largest_ok, "from_lr": diverged[0] if above else None}


def describe_unstable(name: str, region: Mapping[str, Any]) -> str | None:
    """``"AdamW: diverged at lr 0.09, 0.1 (unstable from lr 0.09; largest lr that finished 0.05)"``."""
    lrs = region["diverged_lrs"]
    if not lrs:
        return None
    text = f"{name}: diverged at lr {', '.join(format(lr, '.3g') for lr in lrs)}"
    if region["from_lr"] is not None:
        text += f" (unstable from lr {region['from_lr']:.3g}"
        if region["largest_ok_lr"] is not None:
            text += f"; largest lr that finished {region['largest_ok_lr']:.3g}"
        text += ")"
    return text


def choose(studies: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """The study whose best is the median of the bests, and that best trial:
    ``{"score", "study", "point", "lr", "trial"}``; ``None`` when no trial finished."""
    done = [s for s in studies if s["best"] is not None]
    score = median_best([s["best"] for s in done])
    if score is None:
        return None
    study = next(s for s in done if s["best"] == score)
    best = study["trials"][study["best_trial"]]
    return {"score": score, "study": study["study"], "point": best["point"], "lr": best["lr"], "trial": best["number"]}


def study_record(index: int, trials: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One study of one optimizer: its trials in order and its best (lowest final held-out loss)."""
    finished = [i for i, t in enumerate(trials) if t["status"] == "ok" and t["final"] is not None]
    best = min(finished, key=lambda i: trials[i]["final"]) if finished else None
    return {"study": index, "trials": list(trials), "best": None if best is None else trials[best]["final"],
            "best_trial": best, "pruned": sum(t["status"] == "pruned" for t in trials),
            "diverged": sum(t["status"] == "diverged" for t in trials)}  # fmt: skip


def tuned_summary(names: Sequence[str], trials: Sequence[Mapping[str, Any]], spaces: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Per optimizer, from the finished tuning trials (``{"config", "study", "slot",
    "number", "point", "lr", "final", "status"}``): its studies, the score, the
    chosen point and the unstable region. Optimizers without a search space are
    ``{"tuned": False}``."""
    out: dict[str, dict[str, Any]] = {}
    for name in names:
        if not spaces.get(name):
            out[name] = {"tuned": False, "space": {}, "studies": [], "score": None, "chosen": None,
                         "unstable": unstable_region([])}  # fmt: skip
            continue
        own = [t for t in trials if t["config"] == name]
        by_study: dict[int, list[Mapping[str, Any]]] = {}
        for t in sorted(own, key=lambda t: t["slot"]):
            by_study.setdefault(t["study"], []).append(t)
        studies = [study_record(s, by_study[s]) for s in sorted(by_study)]
        out[name] = {"tuned": True, "space": spaces[name], "studies": studies, "chosen": choose(studies),
                     "unstable": unstable_region(own)}  # fmt: skip
        out[name]["score"] = out[name]["chosen"]["score"] if out[name]["chosen"] else None
    return out


def _loss(value: float | None, sd: float | None = None) -> str:
    if value is None or not math.isfinite(value):
        return "-"
    return f"{value:.3f}" + (f" ± {sd:.3f}" if sd is not None else "")


def _at_defaults(row: Mapping[str, Any] | None) -> str:
    """A config's row at its defaults: its loss, or how it ended (a diverged config is not "-")."""
    if row is None:
        return "-"
    if row["status"] != "ok":
        return str(row["status"])
    return _loss(row["final"], row.get("final_sd"))


def _point(point: Mapping[str, float] | None) -> str:
    return " ".join(f"{k}={v:.3g}" for k, v in (point or {}).items()) or "-"


def _why_untuned(record: Mapping[str, Any], defaults: Mapping[str, Any] | None) -> str:
    if record.get("tuned"):
        return "-"
    if defaults is not None and defaults["status"] != "ok":
        return f"not tuned: {defaults['status']} at its defaults"
    return "not tuned: no search space (no lr)"


def render_protocol(doc: Mapping[str, Any], console: Any) -> None:
    """The tuned protocol side by side: each optimizer at its defaults and tuned
    with K trials (the best of each study, their median, the chosen point and its
    re-seeded mean ± sd), then the learning rates that diverged."""
    from rich.table import Table

    from .text import shown

    tuned = doc["tuned"]
    protocol = doc["protocol"]
    at_defaults = {r["name"]: r for r in doc["rows"]}
    reseeded = {r["name"]: r for r in tuned["rows"]}
    seeds = ",".join(map(str, protocol["seeds"]))
    table = Table(
        title=f"at defaults and tuned with {protocol['trials']} trials x {protocol['studies']} studies "
        f"({protocol['sampler']} points, seed {protocol['sampler_seed']})",
        caption=f"at defaults / re-seeded: mean ± sd of the final held-out loss over seeds {seeds}; best per study: "
        "the lowest final held-out loss of each study's trials (seed "
        f"{protocol['tuning_seed']}); score: their median (AlgoPerf's rule); chosen: the point behind the score",
    )
    for col in ("#", "optimizer", "at defaults", "best per study", "score", "chosen", "re-seeded", "pruned", "diverged"):
        table.add_column(col, justify="left" if col in ("optimizer", "chosen") else "right")
    for row in tuned["rows"] + [r for r in doc["rows"] if r["name"] not in reseeded]:
        name = row["name"]
        record = tuned["optimizers"].get(name, {})
        studies = record.get("studies", [])
        defaults = at_defaults.get(name)
        again = reseeded.get(name)
        table.add_row(
            again["rank"] if again else "-",
            shown(name),
            _at_defaults(defaults),
            " ".join(_loss(s["best"]) for s in studies) or _why_untuned(record, defaults),
            _loss(record.get("score")),
            _point((record.get("chosen") or {}).get("point")),
            _loss(again["final"], again.get("final_sd")) if again else "-",
            str(sum(s["pruned"] for s in studies)),
            str(sum(s["diverged"] for s in studies)),
        )
    console.print(table)
    for name, record in tuned["optimizers"].items():
        line = describe_unstable(name, record["unstable"])
        if line:
            console.print(f"[yellow]unstable[/yellow] {shown(line, 600)}", highlight=False)

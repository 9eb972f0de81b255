"""Seeds x learning rates for every config, a time budget over them, and the
per-config summary the table and the ranking read.

Runs are ordered by what a comparison needs most: first every config once (its
own lr, the first seed), then the other learning rates of the first seed, then
the other seeds. A budget cuts from the end of that order, so what remains is
still a fair comparison, and the cuts are reported, not hidden.
"""

from __future__ import annotations

import math
import re
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from optcore import ConfigError

from .lineup import base_lr, with_lr

#: ``--lr-sweep`` with no count: the entry's lr divided and multiplied by 3
#: (the 3x grid the line-up's learning rates were picked on).
DEFAULT_SWEEP_POINTS = 3
SWEEP_FACTOR = 3.0


@dataclass(frozen=True)
class Run:
    """One training run of the plan."""

    config: str  # the entry's name
    entry: dict[str, Any] = field(hash=False, compare=False)
    lr: float | None
    seed: int


def parse_seeds(text: str) -> list[int]:
    """``"0,1,2"`` or ``"0-4"`` -> the seeds."""
    seeds: list[int] = []
    for part in (p.strip() for p in text.split(",") if p.strip()):
        m = re.fullmatch(r"(\d+)-(\d+)", part)
        if m:
            seeds += list(range(int(m[1]), int(m[2]) + 1))
        elif part.lstrip("-").isdigit():
            seeds.append(int(part))
        else:
            raise ConfigError(f"--seeds takes integers like 0,1,2 or 0-4, got {part!r}.", problems=[("seeds", part)])
    if not seeds:
        raise ConfigError("--seeds named no seed; e.g. --seeds 0,1,2.", problems=[("seeds", "empty")])
    return list(dict.fromkeys(seeds))


def parse_lrs(text: str) -> list[float]:
    """``"1e-3,3e-3"`` -> the learning rates (positive floats)."""
    try:
        lrs = [float(p) for p in text.split(",") if p.strip()]
    except ValueError:
        raise ConfigError(f"--lrs takes numbers like 1e-3,3e-3, got {text!r}.", problems=[("lrs", text)]) from None
    if not lrs or any(not (lr > 0 and math.isfinite(lr)) for lr in lrs):
        raise ConfigError(f"--lrs needs positive learning rates, got {text!r}.", problems=[("lrs", text)])
    return sorted(set(lrs))


def parse_duration(text: str) -> float:
    """``"90s"``, ``"10m"``, ``"1h"``, ``"1h30m"`` or plain seconds -> seconds."""
    parts = re.fullmatch(r"\s*(?:(\d+(?:\.\d+)?)h)?\s*(?:(\d+(?:\.\d+)?)m)?\s*(?:(\d+(?:\.\d+)?)s?)?\s*", text)
    if not parts or not any(parts.groups()):
        raise ConfigError(f"--budget takes a duration like 90s, 10m or 1h, got {text!r}.", problems=[("budget", text)])
    h, m, s = (float(g) if g else 0.0 for g in parts.groups())
    total = 3600 * h + 60 * m + s
    if total <= 0:
        raise ConfigError(f"--budget must be positive, got {text!r}.", problems=[("budget", text)])
    return total


def sweep_lrs(entry: Mapping[str, Any], points: int | None, lrs: Sequence[float] | None) -> list[float | None]:
    """The learning rates to run ``entry`` at: ``lrs`` as given, else ``points``
    on a 3x log grid centred on its own lr, else just its own (``[None]``: as configured)."""
    if lrs:
        return list(lrs)
    if not points or points < 2:
        return [None]
    centre = base_lr(entry)
    if centre is None:
        return [None]  # no lr to sweep (reported as "not swept")
    half = (points - 1) / 2
    return [float(f"{centre * SWEEP_FACTOR ** (k - half):.3g}") for k in range(points)]


def plan(entries: Sequence[Mapping[str, Any]], seeds: Sequence[int], points: int | None = None,
         lrs: Sequence[float] | None = None) -> list[Run]:  # fmt: skip
    """Every (config, lr, seed) run, in the order a budget should keep them."""
    grids = {e["name"]: sweep_lrs(e, points, lrs) for e in entries}

    def run(e: Mapping[str, Any], lr: float | None, seed: int) -> Run:
        return Run(e["name"], with_lr(e, lr) if lr is not None else dict(e), lr, seed)

    first, rest = seeds[0], seeds[1:]
    centre = {name: grid[len(grid) // 2] for name, grid in grids.items()}
    runs = [run(e, centre[e["name"]], first) for e in entries]
    runs += [run(e, lr, first) for e in entries for lr in grids[e["name"]] if lr != centre[e["name"]]]
    runs += [run(e, lr, seed) for seed in rest for e in entries for lr in grids[e["name"]]]
    return runs


class Budget:
    """Keeps the runs within ``seconds``: a run starts only when the time spent
    plus its estimate (the mean wall time of that config's finished runs, else
    of all finished runs) fits."""

    def __init__(self, seconds: float | None) -> None:
        self.seconds = seconds
        self.walls: dict[str, list[float]] = {}
        self.cut: list[Run] = []

    def record(self, run: Run, wall_s: float) -> None:
        self.walls.setdefault(run.config, []).append(wall_s)

    def estimate(self, run: Run) -> float:
        own = self.walls.get(run.config)
        every = [w for ws in self.walls.values() for w in ws]
        return statistics.fmean(own or every) if (own or every) else 0.0

    def allows(self, run: Run, spent: float) -> bool:
        if self.seconds is None or spent + self.estimate(run) <= self.seconds:
            return True
        self.cut.append(run)
        return False

    def describe_cuts(self) -> str | None:
        """``"cut 4 of 12 runs: Adam (lr 0.003, 0.03; seed 1), ..."``, or None."""
        if not self.cut:
            return None
        by_config: dict[str, list[str]] = {}
        for run in self.cut:
            by_config.setdefault(run.config, []).append(
                f"{'lr ' + format(run.lr, 'g') + ' ' if run.lr is not None else ''}seed {run.seed}"
            )
        parts = [f"{name} ({', '.join(items)})" for name, items in by_config.items()]
        return f"cut {len(self.cut)} runs to stay within {self.seconds:g} s: " + "; ".join(parts)


# ------------------------------------------------------------------ summary
def _mean_sd(values: Sequence[float]) -> tuple[float, float | None]:
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else None)


def summarise(entries: Sequence[Mapping[str, Any]], results: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One row per config: its best learning rate (lowest mean final held-out
    loss over the seeds, among the lrs where every seed finished), the mean and
    spread (standard deviation) there, and the measurements of that lr's runs.
    A config with no finished lr keeps its first run's status and error."""
    rows = []
    for entry in entries:
        index = {id(r): i for i, r in enumerate(results)}
        runs = [r for r in results if r["name"] == entry["name"]]
        if not runs:
            continue
        by_lr: dict[Any, list[Mapping[str, Any]]] = {}
        for r in runs:
            by_lr.setdefault(r["lr"], []).append(r)
        sweep = []
        for lr, group in by_lr.items():
            finals = [r["final"] for r in group]
            ok = all(f is not None for f in finals)
            mean, sd = _mean_sd(finals) if ok else (None, None)
            sweep.append({"lr": lr, "mean": mean, "sd": sd, "seeds": [r["seed"] for r in group],
                          "finals": finals, "status": "ok" if ok else _worst(group)})  # fmt: skip
        sweep.sort(key=lambda s: (s["lr"] is None, s["lr"] or 0.0))
        finished = [s for s in sweep if s["mean"] is not None]
        chosen = min(finished, key=lambda s: s["mean"]) if finished else None
        group = by_lr[chosen["lr"]] if chosen else runs
        first = group[0]
        rows.append({
            "name": entry["name"], "built": first["built"], "config": first["config"],
            "lr": chosen["lr"] if chosen else first["lr"], "swept": len(sweep) > 1, "sweep": sweep,
            "final": chosen["mean"] if chosen else None, "final_sd": chosen["sd"] if chosen else None,
            "n_seeds": len(group), "best": _mean([r["best"] for r in group]),
            "best_step": first["best_step"], "steps_per_s": _mean([r["steps_per_s"] for r in group]),
            "state_bytes": first["state_bytes"], "state_bytes_per_param": first["state_bytes_per_param"],
            "peak_rss": _max([r["peak_rss"] for r in group]), "peak_rss_delta": _max([r["peak_rss_delta"] for r in group]),
            "skipped_steps": first["skipped_steps"], "status": "ok" if chosen else first["status"],
            "error": None if chosen else first["error"], "runs": [index[id(r)] for r in group],
        })  # fmt: skip
    return rank(rows)


def _worst(group: Sequence[Mapping[str, Any]]) -> str:
    statuses = {r["status"] for r in group}
    return "failed" if "failed" in statuses else "diverged" if "diverged" in statuses else "ok"


def _mean(values: Sequence[float | None]) -> float | None:
    kept = [v for v in values if v is not None]
    return statistics.fmean(kept) if kept else None


def _max(values: Sequence[float | None]) -> float | None:
    kept = [v for v in values if v is not None]
    return max(kept) if kept else None


#: The noise assumed for one final loss where the seeds cannot measure it (one
#: seed), and the least assumed where they can (two seeds estimate a spread
#: badly): 1% of the loss. Measured on the built-in char-lm task (300 steps, 5
#: seeds), the seed-to-seed standard deviation of the final held-out loss was
#: 0.7% (Adam) to 2.7% (NAdam) of the loss.
NOISE_REL = 0.01


def rank(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows best first (finished configs by mean final loss; the others last), each
    with ``rank``: ``"1"``, ``"2="``, ``"2="``, ``"4"``... and ``tie_with``.

    Each finished row stands for an interval: its mean ± its noise, the larger
    of the spread over its seeds and :data:`NOISE_REL` of the loss. Rows whose
    intervals are connected by overlaps share a rank: the data cannot separate
    them, so the table says "tie" instead of ordering them. Between two ranks
    every pair is separated (each row of the better rank ends below every row
    of the worse one)."""
    done = sorted((r for r in rows if r["final"] is not None), key=lambda r: r["final"])
    rest = [r for r in rows if r["final"] is None]
    groups: list[list[dict[str, Any]]] = []
    reach = -math.inf  # the highest upper end of the current group
    for row in sorted(done, key=lambda r: _interval(r)[0]):
        low, high = _interval(row)
        if groups and low <= reach:
            groups[-1].append(row)
            reach = max(reach, high)
        else:
            groups.append([row])
            reach = high
    position = 1
    ordered: list[dict[str, Any]] = []
    for group in groups:
        group.sort(key=lambda r: r["final"])
        for row in group:
            row["rank"] = f"{position}=" if len(group) > 1 else str(position)
            row["tie_with"] = [r["name"] for r in group if r is not row]
        position += len(group)
        ordered += group
    for row in rest:
        row["rank"], row["tie_with"] = "-", []
    return ordered + rest


def _interval(row: Mapping[str, Any]) -> tuple[float, float]:
    """A row's final loss ± its noise (the seeds' spread, at least NOISE_REL of the loss)."""
    noise = max(row.get("final_sd") or 0.0, NOISE_REL * abs(row["final"]))
    return row["final"] - noise, row["final"] + noise


def ranking_line(rows: Sequence[Mapping[str, Any]]) -> str:
    """``"AdamW > Adam = NAdam (tie) > SGD"``: the order the seeds support."""
    parts: list[str] = []
    current: list[str] = []
    last = None
    for row in rows:
        if row["final"] is None:
            continue
        if last is not None and row["rank"] == last and row["rank"].endswith("="):
            current.append(row["name"])
        else:
            if current:
                parts.append(" = ".join(current) + (" (tie)" if len(current) > 1 else ""))
            current = [row["name"]]
        last = row["rank"]
    if current:
        parts.append(" = ".join(current) + (" (tie)" if len(current) > 1 else ""))
    return " > ".join(parts)

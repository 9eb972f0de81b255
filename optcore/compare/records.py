"""The records ``optcore compare`` reads back, as bounded pydantic models: a
sweep's stored settings, its trials' attributes and results, and ``results.json``.

A shared Optuna study is written by every worker that joins it, and a
``results.json`` by whoever had the folder: what they hold is input from
others. Each record is validated here, once, where it enters (sizes, counts,
finite numbers, known phases and statuses), so that the code past this module
meets only the shapes these models guarantee, and a bad record is refused by
name (study, trial number, key) with a :class:`~optcore.ConfigError` instead of
a ``KeyError`` or a 142 s render deep inside a report.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StringConstraints, ValidationError, model_validator

from optcore import ConfigError

from .._values import clean_text

#: A name (config, task spec, type, study key): at most this many characters, as optcore's own names.
MAX_NAME = 200
#: Free text (an error, a warning, a summary): at most this many characters.
MAX_TEXT = 20_000
#: Items in any one stored list or mapping (a run's losses: one per step).
MAX_ITEMS = 1_000_000
#: Nesting of a stored config (a wrapper's optimizer's fallback's ...).
MAX_DEPTH = 12
#: Runs or trials one sweep may plan: a stored plan beyond this is refused instead of materialised.
MAX_PLANNED = 1_000_000
#: A results.json larger than this is refused before it is parsed.
MAX_FILE_BYTES = 512 * 2**20
PHASES = ("defaults", "tune", "seeds")
STATUSES = ("ok", "failed", "diverged", "pruned")


def _bounded(value: Any, depth: int = 0) -> Any:
    """``value`` when it is JSON within :data:`MAX_DEPTH`, :data:`MAX_ITEMS` and :data:`MAX_TEXT`, else ValueError."""
    if depth > MAX_DEPTH:
        raise ValueError(f"nested deeper than {MAX_DEPTH} levels")
    if isinstance(value, str):
        if len(value) > MAX_TEXT:
            raise ValueError(f"a text of {len(value):,} characters (at most {MAX_TEXT:,})")
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"a non-finite number ({value})")
    elif isinstance(value, (list, tuple, dict)):
        if len(value) > MAX_ITEMS:
            raise ValueError(f"{len(value):,} items (at most {MAX_ITEMS:,})")
        for key in value if isinstance(value, dict) else ():
            if not isinstance(key, str) or len(key) > MAX_NAME:
                raise ValueError(f"a key that is not a name of at most {MAX_NAME} characters: {clean_text(key, 40)}")
        for item in value.values() if isinstance(value, dict) else value:
            _bounded(item, depth + 1)
    elif value is not None and not isinstance(value, (bool, int)):
        raise ValueError(f"a {type(value).__name__}, not JSON")
    return value


def _printable(text: str) -> str:
    if not text.isprintable():
        raise ValueError("control characters in a name")
    return text


Name = Annotated[str, StringConstraints(min_length=1, max_length=MAX_NAME), AfterValidator(_printable)]
Text = Annotated[str, StringConstraints(max_length=MAX_TEXT)]
Finite = Annotated[float, Field(allow_inf_nan=False)]
Positive = Annotated[float, Field(gt=0, allow_inf_nan=False)]
Count = Annotated[int, Field(ge=0, le=MAX_PLANNED)]
Seed = Annotated[int, Field(ge=-(2**63), lt=2**63)]
Json = Annotated[Any, AfterValidator(_bounded)]
Dim = Literal["lr", "weight_decay", "beta1", "beta2", "momentum", "warmup"]


class Record(BaseModel):
    """A stored record: every value bounded JSON (also the keys a newer version adds), its known keys typed."""

    model_config = ConfigDict(extra="allow", frozen=True)

    @model_validator(mode="before")
    @classmethod
    def _json_within_bounds(cls, data: Any) -> Any:
        if not isinstance(data, Mapping):
            raise ValueError(f"a mapping, not {type(data).__name__}")  # noqa: TRY004 - pydantic reports ValueError
        return _bounded(dict(data))


class TaskRecord(Record):
    spec: Name
    name: Name | None = None
    description: Text = ""


class Range(Record):
    low: Finite
    high: Finite
    log: bool

    @model_validator(mode="after")
    def _ordered(self) -> Range:
        if not self.low < self.high or (self.log and self.low <= 0):
            raise ValueError("a range needs low < high (and low > 0 on a log scale)")
        return self


class EntryRecord(Record):
    """One config of a sweep: ``{name, optimizer, lr_scheduler?, search_space?}``."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    name: Name
    optimizer: Json
    lr_scheduler: Json = None
    search_space: dict[Dim, Range] | None = None


class Protocol(Record):
    trials: Count
    studies: Annotated[int, Field(ge=1, le=10_000)]
    sampler: Literal["sobol", "halton"]
    sampler_seed: Seed
    tuning_seed: Seed
    prune: bool

    @model_validator(mode="before")
    @classmethod
    def _not_pruned_unless_said(cls, data: Any) -> Any:
        return {"prune": False, **data} if isinstance(data, Mapping) else data


class SweepRecord(Record):
    """Study attribute ``optcore``: what a worker on another machine needs to run the sweep's trials."""

    format: Literal[1]
    task: TaskRecord
    steps: Annotated[int, Field(ge=1, le=100_000_000)]
    seeds: Annotated[list[Seed], Field(min_length=1, max_length=10_000)]
    lr_sweep: Annotated[int, Field(ge=1, le=10_000)] | None
    lrs: Annotated[list[Positive], Field(min_length=1, max_length=10_000)] | None
    entries: Annotated[list[EntryRecord], Field(min_length=1, max_length=10_000)]
    spaces: dict[Name, dict[Dim, Range]]
    protocol: Protocol
    summary: Text
    memory_note: Text
    loss_label: Name = "loss"
    settings: dict[Name, Json] = {}
    target: dict[Name, Finite] | None = None

    @model_validator(mode="after")
    def _plan_within_bounds(self) -> SweepRecord:
        names = [e.name for e in self.entries]
        if len(set(names)) != len(names):
            raise ValueError("two entries of the same name")
        if set(self.spaces) - set(names):
            raise ValueError("a search space of a config that is not an entry")
        lrs = max(self.lr_sweep or 1, len(self.lrs or ()))
        tuned = len(self.spaces) * (self.protocol.trials * self.protocol.studies + len(self.seeds))
        if len(names) * len(self.seeds) * lrs + tuned > MAX_PLANNED:
            raise ValueError(f"a plan of more than {MAX_PLANNED:,} runs")
        return self


class TrialRecord(Record):
    """Trial attribute ``optcore``: which slot of the plan a trial is, and what it runs."""

    phase: Literal["defaults", "tune", "seeds"]
    config: Name
    slot: Count
    seed: Seed
    lr: Positive | None = None
    point: dict[Dim, Finite] | None = None
    entry: EntryRecord | None = None
    study: Count | None = None
    pruned_at: Count | None = None

    @model_validator(mode="after")
    def _runnable(self) -> TrialRecord:
        if self.phase == "tune" and self.point is None:
            raise ValueError("a tuning trial without its point")
        if self.phase != "tune" and self.entry is None:
            raise ValueError(f"a {self.phase} trial without its entry")
        return self


class RunResult(Record):
    """Trial attribute ``result``: one run's measurements (:func:`optcore.compare.train.empty_result`)."""

    name: Name
    config: Json
    built: Name | None
    seed: Seed | None
    lr: Finite | None  # as the config gave it: a failed run's may be the invalid value it failed on
    status: Literal["ok", "failed", "diverged", "pruned"]
    error: Text | None
    final: Finite | None
    best: Finite | None
    best_step: Count | None
    losses: list[Finite | None]
    val_losses: list[tuple[Count, Finite | None]]
    eval_seconds: list[Finite]
    steps_per_s: Finite | None
    state_bytes: Finite | None
    state_bytes_per_param: Finite | None
    peak_rss: Finite | None
    peak_rss_delta: Finite | None
    skipped_steps: Count | None
    warnings: Annotated[list[Text], Field(max_length=100)] = []
    isolation: Literal["spawn", "in-process"] | None = None
    jobs: Annotated[int, Field(ge=1, le=100_000)] | None = None


#: How Optuna records a retried trial (system attribute), bounded as the rest.
RetryHistory = Annotated[list[Count], Field(max_length=10_000)]


class RowRecord(Record):
    """A row of ``results.json``: a config's runs at its chosen lr (indices into ``results``)."""

    name: Name
    status: Literal["ok", "failed", "diverged", "pruned"]
    runs: list[Count]


class Part(Record):
    rows: list[RowRecord]
    results: list[RunResult]

    @model_validator(mode="after")
    def _runs_exist(self) -> Part:
        if any(i >= len(self.results) for row in self.rows for i in row.runs):
            raise ValueError("a row names a run that results does not hold")
        return self


class ResultsFile(Part):
    """``results.json`` of one comparison, as ``compare report`` and the scores over several tasks read it."""

    task: TaskRecord
    summary: Text
    complete: bool
    cut: Text | None = None
    tuned: Part | None = None
    scores: dict[Name, Json] = {}


# ------------------------------------------------------------ reading
def _why(exc: ValidationError) -> str:
    """The first few problems of ``exc``, escaped and short: where, and what was wrong."""
    parts = []
    for error in exc.errors(include_url=False, include_input=False)[:3]:
        where = ".".join(clean_text(p, 40) for p in error["loc"]) or "the record"
        parts.append(f"{where}: {clean_text(error['msg'], 160)}")
    more = exc.error_count() - len(parts)
    return "; ".join(parts) + (f" (and {more} more)" if more > 0 else "")


def where(study: str, key: str, trial: int | None = None) -> str:
    """``study 'x', trial 3, key 'result'``: how a stored record is named in a message."""
    number = f", trial {trial}" if trial is not None else ""
    return f"study {clean_text(study, MAX_NAME)!r}{number}, key {key!r}"


def parse(model: type[Any], raw: Any, named: str) -> Any:
    """``raw`` as ``model``, else a ConfigError naming the record (``named``, e.g. :func:`where`) and why."""
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(f"Bad stored record ({named}): {_why(exc)}.", problems=[(named, "bad record")]) from None
    except (RecursionError, TypeError, ValueError) as exc:
        raise ConfigError(f"Bad stored record ({named}): {clean_text(exc, 160)}.",
                          problems=[(named, "bad record")]) from None  # fmt: skip


def sweep_record(study: str, raw: Any) -> SweepRecord:
    """Study ``study``'s attribute ``optcore``."""
    record: SweepRecord = parse(SweepRecord, raw, where(study, "optcore"))
    return record


def task_list(study: str, raw: Any) -> list[str]:
    """A several-task sweep's index (study attribute ``optcore_tasks``): one to 100 task specs."""
    return list(parse(_TaskList, {"tasks": raw}, where(study, "optcore_tasks")).tasks)


class _TaskList(Record):
    tasks: Annotated[list[Name], Field(min_length=1, max_length=100)]


def is_ready(raw: Any) -> bool:
    """Study attribute ``ready``: set (``true``) by the worker that enqueued the study's trials."""
    return raw is True


def retries(study: str, trial: int, raw: Any) -> int:
    """How often Optuna retried a trial (system attribute ``retry_history``)."""
    return len(parse(_Retries, {"history": raw or []}, where(study, "retry_history", trial)).history)


class _Retries(Record):
    history: RetryHistory


def plain(record: BaseModel) -> dict[str, Any]:
    """``record`` as the dict the sweep's reports read: the keys it was given, with their validated values
    (a key the model defaults is left out where the record did not give it, as the writer left it out)."""
    return record.model_dump(mode="json", exclude_unset=True)


def read_results(path: Path) -> dict[str, Any]:
    """The ``results.json`` at ``path``, checked; a ConfigError names the file and what was wrong."""
    named = f"file {clean_text(path, 400)!r}"
    try:
        if path.stat().st_size > MAX_FILE_BYTES:
            raise ConfigError(f"{named} is over {MAX_FILE_BYTES // 2**20} MiB: not a comparison's results.json.",
                              problems=[(str(path), "too large")])  # fmt: skip
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as exc:
        if isinstance(exc, ConfigError):
            raise
        raise ConfigError(f"Cannot read {named}: {clean_text(exc, 200)}. Rebuild it with `optcore compare report`.",
                          problems=[(str(path), "unreadable")]) from None  # fmt: skip
    parse(ResultsFile, raw, named)
    return dict(raw)

"""Optuna as the engine of ``optcore compare``: every run is a trial in a storage.

A comparison is a *sweep* named NAME in an Optuna storage (by default the SQLite
file ``optuna.db`` in the output folder; ``--storage URL`` for any other RDB
storage Optuna takes, e.g. PostgreSQL shared by several machines):

- study ``NAME`` holds the sweep's settings (user attribute ``optcore``) and its
  *defaults* phase: every config at its own hyper-parameters (and at the lrs of
  ``--lr-sweep`` / ``--lrs``), once per seed, enqueued as fixed points;
- study ``NAME/<config>/tune-<s>`` (``--trials K --studies S``) holds the K
  quasi-random points of study s (:func:`optcore.compare.tuning.draw_points`),
  enqueued as fixed points;
- study ``NAME/<config>/seeds`` holds the configuration chosen by the tuning,
  once per seed; it is created by the first worker that sees that config's tuning
  finished (creating a study is the storage's atomic claim: a second creator gets
  ``DuplicatedStudyError``), which enqueues its trials and marks it ``ready``.

A worker takes the next waiting trial (in plan order: defaults, tuning, re-seeds)
by switching it from WAITING to RUNNING, which the storage grants to one worker
only; nothing is scheduled besides that. It runs the trial in a fresh process (the
runner's), records the run's measurements as the trial's ``result`` and tells
Optuna its final held-out loss (COMPLETE), that it was pruned (PRUNED) or that it
failed or diverged (FAIL). While a trial runs its worker records a heartbeat; a
trial whose worker fell silent (killed, machine lost) is failed by the next worker
that looks and enqueued again by Optuna's :class:`~optuna.storages.RetryHeartbeatStaleTrialCallback`.
A worker stops when every planned trial has finished (it waits for the others'
running trials, so that it can retry them), or when its budget or Ctrl-C stops it;
a trial stopped by Ctrl-C is failed and enqueued again, so the next run of the same
command (same ``--out``, or the same ``--storage``/``--study``) resumes the sweep.

:func:`collect` rebuilds the whole comparison (``results.json``'s content) from
the storage alone: the live run and ``optcore compare report`` call it alike.
"""

from __future__ import annotations

import json
import threading
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from optcore import ConfigError

from . import dashboard, records
from .lineup import apply_point, runnable
from .sweep import plan, summarise
from .tuning import draw_points, tuned_summary

SWEEP_FORMAT = 1
DEFAULT_STUDY = "compare"
DEFAULT_HEARTBEAT_S = 10.0
#: A trial whose heartbeat is this many intervals old is failed and retried.
GRACE_INTERVALS = 3
#: How often a killed worker's trial is retried before it counts as lost.
MAX_RETRY = 3
#: Phases in the order workers take their trials.
PHASES = ("defaults", "tune", "seeds")
#: A re-seed study that its creator has not marked ready after this long is completed by another worker.
READY_TIMEOUT_S = 120.0
#: What must be equal for two commands to be workers of the same sweep.
FINGERPRINT = ("task", "steps", "seeds", "lr_sweep", "lrs", "entries", "spaces", "protocol")

#: What peak RSS and Δ RSS mean, by how a run was isolated (each result records its ``isolation``).
MEMORY_NOTES = {
    "spawn": "peak resident memory of the run's own process, and its growth (Δ) from just before the optimizer was built",
    "in-process": "peak resident memory since the run started (kernel peak mark reset; the process's earlier "
    "allocations are included), and its growth (Δ) from just before the optimizer was built",
}


def isolation_text(isolation: str, jobs: int) -> str:
    """How one worker ran its runs, as the tables say it."""
    text = "in-process" if isolation == "in-process" else "one fresh process per run (spawn)"
    return text + (f", {jobs} at a time" if jobs > 1 else "")


def run_notes(results: Sequence[Mapping[str, Any]], meta: Mapping[str, Any]) -> tuple[str, str]:
    """(isolation, memory note) of the runs that made ``results``, from what each
    run recorded: a sweep resumed or joined another way (``--in-process``,
    ``--jobs``) describes every way its runs were made, and says where their
    seconds and memory do not compare. Results without the record (older
    sweeps) take the notes stored when the sweep was created."""
    stored = meta.get("settings", {})
    if not any("isolation" in r for r in results):
        return stored.get("isolation", "not recorded"), meta["memory_note"]
    # a run without the record was made by an older version, as the command that started the sweep
    started = ("in-process" if str(stored.get("isolation", "")).startswith("in-process") else "spawn",
               int(stored.get("jobs") or 1))
    ways: dict[tuple[str, int], int] = {}
    for r in results:
        key = (r["isolation"], int(r.get("jobs", 1))) if "isolation" in r else started
        ways[key] = ways.get(key, 0) + 1
    kinds = sorted({isolation for isolation, _ in ways})
    if len(ways) == 1:
        ((isolation, jobs),) = ways
        return isolation_text(isolation, jobs), MEMORY_NOTES[isolation]
    described = "; ".join(f"{isolation_text(i, j)} ({n} run{'s' if n != 1 else ''})" for (i, j), n in sorted(ways.items()))
    memory = (MEMORY_NOTES[kinds[0]] if len(kinds) == 1 else
              "MIXED: " + "; ".join(f"{k}: {MEMORY_NOTES[k]}" for k in kinds) + " (not comparable across them)")
    return f"MIXED ({described}): steps/s compare only between runs made the same way", memory


def _optuna() -> Any:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna


def _sampler() -> Any:
    """The sampler of a study this module opens: every trial it runs was enqueued with
    its point (:func:`optcore.compare.tuning.draw_points`), so none is sampled here."""
    return _optuna().samplers.RandomSampler(seed=0)


def default_storage_url(out: Path) -> str:
    """The SQLite file in the output folder: no server, and a rerun resumes."""
    return f"sqlite:///{(out / 'optuna.db').resolve()}"


def open_storage(url: str, heartbeat_s: float = DEFAULT_HEARTBEAT_S) -> Any:
    """An Optuna RDB storage for ``url`` with heartbeats (the retry of a killed
    worker's trial needs them), wrapped in Optuna's cache as ``create_study`` does."""
    optuna = _optuna()
    if "://" not in url:
        raise ConfigError(
            f"--storage takes a database URL Optuna accepts (sqlite:///path/optuna.db, "
            f"postgresql://user@host/db, mysql://...), got {url!r}.",
            problems=[("storage", url)],
        )
    url = _driver_url(url)
    kwargs: dict[str, Any] = {}
    if url.startswith("sqlite"):
        kwargs["engine_kwargs"] = {"connect_args": {"timeout": 60}}  # several workers wait for the file's lock
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # heartbeat_interval is marked experimental
        for attempt in range(10):
            try:
                rdb = optuna.storages.RDBStorage(
                    url, heartbeat_interval=max(1, round(heartbeat_s)),
                    grace_period=max(2, round(GRACE_INTERVALS * heartbeat_s)),
                    heartbeat_stale_trial_callback=optuna.storages.RetryHeartbeatStaleTrialCallback(max_retry=MAX_RETRY),
                    **kwargs,
                )  # fmt: skip
                break
            except (ImportError, ModuleNotFoundError) as exc:
                raise ConfigError(f"--storage {url!r} needs a database driver: {exc} (PostgreSQL: pip install "
                                  "psycopg2-binary).", problems=[("storage", "driver")]) from None  # fmt: skip
            except Exception as exc:  # noqa: BLE001 - sqlalchemy's errors name the server and the reason
                # Workers that start together race to create the schema: the loser finds it made
                # (an IntegrityError on PostgreSQL; on SQLite "table ... already exists").
                race = "IntegrityError" in type(exc).__name__ + repr(exc) or "already exists" in str(exc)
                if race and attempt < 9:
                    time.sleep(0.2 * (attempt + 1))
                    continue
                raise ConfigError(f"Cannot open the Optuna storage {_hide_password(url)!r}: {type(exc).__name__}: {exc}",
                                  problems=[("storage", "unreachable")]) from None  # fmt: skip
    return optuna.storages.get_storage(rdb)


def _driver_url(url: str) -> str:
    """``postgresql://`` through psycopg2 (optcore[compare]'s driver) where psycopg 3,
    SQLAlchemy 2.1's default for a URL without a driver, is not installed."""
    import importlib.util

    scheme, sep, rest = url.partition("://")
    if scheme in ("postgresql", "postgres") and importlib.util.find_spec("psycopg") is None \
            and importlib.util.find_spec("psycopg2") is not None:  # fmt: skip
        return f"postgresql+psycopg2{sep}{rest}"
    return url


def _hide_password(url: str) -> str:
    import re

    return re.sub(r"(//[^:/@]+):[^@/]*@", r"\1:***@", url)


def _retrying(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``fn(*args)``, again after a short wait when the storage is busy (SQLite's
    lock with several workers): a failed transaction changed nothing."""
    optuna = _optuna()
    for attempt in range(30):
        try:
            return fn(*args, **kwargs)
        except optuna.exceptions.StorageInternalError:
            if attempt == 29:
                raise
            time.sleep(0.05 * (attempt + 1))
    return None  # pragma: no cover


# ----------------------------------------------------------------- the plan
def sweep_meta(entries: Sequence[Mapping[str, Any]], spaces: Mapping[str, Any], *, task: Mapping[str, Any], steps: int,
               seeds: Sequence[int], lr_sweep: int | None, lrs: Sequence[float] | None,
               protocol: Mapping[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:  # fmt: skip
    """What a sweep stores about itself (JSON): everything a worker on another
    machine needs to run its trials, and :func:`collect` to show them."""
    return json.loads(json.dumps({
        "format": SWEEP_FORMAT, "task": dict(task), "steps": steps, "seeds": list(seeds), "lr_sweep": lr_sweep,
        "lrs": list(lrs) if lrs else None, "entries": [dict(e) for e in entries], "spaces": dict(spaces),
        "protocol": dict(protocol), **extra,
    }, default=str))  # fmt: skip


def task_study(name: str, folder: str) -> str:
    """The sweep of one task of the several-task sweep ``name`` (``--task a,b`` with ``--storage``)."""
    return f"{name}/{folder}"


def task_index(storage: Any, name: str, tasks: Sequence[str] | None) -> list[str] | None:
    """The tasks of the several-task sweep ``name``: study ``name`` lists them
    (user attribute ``optcore_tasks``) and each task's sweep is study
    :func:`task_study`, so that ``compare report`` and a worker that gives only
    ``--storage`` and ``--study`` find every task. With ``tasks`` the index is
    created, or checked against the stored one; with ``None`` it is only read
    (``None``: ``name`` is not a several-task sweep, or does not exist)."""
    optuna = _optuna()
    try:
        index = optuna.load_study(study_name=name, storage=storage, sampler=_sampler())
    except KeyError:
        index = None
    if index is None and tasks is not None:
        try:
            index = optuna.create_study(study_name=name, storage=storage, direction="minimize", sampler=_sampler())
            _retrying(index.set_user_attr, TASKS_ATTR, list(tasks))
            return list(tasks)
        except optuna.exceptions.DuplicatedStudyError:  # another worker created it just now
            index = optuna.load_study(study_name=name, storage=storage, sampler=_sampler())
    if index is None:
        return None
    deadline = time.monotonic() + READY_TIMEOUT_S
    while TASKS_ATTR not in study_attrs(index) and "optcore" not in study_attrs(index) and time.monotonic() < deadline:
        time.sleep(0.5)  # its creator is writing it
    raw = study_attrs(index).get(TASKS_ATTR)
    stored = records.task_list(name, raw) if raw is not None else None
    if tasks is not None and stored != list(tasks):
        what = f"the tasks {', '.join(map(records.clean_text, stored))}" if stored else "one task"
        raise ConfigError(
            f"The comparison {name!r} in this storage is a sweep of {what}, not of {', '.join(tasks)}. Run the same "
            "--task as the other workers (or give only --storage and --study to join it as it is), or start a new "
            "one with another --study.",
            problems=[("task", "differs from the stored sweep")],
        )
    return list(stored) if stored else None


def study_attrs(study: Any) -> dict[str, Any]:
    """A study's user attributes; a ConfigError names the study when one of them is not JSON."""
    try:
        return dict(_retrying(lambda: study.user_attrs))
    except ValueError as exc:  # json.JSONDecodeError: a value written around Optuna
        raise ConfigError(f"Bad stored record ({records.where(study.study_name, 'user attributes')}): not JSON "
                          f"({records.clean_text(exc)}).", problems=[(study.study_name, "not JSON")]) from None  # fmt: skip


#: The user attribute of a several-task sweep's index study: its ``--task`` specs.
TASKS_ATTR = "optcore_tasks"


def _differences(stored: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    return [key for key in FINGERPRINT if stored.get(key) != new.get(key)]


@dataclass
class Claimed:
    """A trial this worker took: what to run, and how to report it."""

    study: Any
    trial_id: int
    number: int
    attrs: dict[str, Any]
    entry: dict[str, Any]
    trial: Any = None  # optuna.Trial, for pruning
    stop: threading.Event = field(default_factory=threading.Event)

    @property
    def phase(self) -> str:
        return str(self.attrs["phase"])

    @property
    def config(self) -> str:
        return str(self.attrs["config"])

    @property
    def seed(self) -> int:
        return int(self.attrs["seed"])

    @property
    def lr(self) -> float | None:
        return self.attrs.get("lr")


class Sweep:
    """One sweep in one storage: create or join it, take and finish its trials."""

    def __init__(self, storage: Any, name: str, meta: Mapping[str, Any]) -> None:
        self.storage, self.name, self.meta = storage, name, dict(meta)
        self.entries = {e["name"]: e for e in self.meta["entries"]}
        self.protocol = self.meta["protocol"]
        self._studies: dict[str, Any] = {}
        self._not_ready_since: dict[str, float] = {}
        #: One line per stored record that was skipped (study, trial, key: why), in the order met.
        self.bad: dict[str, str] = {}
        self._checked: dict[tuple[int, str, bool], Any] = {}
        #: What this worker names itself (:class:`~optcore.compare.trust.Trust`); ``None``: a report, it runs nothing.
        self.trust: Any = None

    # ---------------------------------------------------------- opening
    @classmethod
    def open(cls, storage: Any, name: str, meta: Mapping[str, Any] | None, *, explicit: bool = True,
             trust: Any = None) -> Sweep:  # fmt: skip
        """Create the sweep ``name`` with ``meta``, or join it when it exists (its
        stored settings win; ``explicit`` settings that differ are an error). With
        ``meta=None`` only an existing sweep is opened (``compare report``), to be read.

        A joined sweep runs only code that ``trust`` (:class:`~optcore.compare.trust.Trust`;
        by default: the task and configs of ``meta``, what the caller names) names
        or that imports nothing foreign (:meth:`check_code`)."""
        if trust is None and meta is not None:
            from .trust import Trust

            trust = Trust.of(meta["task"]["spec"], meta["entries"], f"optcore compare --study {name}")
        optuna = _optuna()
        try:
            index = optuna.load_study(study_name=name, storage=storage, sampler=_sampler())
        except KeyError:
            index = None
        if index is None:
            if meta is None:
                names = [n for n in optuna.get_all_study_names(storage) if "/" not in n]
                raise ConfigError(f"No comparison {name!r} in this storage; it holds: {', '.join(names) or 'nothing'}.",
                                  problems=[("study", name)], accepted=names)  # fmt: skip
            try:
                index = optuna.create_study(study_name=name, storage=storage, direction="minimize", sampler=_sampler())
            except optuna.exceptions.DuplicatedStudyError:  # another worker created it just now
                return cls.open(storage, name, meta, explicit=explicit, trust=trust)
            sweep = cls(storage, name, meta)
            sweep.trust = trust  # its own settings
            sweep._create(index)
            return sweep
        if TASKS_ATTR in study_attrs(index):
            tasks = [records.clean_text(t) for t in records.task_list(name, study_attrs(index)[TASKS_ATTR])]
            raise ConfigError(
                f"The comparison {name!r} in this storage is a sweep of several tasks ({', '.join(tasks)}): give "
                f"--task {','.join(tasks)} (or only --storage and --study), or another --study.",
                problems=[("study", "several tasks")],
            )
        stored = cls._wait_ready(index, name)
        if meta is not None and explicit:
            differ = _differences(stored, meta)
            if differ:
                raise ConfigError(
                    f"The comparison {name!r} in this storage was started with other settings ({', '.join(differ)} "
                    "differ). Run the same command as the other workers (or give only --storage and --study to "
                    "join it as it is), or start a new one with another --study (or --out).",
                    problems=[(key, "differs from the stored sweep") for key in differ],
                )
        sweep = cls(storage, name, stored)
        if trust is not None:
            sweep.check_code(trust)
        return sweep

    @staticmethod
    def _wait_ready(index: Any, name: str) -> dict[str, Any]:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while True:
            attrs = study_attrs(index)
            if "ready" in attrs and not records.is_ready(attrs["ready"]):
                raise ConfigError(f"Bad stored record ({records.where(name, 'ready')}): not true.",
                                  problems=[("ready", "bad record")])  # fmt: skip
            if "ready" in attrs and "optcore" in attrs:
                return records.plain(records.sweep_record(name, attrs["optcore"]))
            if time.monotonic() > deadline:
                raise ConfigError(
                    f"The comparison {name!r} is not ready after {READY_TIMEOUT_S:g} s: the worker that created it "
                    "stopped while enqueueing its trials. Start a new one with another --study (or --out).",
                    problems=[("study", "never got ready")],
                )
            time.sleep(0.5)

    def _create(self, index: Any) -> None:
        """Store the settings and enqueue every trial known up front."""
        optuna = _optuna()
        self._studies[self.name] = index
        _retrying(index.set_user_attr, "optcore", self.meta)
        _retrying(dashboard.label_study, index, self.meta)
        entries = list(self.meta["entries"])
        runs = plan(entries, self.meta["seeds"], self.meta["lr_sweep"], self.meta["lrs"])
        for slot, run in enumerate(runs):
            attrs = {"phase": "defaults", "config": run.config, "slot": slot, "seed": run.seed, "lr": run.lr,
                     "entry": runnable(run.entry)}  # fmt: skip
            _retrying(index.enqueue_trial, {}, user_attrs={"optcore": attrs, **dashboard.trial_attrs(attrs)})
        k, s_count = self.protocol["trials"], self.protocol["studies"]
        tunable = [e["name"] for e in entries if self.meta["spaces"].get(e["name"])]
        for s in range(s_count if k else 0):
            seed = self.protocol["sampler_seed"] + s
            for e, config in enumerate(tunable):
                study = _retrying(optuna.create_study, study_name=self._tune_name(config, s), storage=self.storage,
                                  direction="minimize", load_if_exists=True, sampler=_sampler(),
                                  pruner=self._pruner())  # fmt: skip
                _retrying(study.set_user_attr, "sampler", {"type": "QMCSampler", "qmc_type": self.protocol["sampler"],
                                                           "scramble": True, "seed": seed})  # fmt: skip
                _retrying(dashboard.label_study, study, self.meta)
                for j, point in enumerate(draw_points(self.meta["spaces"][config], k, seed, self.protocol["sampler"])):
                    attrs = {"phase": "tune", "config": config, "study": s, "slot": (j * s_count + s) * len(tunable) + e,
                             "seed": self.protocol["tuning_seed"], "lr": point.get("lr"), "point": point}  # fmt: skip
                    _retrying(study.enqueue_trial, point, user_attrs={"optcore": attrs, **dashboard.trial_attrs(attrs)})
                self._studies[study.study_name] = study
        _retrying(index.set_user_attr, "ready", True)

    def _pruner(self) -> Any:
        """Optuna's median rule on the training loss when ``--prune`` (after a quarter
        of the run and two finished trials of the study); no pruning otherwise."""
        optuna = _optuna()
        if not self.protocol.get("prune"):
            return optuna.pruners.NopPruner()
        return optuna.pruners.MedianPruner(n_startup_trials=2, n_warmup_steps=max(1, self.meta["steps"] // 4))

    def _tune_name(self, config: str, s: int) -> str:
        return f"{self.name}/{config}/tune-{s}"

    def _seeds_name(self, config: str) -> str:
        return f"{self.name}/{config}/seeds"

    def tunable(self) -> list[str]:
        return [n for n in self.entries if self.meta["spaces"].get(n)] if self.protocol["trials"] else []

    def _study(self, study_name: str) -> Any:
        if study_name not in self._studies:
            optuna = _optuna()
            try:
                pruner = self._pruner() if "/tune-" in study_name else None
                self._studies[study_name] = optuna.load_study(study_name=study_name, storage=self.storage,
                                                              sampler=_sampler(), pruner=pruner)  # fmt: skip
            except KeyError:
                return None
        return self._studies[study_name]

    def studies(self) -> list[tuple[str, Any]]:
        """``(phase, study)`` of every study that exists now, in the order their trials are taken."""
        out = [("defaults", self._study(self.name))]
        out += [("tune", self._study(self._tune_name(c, s))) for s in range(self.protocol["studies"]) for c in self.tunable()]
        out += [("seeds", self._study(self._seeds_name(c))) for c in self.tunable()]
        return [(phase, study) for phase, study in out if study is not None]

    def check_code(self, trust: Any) -> None:
        """Refuse, before anything runs, a stored sweep that names code this worker does not name
        (:mod:`.trust`): its task, its configs and its waiting trials' entries. A trial enqueued
        later is judged when it is claimed."""
        self.trust = trust
        trust.check_tasks(self.name, [self.meta["task"]["spec"]])
        for entry in self.meta["entries"]:
            trust.check_entry(self.name, entry)
        waiting = (_optuna().trial.TrialState.WAITING,)
        for _, study in self.studies():
            for t, attrs in self._valid(study, waiting):
                if attrs.get("entry") is not None:
                    trust.check_entry(study.study_name, attrs["entry"], t.number)

    # ------------------------------------------------------------ trials
    def _trials(self, study: Any, states: Any = None) -> list[Any]:
        try:
            return list(_retrying(study.get_trials, deepcopy=False, states=states))
        except ValueError:  # json.JSONDecodeError: an attribute written around Optuna; read the others one by one
            return self._readable_trials(study, states)

    def _readable_trials(self, study: Any, states: Any) -> list[Any]:
        out = []
        for number in range(records.MAX_PLANNED):
            try:
                trial_id = _retrying(self.storage.get_trial_id_from_study_id_trial_number, study._study_id, number)
            except KeyError:  # past the last trial
                break
            try:
                trial = _retrying(self.storage.get_trial, trial_id)
            except (KeyError, ValueError) as exc:
                named = records.where(study.study_name, "attributes", number)
                self.bad.setdefault(named, f"Bad stored record ({named}): not JSON ({records.clean_text(exc)}).")
                continue
            if states is None or trial.state in states:
                out.append(trial)
        return out

    def _valid(self, study: Any, states: Any = None) -> list[tuple[Any, dict[str, Any]]]:
        """``(trial, attrs)`` of the trials whose ``optcore`` record is good; the others are named in :attr:`bad`."""
        out = []
        for t in self._trials(study, states):
            attrs = self._record(study.study_name, t, "optcore")
            if attrs is not None:
                out.append((t, attrs))
        return out

    def _record(self, study_name: str, t: Any, key: str) -> dict[str, Any] | None:
        """Trial ``t``'s user attribute ``key`` (``optcore`` or ``result``) checked by its model, once per
        trial; ``None`` for a bad one, which is named in :attr:`bad` (study, trial number, key: why)."""
        cached = (t._trial_id, key, key in t.user_attrs)
        if cached not in self._checked:
            named = records.where(study_name, key, t.number)
            try:
                if key not in t.user_attrs:
                    raise ConfigError(f"Bad stored record ({named}): missing.", problems=[(named, "missing")])
                record = records.parse(records.TrialRecord if key == "optcore" else records.RunResult,
                                       t.user_attrs[key], named)  # fmt: skip
                if key == "optcore" and record.config not in self.entries:
                    raise ConfigError(f"Bad stored record ({named}): config {records.clean_text(record.config)!r} is "
                                      "not one of the sweep's.", problems=[(named, "unknown config")])  # fmt: skip
                self._checked[cached] = records.plain(record)
            except ConfigError as exc:
                self.bad.setdefault(named, str(exc))
                self._checked[cached] = None
        return self._checked[cached]

    def _retries(self, study_name: str, t: Any) -> int:
        try:
            return records.retries(study_name, t.number, t.system_attrs.get("retry_history"))
        except ConfigError as exc:
            self.bad.setdefault(records.where(study_name, "retry_history", t.number), str(exc))
            return 0

    def claim(self, admit: Callable[[Claimed], bool], refused: set[tuple[str, int]]) -> Claimed | None:
        """Take the next waiting trial this worker's ``admit`` allows (plan order), or ``None``."""
        optuna = _optuna()
        waiting = [(PHASES.index(phase), attrs["slot"], t.number, study, t, attrs)
                   for phase, study in self.studies()
                   for t, attrs in self._valid(study, (optuna.trial.TrialState.WAITING,))]  # fmt: skip
        for _, slot, _, study, frozen, stored in sorted(waiting, key=lambda w: w[:3]):
            attrs = dict(stored)
            key = (study.study_name, slot)
            if key in refused:
                continue
            if attrs.get("entry") is not None:  # what it builds came from the storage: only code this worker names
                self._trusted().check_entry(study.study_name, attrs["entry"], frozen.number)
            claimed = Claimed(study, frozen._trial_id, frozen.number, attrs, self._entry(attrs))
            if not admit(claimed):
                refused.add(key)
                continue
            try:
                taken = _retrying(self.storage.set_trial_state_values, frozen._trial_id,
                                  state=optuna.trial.TrialState.RUNNING)  # fmt: skip
            except optuna.exceptions.UpdateFinishedTrialError:
                taken = False
            if taken:
                claimed.trial = optuna.trial.Trial(study, frozen._trial_id)
                space = (self.meta["spaces"].get(claimed.config) or {}) if claimed.phase == "tune" else {}
                for name, dim in space.items():
                    claimed.trial.suggest_float(name, dim["low"], dim["high"], log=dim["log"])
                self._show_params(claimed, study, taken=list(space))
                return claimed
        return None

    def _show_params(self, claimed: Claimed, study: Any, taken: Sequence[str]) -> None:
        """The trial's optimizer and hyper-parameters as params, for Optuna's tools (:mod:`.dashboard`)."""
        configs = [claimed.config] if claimed.phase != "defaults" else list(self.entries)
        if claimed.phase == "tune":  # its entry is made here from the point: show it as the others show theirs
            for key, text in dashboard.config_attrs(claimed.entry).items():
                _retrying(self.storage.set_trial_user_attr, claimed.trial_id, key, text)
        for name, value, distribution in dashboard.params(claimed.entry, claimed.config, configs, taken):
            try:
                _retrying(self.storage.set_trial_param, claimed.trial_id, name, value, distribution)
            except _optuna().exceptions.UpdateFinishedTrialError:
                return  # failed as stale meanwhile: its retry shows them
            except ValueError:  # a param of that name and another kind in this study: the first one stays
                continue

    def _entry(self, attrs: Mapping[str, Any]) -> dict[str, Any]:
        if attrs["phase"] == "tune":
            return apply_point(self.entries[attrs["config"]], attrs["point"], self.meta["steps"])
        return dict(attrs["entry"])

    def finish(self, claimed: Claimed, result: dict[str, Any]) -> None:
        """Record ``result`` on the trial and tell Optuna how it ended."""
        optuna = _optuna()
        state = optuna.trial.TrialState
        try:
            _retrying(self.storage.set_trial_user_attr, claimed.trial_id, "result", result)
            self._show_result(claimed, result)
            if result["status"] == "ok" and result["final"] is not None:
                _retrying(claimed.study.tell, claimed.number, float(result["final"]))
            elif result["status"] == "pruned":
                _retrying(claimed.study.tell, claimed.number, state=state.PRUNED)
            else:
                _retrying(claimed.study.tell, claimed.number, state=state.FAIL)
        except (optuna.exceptions.UpdateFinishedTrialError, RuntimeError, ValueError):
            # This worker missed its heartbeats for so long that another one failed the
            # trial as stale; Optuna's retry of it runs (or ran) there, and counts instead.
            if not _retrying(self.storage.get_trial, claimed.trial_id).state.is_finished():
                raise

    def _show_result(self, claimed: Claimed, result: Mapping[str, Any]) -> None:
        """The run's outcome and learning curve under readable names, for Optuna's tools (:mod:`.dashboard`);
        a step the pruner was told already keeps its value, and a pruned run's curve ends where it was pruned."""
        for key, value in dashboard.result_attrs(result).items():
            _retrying(self.storage.set_trial_user_attr, claimed.trial_id, key, value)
        reported = _retrying(self.storage.get_trial, claimed.trial_id).intermediate_values
        losses = list(result.get("losses") or [])
        if result["status"] == "pruned" and result.get("pruned_at"):
            losses = losses[: int(result["pruned_at"])]
        for step, loss in dashboard.curve(losses, self.meta["steps"]):
            if step not in reported:
                _retrying(self.storage.set_trial_intermediate_value, claimed.trial_id, step, loss)

    def abandon(self, claimed: Claimed) -> None:
        """A trial stopped by Ctrl-C: failed, and enqueued again (as a killed worker's
        would be), so that the next run of the sweep runs it."""
        optuna = _optuna()
        try:
            _retrying(claimed.study.tell, claimed.number, state=optuna.trial.TrialState.FAIL)
        except Exception:  # noqa: BLE001 - already finished by a stale-trial check: it was retried there
            return
        frozen = _retrying(self.storage.get_trial, claimed.trial_id)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)  # the callback is marked experimental
            retry = optuna.storages.RetryHeartbeatStaleTrialCallback(max_retry=None)
        retry(claimed.study, frozen)

    def heartbeat(self, trial_ids: Sequence[int]) -> None:
        for trial_id in trial_ids:
            try:
                _retrying(self.storage.record_heartbeat, trial_id)
            except Exception:  # noqa: BLE001 - a missed beat is retried at the next interval
                pass

    def fail_stale(self) -> None:
        """Fail the trials of workers that fell silent; Optuna enqueues them again."""
        optuna = _optuna()
        for _, study in self.studies():
            try:
                optuna.storages.fail_stale_trials(study)
            except optuna.exceptions.StorageInternalError:
                pass

    # ------------------------------------------------------------ phases
    def _slots(self, study: Any) -> dict[int, str]:
        """Each slot's state: ``done`` (a run ended: complete, pruned, failed or
        diverged), ``pending`` (waiting or running) or ``lost`` (killed more than
        :data:`MAX_RETRY` times)."""
        rank = {"lost": 0, "pending": 1, "done": 2}
        slots: dict[int, str] = {}
        for t, attrs in self._valid(study):
            slot = attrs["slot"]
            if t.state.name in ("COMPLETE", "PRUNED") or "result" in t.user_attrs:
                state = "done"
            elif t.state.name in ("WAITING", "RUNNING"):
                state = "pending"
            else:
                state = "lost"
            if slot not in slots or rank[state] > rank[slots[slot]]:
                slots[slot] = state
        return slots

    def _tuning_done(self, config: str) -> bool:
        for s in range(self.protocol["studies"]):
            study = self._study(self._tune_name(config, s))
            if study is None or "pending" in self._slots(study).values():
                return False
        return True

    def advance(self) -> None:
        """Create the re-seed study of every config whose tuning has finished."""
        optuna = _optuna()
        for config in self.tunable():
            name = self._seeds_name(config)
            if self._study(name) is not None:
                self._complete_if_stuck(config)
                continue
            if not self._tuning_done(config):
                continue
            chosen = self._chosen(config)
            if chosen is None:
                continue  # no tuning trial finished: nothing to re-seed
            try:
                study = optuna.create_study(study_name=name, storage=self.storage, direction="minimize",
                                            sampler=_sampler())  # fmt: skip
            except optuna.exceptions.DuplicatedStudyError:
                continue  # another worker enqueues them
            self._studies[name] = study
            _retrying(dashboard.label_study, study, self.meta)
            self._enqueue_seeds(config, study, chosen)

    def _enqueue_seeds(self, config: str, study: Any, chosen: Mapping[str, Any], skip: set[int] = frozenset()) -> None:  # type: ignore[assignment]
        entry = runnable(apply_point(self.entries[config], chosen["point"], self.meta["steps"]))
        for j, seed in enumerate(self.meta["seeds"]):
            if j in skip:
                continue
            attrs = {"phase": "seeds", "config": config, "slot": j, "seed": seed, "lr": chosen["lr"],
                     "point": chosen["point"], "entry": entry}  # fmt: skip
            _retrying(study.enqueue_trial, {}, user_attrs={"optcore": attrs, **dashboard.trial_attrs(attrs)})
        _retrying(study.set_user_attr, "ready", True)

    def _complete_if_stuck(self, config: str) -> None:
        study = self._study(self._seeds_name(config))
        if records.is_ready(study_attrs(study).get("ready")):
            return
        first = self._not_ready_since.setdefault(config, time.monotonic())
        if time.monotonic() - first > READY_TIMEOUT_S:
            chosen = self._chosen(config)
            if chosen is not None:
                self._enqueue_seeds(config, study, chosen, skip=set(self._slots(study)))

    def _chosen(self, config: str) -> dict[str, Any] | None:
        summary = tuned_summary([config], self._tune_trials(config), self.meta["spaces"])
        return summary[config]["chosen"]

    def _tune_trials(self, config: str | None = None) -> list[dict[str, Any]]:
        out = []
        for s in range(self.protocol["studies"]) if self.protocol["trials"] else ():
            for c in [config] if config else self.tunable():
                study = self._study(self._tune_name(c, s))
                for t, attrs in self._valid(study) if study is not None else ():
                    result = self._record(study.study_name, t, "result") if "result" in t.user_attrs else None
                    if result is None or attrs["phase"] != "tune":
                        continue
                    out.append({"config": c, "study": s, "slot": attrs["slot"], "number": t.number,
                                "point": attrs["point"], "lr": attrs.get("lr"), "final": result["final"],
                                "status": result["status"], "best": result.get("best"),
                                "retried": self._retries(study.study_name, t)})  # fmt: skip
        return out

    def pending(self) -> bool:
        """Whether some planned trial has not finished yet (here or at another worker)."""
        for _, study in self.studies():
            if "pending" in self._slots(study).values():
                return True
        for config in self.tunable():
            study = self._study(self._seeds_name(config))
            if study is None:
                if not self._tuning_done(config) or self._chosen(config) is not None:
                    return True
            elif not records.is_ready(study_attrs(study).get("ready")):
                return True
        return False

    def planned(self) -> int:
        """Trials known up front: defaults, tuning, and one re-seed per seed and tuned config."""
        defaults = len(plan(self.meta["entries"], self.meta["seeds"], self.meta["lr_sweep"], self.meta["lrs"]))
        tuned = len(self.tunable())
        return defaults + tuned * (self.protocol["trials"] * self.protocol["studies"] + len(self.meta["seeds"]))

    # ------------------------------------------------------------ running
    def run(
        self,
        execute: Callable[[Claimed], dict[str, Any]],
        *,
        jobs: int,
        admit: Callable[[Claimed], bool],
        finished: Callable[[Claimed, dict[str, Any]], None],
        started: Callable[[Claimed], None] = lambda c: None,
        poll_s: float = 0.5,
    ) -> None:
        """Take and run trials until none is left (or ``admit`` refuses the rest),
        up to ``jobs`` at a time: ``execute(claimed)`` runs in a thread of its own
        (here, with ``jobs=1``), ``finished`` is called in this thread after the
        trial is told. KeyboardInterrupt stops the trials in flight (``claimed.stop``),
        enqueues them again and propagates."""
        refused: set[tuple[str, int]] = set()
        inflight: dict[Future[dict[str, Any]] | None, Claimed] = {}
        beat_stop = threading.Event()
        interval = float(self.storage.get_heartbeat_interval() or DEFAULT_HEARTBEAT_S)

        def beat() -> None:
            while not beat_stop.wait(interval):
                try:
                    running = [c.trial_id for c in list(inflight.values())]
                except RuntimeError:  # the dict changed while read: beat at the next interval
                    continue
                self.heartbeat(running)

        beater = threading.Thread(target=beat, name="optcore-heartbeat", daemon=True)
        beater.start()
        pool = ThreadPoolExecutor(max_workers=jobs, thread_name_prefix="optcore-run") if jobs > 1 else None
        try:
            while True:
                while len(inflight) < jobs:
                    claimed = self.claim(admit, refused)
                    if claimed is None:
                        break
                    self.heartbeat([claimed.trial_id])
                    started(claimed)
                    if pool is None:  # here, in this thread: Ctrl-C reaches an in-process run at once
                        inflight[None] = claimed
                        result = execute(claimed)
                        del inflight[None]
                        self.finish(claimed, result)
                        finished(claimed, result)
                    else:
                        inflight[pool.submit(execute, claimed)] = claimed
                if not inflight:
                    self.advance()
                    if self.claim_possible(refused):
                        continue
                    if not self.pending():
                        break
                    if refused and not self._others_running():
                        break  # what is left is refused by the budget
                    self.fail_stale()
                    time.sleep(poll_s)
                    continue
                done, _ = wait([f for f in inflight if f is not None], timeout=0.25, return_when=FIRST_COMPLETED)
                for future in sorted(done, key=lambda f: inflight[f].attrs["slot"]):
                    claimed = inflight.pop(future)
                    result = future.result()
                    self.finish(claimed, result)
                    finished(claimed, result)
        except BaseException:
            for claimed in inflight.values():
                claimed.stop.set()
            if pool is not None:
                pool.shutdown(wait=True, cancel_futures=True)
            for claimed in list(inflight.values()):
                self.abandon(claimed)
            raise
        finally:
            beat_stop.set()
            if pool is not None:
                pool.shutdown(wait=True)

    def claim_possible(self, refused: set[tuple[str, int]]) -> bool:
        """Whether a waiting trial that the budget did not refuse exists."""
        optuna = _optuna()
        return any((study.study_name, attrs["slot"]) not in refused
                   for _, study in self.studies()
                   for _, attrs in self._valid(study, (optuna.trial.TrialState.WAITING,)))  # fmt: skip

    def _others_running(self) -> bool:
        optuna = _optuna()
        return any(self._trials(study, (optuna.trial.TrialState.RUNNING,)) for _, study in self.studies())

    def _trusted(self) -> Any:
        if self.trust is None:
            raise ConfigError(f"The comparison {self.name!r} was opened to report it; it runs no trial.")
        return self.trust

    def latest_results(self, study: Any) -> list[tuple[int, dict[str, Any], Any]]:
        """``(slot, result, trial)`` of each slot's last finished run (a retried slot keeps its last);
        a trial with a bad record is left out and named in :attr:`bad`."""
        by_slot: dict[int, tuple[int, dict[str, Any], Any]] = {}
        for t, attrs in self._valid(study):
            result = self._record(study.study_name, t, "result") if "result" in t.user_attrs else None
            slot = attrs["slot"]
            if result is not None and (slot not in by_slot or t.number > by_slot[slot][2].number):
                by_slot[slot] = (slot, result, t)
        return [by_slot[s] for s in sorted(by_slot)]


# ------------------------------------------------------------------ results
def collect(sweep: Sweep) -> dict[str, Any]:
    """The comparison as ``results.json`` holds it, from the storage alone: the
    runs at defaults in plan order and their rows, and with ``--trials`` the tuning
    (per optimizer: studies, score, chosen point, unstable region) and the re-seeded
    runs with their rows."""
    meta = sweep.meta
    entries = meta["entries"]
    results = [result for _, result, _ in sweep.latest_results(sweep._study(sweep.name))]
    doc: dict[str, Any] = {
        "task": meta["task"], "summary": meta["summary"],
        "loss_label": meta.get("loss_label", "loss"),
        "protocol": {**sweep.protocol, "seeds": meta["seeds"]}, "sweep": {"name": sweep.name, "planned_trials": sweep.planned()},
        "planned_runs": len(plan(entries, meta["seeds"], meta["lr_sweep"], meta["lrs"])),
        "results": results, "rows": summarise(entries, results),
    }  # fmt: skip
    if sweep.protocol["trials"]:
        reseeds = []
        for config in sweep.tunable():
            study = sweep._study(sweep._seeds_name(config))
            reseeds += [result for _, result, _ in sweep.latest_results(study)] if study is not None else []
        names = [e["name"] for e in entries]
        optimizers = tuned_summary(names, sweep._tune_trials(), meta["spaces"])
        rows = summarise([e for e in entries if optimizers[e["name"]]["chosen"]], reseeds)
        for row in rows:
            row["swept"] = True  # the chosen point of a search
            row["score"] = optimizers[row["name"]]["score"]
        doc["tuned"] = {"optimizers": optimizers, "results": reseeds, "rows": rows}
    doc["isolation"], doc["memory_note"] = run_notes(results + doc.get("tuned", {}).get("results", []), meta)
    return doc

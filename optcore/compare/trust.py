"""Which stored fields of a shared sweep a worker may run: only code it names itself.

Anyone who can write a team's study database writes what every joining worker
reads, so a stored field that names code (a task spec, an optimizer or
scheduler ``type``) is judged here before anything is imported. optcore's own
tasks and the names that resolve without importing a module (torch's classes,
optcore's built-ins, installed plugins and known packages, names registered in
this process) are taken from the storage; anything else runs only where this
worker's own command line (``--task``, ``--optimizers``, ``--config``) names the
same text, and is refused by name otherwise, with the command to join with.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from optcore import ConfigError, OptcoreError

from .._import_paths import trusted_tops
from .._registry import OPTIMIZERS, resolve
from .._values import clean_text
from ..guards import without_imports
from ..schedulers._registry import SCHEDULERS, resolve_scheduler
from .tasks import BUILTIN


def code_names(config: Any, kind: str = "optimizer") -> Iterator[tuple[str, Any]]:
    """``(kind, type)`` of every ``type`` in an optimizer (or ``lr_scheduler``) config,
    nested ones too (a wrapper's optimizer, a composite's fallback, staged schedulers)."""
    if isinstance(config, str):
        yield kind, config
    elif isinstance(config, Mapping):
        for key, value in config.items():
            if key == "type":
                yield kind, value
            elif key in ("lr_scheduler", "scheduler"):
                yield from code_names(value, "scheduler")
            else:
                yield from code_names(value, kind)
    elif isinstance(config, (list, tuple)):
        for item in config:
            yield from code_names(item, kind)


def entry_code(entry: Mapping[str, Any]) -> list[tuple[str, Any]]:
    """Every code name of one compare entry (its optimizer's and its scheduler's types)."""
    return [*code_names(entry.get("optimizer")), *code_names(entry.get("lr_scheduler"), "scheduler")]


def _trusted_tops() -> set[str]:
    """:func:`optcore._import_paths.trusted_tops` of optimizers and schedulers, and optcore itself."""
    return {"optcore", *trusted_tops(OPTIMIZERS.group, SCHEDULERS.group)}


def _top(text: str) -> str:
    module = text.partition(":")[0] if ":" in text else text.rpartition(".")[0]
    return module.strip().partition(".")[0]


def imports_nothing_foreign(kind: str, text: Any) -> bool:
    """Whether resolving ``text`` (an optimizer or scheduler type) imports no module
    but optcore's, torch's, an installed plugin's or a known package's: judged
    without importing (:func:`optcore.guards.without_imports`)."""
    if not isinstance(text, str) or not text.strip() or len(text) > 200 or not text.isprintable():
        return False
    path = ":" in text or "." in text
    try:
        with without_imports():
            spec = (resolve if kind == "optimizer" else resolve_scheduler)(text)
    except OptcoreError:
        # a plain name that does not resolve imports nothing: its build fails, by name, in the table
        return not path or _top(text) in _trusted_tops()
    if spec.source != "package":
        return True  # torch's, optcore's, a plugin's or a name registered in this process
    tops = _trusted_tops()
    return _top(str(spec.qualified)) in tops and (not path or _top(text) in tops)


@dataclass(frozen=True)
class Trust:
    """What this worker names itself: its ``--task`` specs and its entries' types."""

    tasks: frozenset[str]
    types: frozenset[str]
    join: str  # the command a worker joins with, to which a refusal adds what to name

    @classmethod
    def of(cls, tasks: str | None, entries: Iterable[Mapping[str, Any]], join: str) -> Trust:
        own = frozenset(t.strip() for t in (tasks or "").split(",") if t.strip())
        types = frozenset(t for e in entries for _, t in entry_code(e) if isinstance(t, str))
        return cls(own, types, join)

    def check_tasks(self, study: str, specs: Sequence[str]) -> None:
        """Refuse a stored task spec that names user code this worker's own ``--task`` does not name."""
        foreign = [s for s in specs if s not in BUILTIN and s not in self.tasks]
        if not foreign:
            return
        spec = clean_text(foreign[0], 200)
        task = ",".join(specs) if len(specs) > 1 else specs[0]
        raise ConfigError(
            f"The comparison {clean_text(study, 200)!r} in this storage runs the task {spec!r}, which is user code "
            "(a module path or a file), and this worker's own --task does not name it: a worker runs only code it "
            f"names itself (optcore's own tasks are {', '.join(BUILTIN)}). If you trust that code on this machine, "
            f"join with: {self.join} --task {shlex.quote(clean_text(task, 400))}",
            problems=[("task", "user code named by the storage")],
            target=spec,
        )

    def check_entry(self, study: str, entry: Mapping[str, Any], trial: int | None = None) -> None:
        """Refuse a stored entry one of whose types would import a module this worker did not name."""
        for kind, text in entry_code(entry):
            if text in self.types or imports_nothing_foreign(kind, text):
                continue
            at = f", trial {trial}" if trial is not None else ""
            raise ConfigError(
                f"The comparison {clean_text(study, 200)!r} in this storage{at} names the {kind} type "
                f"{clean_text(text, 200)!r} (config {clean_text(entry.get('name'), 200)!r}), which cannot be "
                "resolved without importing a module this worker did not name: a worker runs only code it names "
                "itself. If you trust that code on this machine, name it in this worker's own --optimizers or "
                f"--config (the configs of the worker that started the sweep): {self.join} --config FILE; else "
                "start a sweep of your own with another --study.",
                problems=[(kind, "code named by the storage")],
                target=clean_text(text, 200),
            )

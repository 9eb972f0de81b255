"""``optcore check FILE...``: the build's own validation, without parameters.

Every optimizer config in the file goes through :func:`optcore.plan` (the
road every build takes) and then its classes' own constructors over stand-in
parameters on the CPU (:mod:`._trial`), every scheduler config through
:func:`optcore.schedulers.validate_scheduler_config`.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from .._errors import OptcoreError


#: the run length a schedule is checked with when it comes from code: long enough for any warm-up
STAND_IN_LENGTH = 10**9


def check_config(
    data: Any,
    *,
    allow_import_paths: bool | None = None,
    num_training_steps: int | None = None,
    notes: list[str] | None = None,
) -> list[str]:
    """Validate a config (optimizer alone, optimizer + lr_scheduler, or an
    ``optcore compare`` file) exactly as a build would, without parameters and
    without allocating; return the error messages (empty when valid).

    ``num_training_steps`` is what ``optcore.build(..., num_training_steps=N)``
    would pass (it wins over the file's, as there). Without it, a schedule whose
    length the file does not give is taken to get it at build, as the README's
    pattern does: it is checked with a stand-in length and a line saying so is
    appended to ``notes``."""
    from .._plan import plan  # pydantic and torch: imported when a check runs, not for --help
    from ._trial import trial_construct

    errors: list[str] = []
    try:
        configs, total = configs_of(data)
    except OptcoreError as exc:
        return [_Message(exc)]
    total = num_training_steps if num_training_steps is not None else total
    for _, kind, cfg in configs:
        try:
            if kind == "lr_scheduler":
                _check_scheduler(cfg, total, allow_import_paths, notes)
            else:
                trial_construct(plan(cfg, allow_import_paths=allow_import_paths))
        except OptcoreError as exc:
            errors.append(_Message(exc))
    return errors


def configs_of(data: Any) -> tuple[list[tuple[str, str, Any]], Any]:
    """The configs a file holds as ``(label, kind, config)``, kind ``"optimizer"`` or
    ``"lr_scheduler"`` (an optimizer alone, an optimizer with a schedule, or an
    ``optcore compare`` file's runs, labelled by name), and the file's run length."""
    from .._config import to_plain

    plain = to_plain(data)
    total = plain.get("num_training_steps") if isinstance(plain, dict) else None
    if isinstance(plain, dict) and ("lr_scheduler" in plain or "scheduler" in plain):
        sched = plain.get("lr_scheduler", plain.get("scheduler"))
        return [("", "optimizer", plain.get("optimizer")), ("", "lr_scheduler", sched)], total
    if isinstance(plain, list) or (isinstance(plain, dict) and "configs" in plain):
        from ..compare.lineup import entries_from_file  # an `optcore compare` file: a list of runs

        entries, options = entries_from_file(plain)
        configs = []
        for entry in entries:
            configs.append((str(entry.get("name", "")), "optimizer", entry.get("optimizer", entry)))
            if entry.get("lr_scheduler") is not None:
                configs.append((str(entry.get("name", "")), "lr_scheduler", entry["lr_scheduler"]))
        return configs, options.get("num_training_steps", total)
    return [("", "optimizer", plain)], None


def scheduler_plan(cfg: Any, total: Any, allow_import_paths: bool | None = None) -> tuple[Any, dict[str, Any], str | None]:
    """The scheduler's spec, its validated arguments and, when its length must come
    from the code (``total`` is ``None`` and the config gives none), a note saying so
    (the arguments then hold a stand-in length)."""
    from ..schedulers import validate_scheduler_config

    try:
        spec, kwargs = validate_scheduler_config(cfg, total, allow_import_paths=allow_import_paths)
        return spec, kwargs, None
    except OptcoreError:
        if total is not None:
            raise
        # the length comes from code: what the file says is checked with a stand-in length
        spec, kwargs = validate_scheduler_config(cfg, STAND_IN_LENGTH, allow_import_paths=allow_import_paths)
    return spec, kwargs, (
        f"{spec.name} needs the length of the run and the file does not give it, so it must come from the "
        "code: optcore.build(config, model, num_training_steps=N)."
    )


def _check_scheduler(cfg: Any, total: Any, allow_import_paths: bool | None, notes: list[str] | None) -> None:
    _, _, note = scheduler_plan(cfg, total, allow_import_paths)
    if note and notes is not None:
        notes.append(f"{note} Checked without it; pass --num-training-steps N to check with yours.")


class _Message(str):
    """An error's message that knows how many problems it names (a ConfigError
    lists every bad field of one config), so the count a file gets is theirs."""

    problems: int

    def __new__(cls, exc: OptcoreError) -> _Message:  # noqa: PYI034 - a str subclass, built whole here
        message = super().__new__(cls, str(exc))
        message.problems = max(1, len(getattr(exc, "problems", None) or ()))
        return message


def cmd_check(args: argparse.Namespace) -> int:
    """Each file checked on its own (``optcore check configs/*.yaml`` in CI): a
    bad one is named with its errors, and the others are still checked."""
    from ..files import load_config_file

    failed = 0
    for path in args.config:
        notes: list[str] = []
        try:
            errors = check_config(load_config_file(path), num_training_steps=args.num_training_steps, notes=notes)
        except OptcoreError as exc:
            errors = [_Message(exc)]
        if errors:
            failed += 1
            count = sum(getattr(e, "problems", 1) for e in errors)
            print(f"{path}: {count} error{'s' if count > 1 else ''}", file=sys.stderr)
            for e in errors:
                print("  " + e.replace("\n", "\n  "), file=sys.stderr)
        else:
            print(f"{path}: OK")
            for note in notes:
                print(f"  note: {note}")
    if failed and len(args.config) > 1:
        print(f"{failed} of {len(args.config)} files failed", file=sys.stderr)
    return 1 if failed else 0

"""The exceptions optcore raises: each says what to do next, and is also the
standard type callers already catch (``KeyError`` for an unknown name,
``ValueError`` for a bad value).
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from ._values import clean_text, short_repr


class OptcoreError(Exception):
    """Base class of every error optcore raises on purpose."""

    message: str

    def __str__(self) -> str:  # KeyError would repr() the message otherwise
        return getattr(self, "message", super().__str__())


class OptimizerNotFoundError(OptcoreError, KeyError):
    """A ``type`` name that resolves nowhere, with the places searched and close names;
    ``headline`` replaces the first line where the name says more than that it is
    unknown (a plugin distribution that is not installed)."""

    kind = "optimizer"

    def __init__(
        self, name: str, searched: Sequence[str] = (), suggestions: Sequence[str] = (), hint: str = "",
        headline: str = "",
    ) -> None:
        self.name = name
        self.searched = list(searched)
        self.suggestions = list(suggestions)
        lines = [clean_text(headline, 240) if headline else f"No {self.kind} named {short_repr(name, 120)}."]
        if self.suggestions:
            lines.append("Did you mean: " + ", ".join(clean_text(s) for s in self.suggestions) + "?")
        if self.searched:
            lines.append("Looked in: " + "; ".join(clean_text(s) for s in self.searched) + ".")
        lines.append(
            clean_text(hint, 480)
            if hint
            else f"Run `optcore list{' --schedulers' if self.kind == 'scheduler' else ''}` "
            "to see every available name, install the plugin that provides it, "
            "or give a dotted path such as 'package.module:Class'."
        )
        self.message = "\n".join(lines)
        super().__init__(self.message)


class SchedulerNotFoundError(OptimizerNotFoundError):
    """A scheduler ``type`` name that resolves nowhere."""

    kind = "scheduler"


class ConfigError(OptcoreError, ValueError):
    """A configuration that cannot be used as given: ``problems`` holds one
    ``(field, message)`` pair per bad field, ``accepted`` the accepted fields."""

    def __init__(
        self,
        message: str,
        problems: Iterable[tuple[str, str]] = (),
        accepted: Sequence[str] = (),
        target: str | None = None,
    ) -> None:
        self.problems = list(problems)
        self.accepted = list(accepted)
        self.target = target
        self.message = message
        super().__init__(message)


class StepError(OptcoreError, RuntimeError):
    """A ``step()`` that cannot run on what it was given, raised before anything changes (docs/contract.md)."""

    def __init__(self, message: str, param: str | None = None) -> None:
        self.message, self.param = message, param
        super().__init__(message)


class PluginLoadError(OptcoreError, ImportError):
    """A plugin entry point that failed to load, naming the distribution to fix."""

    def __init__(
        self, distribution: str | None, entry_point: str, cause: BaseException | str, version: str | None = None
    ) -> None:
        self.distribution = distribution
        self.version = version
        self.entry_point = entry_point
        self.cause = cause
        dist = clean_text(distribution) if distribution else "<unknown distribution>"
        if version:
            dist = f"{dist} {clean_text(version)}"
        #: the cause in one line, cleaned and cut: what a message may quote
        self.detail = clean_text(f"{type(cause).__name__}: {cause}" if isinstance(cause, BaseException) else cause, 480)
        self.message = (
            f"Plugin {dist} failed to load entry point {short_repr(entry_point, 240)}: {self.detail}\n"
            f"Reinstall or upgrade {clean_text(distribution) if distribution else 'the plugin'}, uninstall it, or set "
            "OPTCORE_PLUGINS to load only the plugins you need."
        )
        super().__init__(self.message)


@contextmanager
def rejected_config(spec: Any, *, config: Any = None) -> Iterator[None]:
    """Whatever a constructor raises becomes a :class:`ConfigError` naming the class:
    third-party classes reject arguments with any exception, even a bare ``assert``."""
    try:
        yield
    except (OptcoreError, MemoryError):
        raise
    except (Exception, SystemExit) as exc:  # sys.exit() in a constructor ends no program; Ctrl-C still does
        detail = clean_text(str(exc), 400)
        if not detail:  # a bare `assert`: show the line that failed
            import traceback

            frames = traceback.extract_tb(exc.__traceback__)
            if frames and frames[-1].line:
                detail = f"`{clean_text(frames[-1].line, 200)}` failed ({frames[-1].filename}:{frames[-1].lineno})"
        name = getattr(spec, "qualified", None) or getattr(spec, "name", None) or repr(spec)
        shown = f" {short_repr(config, 200)}" if config is not None else ""
        raise ConfigError(
            f"{name} rejected its configuration{shown}: {type(exc).__name__}: {detail or '(no message)'}\n"
            f"Fix what it names: a hyper-parameter's value or the parameters it was given (`optcore show "
            f"{getattr(spec, 'name', name)}` lists the accepted fields and what it takes of the parameters).",
            problems=[("<constructor>", f"{type(exc).__name__}: {detail}")],
            target=getattr(spec, "name", None),
        ) from exc


def warn_user(message: str, category: type[Warning] = UserWarning) -> None:
    """``warnings.warn`` pointed at the first frame outside optcore and its
    plugins: the user's line, whichever of the roads (``resolve``, ``plan``,
    ``build_optimizer``, a wrapper, the CLI) led here. A fixed ``stacklevel``
    is right for one road only."""
    frame, level = sys._getframe(1), 1
    while frame.f_back is not None and frame.f_globals.get("__name__", "").startswith("optcore"):
        frame, level = frame.f_back, level + 1
    warnings.warn(message, category, stacklevel=level + 1)

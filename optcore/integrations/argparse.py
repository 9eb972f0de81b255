"""Command-line flags from schemas: fairseq's ``--optimizer lion --lr 3e-4``.

:func:`add_args` reads the command line twice, as fairseq and
pydantic-settings do. A first, forgiving pass finds ``--optimizer NAME`` (and
``--lr-scheduler NAME``); the second adds that optimizer's hyper-parameters
to the caller's parser as an argument group, each flag typed, with the
schema's default and description as its help. So ``--optimizer adamw --help``
lists AdamW's flags, and flags of an optimizer nobody chose never appear.
:func:`config_from_args` turns the parsed namespace back into a validated
config for :func:`optcore.build_optimizer` or :func:`optcore.build`.

Flags read as users expect: ``weight_decay`` is ``--weight-decay``; a boolean
is ``--amsgrad`` / ``--no-amsgrad``; a pair is ``--betas 0.9 0.99``; an
optional field takes ``none``. A field whose flag the parser already has (a
script's own ``--lr``, or AdamW's ``--eps`` met again in ReduceLROnPlateau)
moves to ``--optimizer-lr`` / ``--lr-scheduler-eps``; ``prefix="opt-"`` puts
every field under ``--opt-*`` instead.

A training script::

    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=3)
    optcore.add_args(parser)   # --optimizer NAME, --lr-scheduler NAME and their flags
    args = parser.parse_args()
    config = optcore.config_from_args(args, nested=True)
    optimizer, scheduler = optcore.build(config, model, num_training_steps=steps)

    $ python train.py --optimizer lion --lr 3e-4 --betas 0.9 0.99 --lr-scheduler cosine --warmup-steps 500
    $ python train.py --optimizer adamw --help      # AdamW's flags, defaults and help
"""

from __future__ import annotations

import argparse
import sys
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Union

from .._errors import ConfigError
from .._plan import plan

__all__ = ["add_args", "config_from_args"]

#: Namespace attributes add_args leaves behind for config_from_args.
_META = "_optcore_args"
_GIVEN = "_optcore_given"
#: Run length used only to validate a scheduler whose length build() will pass.
_STAND_IN_TOTAL = 10**12

_SELECTORS = {
    # kind: (flag, dest, group title, what)
    "optimizer": ("--optimizer", "optimizer", "optimizer", "optimizer"),
    "lr_scheduler": ("--lr-scheduler", "lr_scheduler", "lr scheduler", "scheduler"),
}


@dataclass(frozen=True)
class _Field:
    name: str  # the schema's field name
    dest: str  # the namespace attribute
    default: Any


@dataclass(frozen=True)
class _Chosen:
    """What add_args added for one kind: the name it resolved and its flags."""

    kind: str
    name: str | None  # None: the selector was added, nothing was chosen
    fields: tuple[_Field, ...]


# ------------------------------------------------------------------ public API
def add_args(
    parser: argparse.ArgumentParser,
    argv: Sequence[str] | None = None,
    *,
    prefix: str = "",
    default: str | None = None,
    scheduler: bool = True,
    default_scheduler: str | None = None,
) -> argparse.ArgumentParser:
    """Add ``--optimizer NAME`` and the chosen optimizer's flags to ``parser``.

    ``argv`` is the command line to look for ``--optimizer`` in. Without it,
    the flags are added when ``parser`` parses, from the list handed to
    ``parse_args`` (or ``sys.argv[1:]``). With
    ``default``, that optimizer's flags are added when the command line names
    none; without one, ``--optimizer`` is required.

    With ``scheduler=True``, ``--lr-scheduler NAME`` adds that scheduler's
    flags the same way (``default_scheduler`` is used when none is named;
    no scheduler otherwise).

    Field flags are ``--{prefix}{field-in-kebab-case}``. A flag the parser
    already has is not overwritten: the field becomes
    ``--{prefix}optimizer-{field}`` (``--{prefix}lr-scheduler-{field}``), and
    its namespace attribute ``optimizer_{field}``. Use ``prefix`` when your
    script has flags of its own like ``--lr`` and you want every optimizer
    flag under one recognisable prefix (``prefix="opt-"`` gives
    ``--opt-lr``, attribute ``opt_lr``).

    Raises :class:`~optcore.OptimizerNotFoundError` /
    :class:`~optcore.SchedulerNotFoundError` for a name that resolves nowhere.
    Returns ``parser``.
    """
    kinds = ("optimizer", "lr_scheduler") if scheduler else ("optimizer",)
    for kind in kinds:
        flag, dest, _, what = _SELECTORS[kind]
        if flag in parser._option_string_actions:
            raise ValueError(
                f"The parser already has {flag}; optcore.add_args adds it to choose the {what}. "
                f"Rename your own {flag}, or build the config yourself with optcore.build_optimizer."
            )
        fallback = default if kind == "optimizer" else default_scheduler
        parser.add_argument(
            flag,
            dest=dest,
            metavar="NAME",
            default=fallback,
            required=kind == "optimizer" and fallback is None,
            help=_selector_help(kind, fallback),
        )
    defaults = {"optimizer": default, "lr_scheduler": default_scheduler}
    if argv is not None:
        _add_chosen_fields(parser, argv, defaults, kinds, prefix)
        return parser
    # No argv: the fields are added when the parser parses, from the list it is
    # given (parse_args(["--optimizer", "lion", ...])) or else sys.argv.
    original = parser.parse_known_args

    def parse_known_args(args: Sequence[str] | None = None, namespace: Any = None) -> Any:
        if getattr(parser, _META, None) is None:
            _add_chosen_fields(parser, sys.argv[1:] if args is None else args, defaults, kinds, prefix)
        return original(args, namespace)

    setattr(parser, _META, None)
    parser.parse_known_args = parse_known_args  # type: ignore[method-assign]
    return parser


def _add_chosen_fields(
    parser: argparse.ArgumentParser,
    argv: Sequence[str],
    defaults: dict[str, str | None],
    kinds: tuple[str, ...],
    prefix: str,
) -> None:
    chosen = _probe(parser, argv, defaults, "lr_scheduler" in kinds)
    records = [
        _Chosen(kind, None, ()) if chosen.get(kind) is None else _add_fields(parser, kind, chosen[kind], prefix)  # type: ignore[arg-type]
        for kind in kinds
    ]
    setattr(parser, _META, tuple(records))
    parser.set_defaults(**{_META: tuple(records)})


def config_from_args(
    args: argparse.Namespace,
    *,
    nested: bool | None = None,
    full: bool = False,
    num_training_steps: int | None = None,
) -> dict[str, Any]:
    """The validated config that the flags parsed into ``args`` describe.

    Return shape:

    - no scheduler chosen: the optimizer config,
      ``{"type": "adamw", "lr": 0.01}`` (for :func:`optcore.build_optimizer`);
    - a scheduler chosen (or ``nested=True``): ``{"optimizer": {...},
      "lr_scheduler": {...}}`` (for :func:`optcore.build`; ``lr_scheduler``
      only when one was chosen).

    ``type`` is the name exactly as given on the command line. Only fields
    that were given (or changed on ``args`` after parsing) are included, so
    the optimizer's own defaults and optcore's choices (the fused kernel)
    still apply; ``full=True`` includes every field with its default.
    Values are checked with the schema: a bad one raises one
    :class:`~optcore.ConfigError` naming every bad field. A scheduler's run
    length may be left for ``optcore.build(..., num_training_steps=N)``; pass
    ``num_training_steps`` here to validate with it.
    """
    records: tuple[_Chosen, ...] | None = getattr(args, _META, None)
    if records is None:
        raise ConfigError(
            "These args carry no optcore flags: call optcore.add_args(parser) before parser.parse_args().",
            problems=[("<args>", "add_args was not called")],
        )
    configs: dict[str, dict[str, Any]] = {}
    for record in records:
        flag, dest, _, what = _SELECTORS[record.kind]
        selected = getattr(args, dest, None)
        if selected != record.name:
            added = f"the flags of {what} {record.name!r}" if record.name else f"no {what} flags"
            raise ConfigError(
                f"add_args added {added}, but args select {selected!r}. Pass the same argv to add_args and "
                f"parse_args, and write {flag} in full (abbreviations are not seen when the flags are added).",
                problems=[(dest, "does not match the flags added")],
            )
        if record.name is None:
            continue
        values = _given_values(args, record, full)
        if record.kind == "optimizer":
            configs["optimizer"] = _validated_optimizer(record.name, values, full)
        else:
            configs["lr_scheduler"] = _validated_scheduler(record.name, values, full, num_training_steps)
    if "optimizer" not in configs:
        raise ConfigError(
            "No optimizer was chosen: give --optimizer NAME, or add_args(parser, default='AdamW').",
            problems=[("optimizer", "missing")],
        )
    if nested is None:
        nested = "lr_scheduler" in configs
    return configs if nested else configs["optimizer"]


# ------------------------------------------------------------- the two phases
class _ProbeError(Exception):
    pass


class _Probe(argparse.ArgumentParser):
    """Phase one: finds the selectors and ignores everything else. Its errors
    are left for the real parser to report with its own usage line."""

    def error(self, message: str) -> typing.NoReturn:
        raise _ProbeError(message)


def _probe(
    parser: argparse.ArgumentParser, argv: Sequence[str] | None, defaults: dict[str, str | None], scheduler: bool
) -> dict[str, str | None]:
    # allow_abbrev=False: with it, an optimizer's own "--lr 0.1" would read as
    # an abbreviation of "--lr-scheduler".
    probe = _Probe(
        add_help=False,
        allow_abbrev=False,
        prefix_chars=parser.prefix_chars,
        fromfile_prefix_chars=parser.fromfile_prefix_chars,
    )
    for kind, (flag, dest, _, _) in _SELECTORS.items():
        if kind == "optimizer" or scheduler:
            probe.add_argument(flag, dest=dest, default=defaults[kind])
    try:
        known, _ = probe.parse_known_args(list(sys.argv[1:] if argv is None else argv))
    except _ProbeError:
        return dict(defaults)
    return {kind: getattr(known, _SELECTORS[kind][1], None) for kind in _SELECTORS}


def _selector_help(kind: str, fallback: str | None) -> str:
    if kind == "optimizer":
        text = (
            "optimizer to train with: any name `optcore list` shows (AdamW, Lion, ...) or a dotted path "
            "pkg.module:Class; its flags are listed below once it is given"
        )
    else:
        text = "learning-rate scheduler (`optcore list --schedulers`); its flags are listed below once it is given"
    return text + (f" (default: {fallback})" if fallback else "")


def _add_fields(parser: argparse.ArgumentParser, kind: str, name: str, prefix: str) -> _Chosen:
    """Phase two: one argument group with a flag per schema field."""
    if kind == "optimizer":
        from .._registry import resolve

        spec = resolve(name)
        if spec.is_wrapper:
            raise ConfigError(
                f"{spec.name} wraps another optimizer; choose the inner one with --optimizer and put the "
                "precision keys ('precision', 'memory_efficient') into the config returned by config_from_args.",
                problems=[("optimizer", "is a wrapper")],
            )
    else:
        from ..schedulers import resolve_scheduler

        spec = resolve_scheduler(name)
    _, _, title, _ = _SELECTORS[kind]
    group = parser.add_argument_group(f"{title} ({spec.name})", spec.description or None)
    fields: list[_Field] = []
    skipped: list[str] = []
    for field_name, info in spec.schema.model_fields.items():
        kwargs = _argument_kwargs(info.annotation)
        if kwargs is None:
            skipped.append(field_name)
            continue
        default = None if info.is_required() else info.get_default(call_default_factory=True)
        flag, dest = _free_flag(parser, kind, field_name, prefix, kwargs["action"] is _Flag)
        help_text = _escape(info.description or "")
        action = group.add_argument(flag, dest=dest, default=default, help=help_text, **kwargs)
        if info.is_required():
            action.help = (action.help + " " if action.help else "") + "(required)"
        elif "%(default)" not in (action.help or ""):
            action.help = (action.help + " " if action.help else "") + "(default: %(default)s)"
        fields.append(_Field(field_name, dest, default))
    if skipped:
        note = f"Not settable from the command line (set them in a config file): {', '.join(skipped)}."
        group.description = f"{group.description} {note}" if group.description else note
    return _Chosen(kind, name, tuple(fields))


def _free_flag(parser: argparse.ArgumentParser, kind: str, field: str, prefix: str, boolean: bool) -> tuple[str, str]:
    """``--{prefix}{field}``, or ``--{prefix}{kind}-{field}`` where that is taken."""
    taken_flags = parser._option_string_actions
    taken_dests = {a.dest for a in parser._actions}
    kebab_prefix = prefix.replace("_", "-")
    dest_prefix = prefix.replace("-", "_")
    candidates = [
        (f"--{kebab_prefix}{field.replace('_', '-')}", f"{dest_prefix}{field}"),
        (f"--{kebab_prefix}{kind.replace('_', '-')}-{field.replace('_', '-')}", f"{dest_prefix}{kind}_{field}"),
    ]
    for flag, dest in candidates:
        flags = [flag, "--no-" + flag[2:]] if boolean else [flag]
        if not any(f in taken_flags for f in flags) and dest not in taken_dests:
            return flag, dest
    raise ValueError(
        f"Both {candidates[0][0]} and {candidates[1][0]} are taken in this parser; "
        "call optcore.add_args(parser, prefix='opt-') to put the optimizer's flags under their own prefix."
    )


def _escape(text: str) -> str:
    return text.replace("%", "%%")


# ------------------------------------------------------------ reading values
def _given_values(args: argparse.Namespace, record: _Chosen, full: bool) -> dict[str, Any]:
    given = getattr(args, _GIVEN, set())
    values: dict[str, Any] = {}
    for f in record.fields:
        value = getattr(args, f.dest, f.default)
        if full or f.dest in given or _plain(value) != _plain(f.default):
            values[f.name] = value
    return values


def _plain(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return tuple(_plain(v) for v in value)
    return value


def _validated_optimizer(name: str, values: dict[str, Any], full: bool) -> dict[str, Any]:
    checked = plan({"type": name, **values}).hparams  # the build's own validation
    return {"type": name, **(dict(checked) if full else {k: checked[k] for k in values})}


def _validated_scheduler(name: str, values: dict[str, Any], full: bool, total: int | None) -> dict[str, Any]:
    from ..schedulers import resolve_scheduler, validate_scheduler_config

    spec = resolve_scheduler(name)
    length = spec.total_field
    stand_in = total is None and length is not None and values.get(length) is None
    if stand_in:  # the run length usually comes later, from build(num_training_steps=N)
        total = _STAND_IN_TOTAL
    try:
        _, checked = validate_scheduler_config({"type": name, **values}, num_training_steps=total)
    except ConfigError as exc:
        if not stand_in:
            raise
        shown = "<num_training_steps, from build()>"
        raise ConfigError(
            exc.message.replace(str(_STAND_IN_TOTAL), shown),
            problems=[(f, m.replace(str(_STAND_IN_TOTAL), shown)) for f, m in exc.problems],
            accepted=exc.accepted,
            target=exc.target,
        ) from None
    if stand_in:
        checked.pop(length, None)  # type: ignore[arg-type]
    return {"type": name, **(checked if full else {k: checked.get(k, v) for k, v in values.items()})}


# ---------------------------------------------------- schema types -> argparse
class _Store(argparse.Action):
    """``store`` that remembers the flag was given and shapes the values
    (a tuple field gets a tuple, ``float | list[float]`` one value a float)."""

    def __init__(self, *args: Any, shape: Callable[[Any], Any] | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.shape = shape

    def __call__(self, parser: Any, namespace: Any, values: Any, option_string: Any = None) -> None:
        setattr(namespace, self.dest, self.shape(values) if self.shape else values)
        _mark_given(namespace, self.dest)


class _Flag(argparse.BooleanOptionalAction):
    """``--name`` / ``--no-name`` that remembers it was given."""

    def __call__(self, parser: Any, namespace: Any, values: Any, option_string: Any = None) -> None:
        super().__call__(parser, namespace, values, option_string)
        _mark_given(namespace, self.dest)


def _mark_given(namespace: Any, dest: str) -> None:
    given = getattr(namespace, _GIVEN, None)
    if given is None:
        given = set()
        setattr(namespace, _GIVEN, given)
    given.add(dest)


_NONE_WORDS = {"none", "null"}


def _strip(annotation: Any) -> Any:
    """``Annotated[X, ...]`` -> ``X``."""
    while typing.get_origin(annotation) is typing.Annotated:
        annotation = typing.get_args(annotation)[0]
    return annotation


def _union_members(annotation: Any) -> tuple[list[Any], bool]:
    """The non-None members of a union (or ``[annotation]``) and whether None is allowed."""
    annotation = _strip(annotation)
    if typing.get_origin(annotation) in (Union, types.UnionType):
        members = [_strip(m) for m in typing.get_args(annotation)]
        rest = [m for m in members if m is not type(None)]
        return rest, len(rest) < len(members)
    return [annotation], annotation is type(None)


def _argument_kwargs(annotation: Any) -> dict[str, Any] | None:
    """``add_argument`` keywords for a field, or None when a command line
    cannot spell it (callables, nested configs)."""
    members, optional = _union_members(annotation)
    if members and all(m is bool for m in members):
        return {"action": _Flag}

    sequences = [m for m in members if _sequence_of(m) is not None]
    scalars = [m for m in members if m not in sequences]
    if sequences:
        element_types, length = _sequence_of(sequences[0])  # type: ignore[misc]
        lengths = {(_sequence_of(s) or ((), None))[1] for s in sequences}
        converter = _scalar_converter(element_types, optional)
        if converter is None:
            return None
        fixed = length if len(lengths) == 1 and length is not None and not scalars and not optional else None
        as_tuple = all(typing.get_origin(s) is tuple or s is tuple for s in sequences)
        scalar_ok = bool(scalars) and _scalar_converter(scalars, optional) is not None

        def shape(values: list[Any]) -> Any:
            if len(values) == 1 and (scalar_ok or (optional and values[0] is None)):
                return values[0]
            return tuple(values) if as_tuple else list(values)

        return {"action": _Store, "nargs": fixed if fixed is not None else "+", "type": converter, "shape": shape}

    if scalars and all(typing.get_origin(m) is Literal for m in scalars):
        choices = [v for m in scalars for v in typing.get_args(m)] + ([None] if optional else [])
        return {"action": _Store, "type": _literal_converter(choices), "choices": choices}

    converter = _scalar_converter(scalars, optional)
    if converter is None:
        return None
    return {"action": _Store, "type": converter}


def _sequence_of(annotation: Any) -> tuple[list[Any], int | None] | None:
    """Element types and fixed length (None: any length) of a tuple/list type."""
    origin = typing.get_origin(annotation)
    if annotation in (tuple, list) or origin in (tuple, list, Sequence):
        args = [_strip(a) for a in typing.get_args(annotation)]
        if origin is tuple and args and args[-1] is not Ellipsis:
            return args, len(args)
        return [a for a in args if a is not Ellipsis] or [Any], None
    return None


def _scalar_converter(members: Sequence[Any], optional: bool) -> Callable[[str], Any] | None:
    """A converter from one command-line word to the first type of
    ``members`` it fits; None when no member has a command-line spelling."""
    parsers: list[Callable[[str], Any]] = []
    names: list[str] = []
    for raw in members:
        member, member_optional = _union_members(raw)
        optional = optional or member_optional
        for m in member:
            found = _SCALARS.get(m) if isinstance(m, type) else None
            if found is None and (m is Any or m is dict or typing.get_origin(m) is dict):
                found = (_literal, "literal")
            if found is None and _is_dtype(m):
                found = (_dtype, "dtype")
            if found is None and typing.get_origin(m) is Literal:
                found = (_literal_converter(list(typing.get_args(m))), "choice")
            if found is not None and found[1] not in names:
                parsers.append(found[0])
                names.append(found[1])
    if not parsers:
        return None
    if float in members and int in members:  # keep ints ints ("200"), floats floats ("1e-3")
        parsers, names = [_number], ["number"]

    def convert(text: str) -> Any:
        if optional and text.strip().lower() in _NONE_WORDS:
            return None
        for parse in parsers:
            try:
                return parse(text)
            except (TypeError, ValueError):
                continue
        raise ValueError(text)

    convert.__name__ = " or ".join(names + (["none"] if optional else []))
    return convert


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        value = float(text)  # "1e5" is a fine way to write a step count
        if not value.is_integer():
            raise
        return int(value)


def _number(text: str) -> int | float:
    try:
        return int(text)
    except ValueError:
        return float(text)


_TRUE = {"true", "yes", "1", "on"}
_FALSE = {"false", "no", "0", "off"}


def _bool(text: str) -> bool:
    word = text.strip().lower()
    if word in _TRUE | _FALSE:
        return word in _TRUE
    raise ValueError(text)


def _literal(text: str) -> Any:
    from .._literals import parse_literal  # ast.literal_eval: literals only, nothing runs

    return parse_literal(text)


def _is_dtype(annotation: Any) -> bool:
    return getattr(annotation, "__module__", "") == "torch" and getattr(annotation, "__name__", "") == "dtype"


def _dtype(text: str) -> Any:
    import torch

    value = getattr(torch, text.strip().removeprefix("torch."), None)
    if isinstance(value, torch.dtype):
        return value
    raise ValueError(f"not a torch dtype: {text!r}")


def _literal_converter(choices: list[Any]) -> Callable[[str], Any]:
    by_text = {str(c).lower(): c for c in choices}

    def choice(text: str) -> Any:
        return by_text.get(text.strip().lower(), text)  # argparse reports a value outside the choices

    return choice


_SCALARS: Mapping[Any, tuple[Callable[[str], Any], str]] = {
    float: (float, "float"),
    int: (_int, "int"),
    str: (str, "str"),
    bool: (_bool, "bool"),
}

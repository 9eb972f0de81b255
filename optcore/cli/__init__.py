"""The ``optcore`` command: list, show, check, schema, and the applications
(compare, train, memory) registered by :mod:`optcore.compare`.

``optcore --help`` imports neither torch nor pydantic: each subcommand imports
what it needs when it runs. Output is a rich table on a terminal, plain
aligned text when piped or without rich (``list``, ``show``, ``check`` and
``schema`` need no extra), and JSON with ``--json``; an error is one message on
stderr (no traceback) and exit code 1, also for an application run without its
extra (``compare``, ``train`` and ``memory`` need ``optcore[compare]``).
"""

from __future__ import annotations

import argparse
import sys
import warnings
from collections.abc import Sequence

from .._errors import OptcoreError
from ._check import check_config, cmd_check
from ._files import cmd_schema, config_file_schema, optimizer_file_schema
from ._list import cmd_list
from ._show import cmd_show, describe

__all__ = ["build_parser", "check_config", "config_file_schema", "describe", "main", "optimizer_file_schema"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="optcore", description="Pick, configure and extend PyTorch optimizers.")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("list", help="list every optimizer (or scheduler) name and where it comes from")
    p.add_argument(
        "--all",
        action="store_true",
        help="also list the names installed packages' own registries resolve (pytorch_optimizer's AdaMuon, "
        "MuonClip, ...: `optcore list` counts them) and every shadowed provider, with capability flags "
        "(imports each class)",
    )
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--schedulers", action="store_true", help="list LR schedulers instead")
    p.add_argument(
        "--flags",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="show capability flags (imports each class; default: with --all only)",
    )
    p.set_defaults(func=cmd_list)

    p = sub.add_parser("show", help="schema, defaults, capabilities and origin of one name; or a config's build plan")
    p.add_argument("name", nargs="?")
    p.add_argument("--config", metavar="FILE", help="print the build plan of a JSON/YAML/TOML optimizer config instead")
    p.add_argument("--model", metavar="MOD:FN", help="with --config: plan over this model and print the routing table")
    p.add_argument("--json", action="store_true")
    p.add_argument("--scheduler", action="store_true", help="NAME is a scheduler")
    _add_import_switch(p)
    p.set_defaults(func=cmd_show)

    p = sub.add_parser("check", help="validate JSON/YAML/TOML configs exactly as a build would (exit 1 on errors)")
    p.add_argument("config", nargs="+", metavar="FILE")
    p.add_argument(
        "--num-training-steps", type=_positive_int, metavar="N",
        help="the run length the code passes (optcore.build(..., num_training_steps=N)); it wins over the file's. "
        "Without it, a schedule whose length no file gives is checked without one, with a note",
    )
    _add_import_switch(p)
    p.set_defaults(func=cmd_check)

    p = sub.add_parser("schema", help="JSON Schema of config files (for editor completion and CI checks)")
    p.add_argument("name", nargs="?", help="one optimizer's config (with type, param_groups and plugin keys)")
    p.add_argument("--all", action="store_true", help="the schema of every optcore config file (optimizer, run, compare)")
    _add_import_switch(p)
    p.set_defaults(func=cmd_schema)

    _add_applications(sub)
    return parser


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive whole number of steps, got {text!r}")
    return value


def _add_import_switch(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--import-modules",
        action="store_true",
        help="import the modules a config's import paths name, to judge them (runs their code; off by default)",
    )


def _add_applications(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    from ..compare import commands  # the main job: compare, train, memory (imports only argparse)

    commands.add_commands(sub)


def _show_warning(message: Warning | str, category: type[Warning], *_: object, **__: object) -> None:
    """A warning as one line a user reads (``optcore: warning: ...``), not
    Python's form, which points at the console script's ``sys.exit(main())``."""
    sys.stdout.flush()  # after what the command printed so far
    print(f"optcore: warning: {' '.join(str(message).split())}", file=sys.stderr)


#: What other libraries log while they are imported or set up, none of it about the command run:
#: torchao's and bitsandbytes' kernels that this machine cannot load (optcore uses neither's),
#: torch's notes on how torchao registers its enums.
_IMPORT_LOGGERS = ("torchao", "bitsandbytes", "torch.utils._pytree")

#: Warnings the same way, by their text: torch without NumPy (no optcore command needs it), Optuna
#: marking the samplers compare uses as experimental, pydantic leaving a non-JSON default out of a schema.
_IMPORT_WARNINGS = ("Failed to initialize NumPy", r".* is experimental \(supported from v", "Default value .* is not JSON serializable")


def _quiet_imports() -> None:
    """A documented command prints only what optcore means to say: the
    libraries it imports keep their import-time chatter (see the two lists
    above) to themselves. Their errors still show."""
    import logging

    for name in _IMPORT_LOGGERS:
        logging.getLogger(name).setLevel(logging.ERROR)
    for text in _IMPORT_WARNINGS:
        warnings.filterwarnings("ignore", message=text)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    with warnings.catch_warnings():  # the filters stay; only how a shown warning reads changes
        warnings.showwarning = _show_warning
        _quiet_imports()
        try:
            if args.command in ("check", "show", "schema") and not getattr(args, "import_modules", False):
                from ..guards import without_imports  # a judging command runs no config's module

                with without_imports():
                    return int(args.func(args) or 0)
            return int(args.func(args) or 0)
        except OptcoreError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        except ModuleNotFoundError as exc:
            print(f"error: {missing_module(args.command, exc.name)}", file=sys.stderr)
            return 1


#: the optional packages optcore's commands import (top-level module), and the extra that installs each
EXTRAS = {
    "rich": "cli",
    "yaml": "yaml",
    "matplotlib": "compare",
    "optuna": "compare",
    "scipy": "compare",  # Optuna's QMC sampler, which compare's sweeps use
    "psycopg2": "compare",
    "transformers": "hf",
    "accelerate": "hf",
    "deepspeed": "deepspeed",
    "omegaconf": "hydra",
    "hydra": "hydra",
    "pytorch_lightning": "lightning",
    "lightning": "lightning",
    "swift": "swift",
}

#: the extra each application command needs as a whole
_COMMAND_EXTRAS = {"compare": "compare", "train": "compare", "memory": "compare"}


def missing_module(command: str, module: str | None) -> str:
    """One line for a module a command needs and this environment lacks: the
    extra that installs it, or, for a module no extra provides, the package."""
    top = (module or "").partition(".")[0]
    extra = _COMMAND_EXTRAS.get(command) if top in EXTRAS and EXTRAS[top] in ("cli", "yaml", "compare") else None
    extra = extra or EXTRAS.get(top)
    if extra is not None:
        return f"optcore {command} needs {module}, which is not installed: pip install 'optcore[{extra}]'."
    return (
        f"optcore {command} needs the module {module!r}, which is not installed and which no optcore extra "
        "provides: install the package that provides it (the config or task that imports it names it)."
    )


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

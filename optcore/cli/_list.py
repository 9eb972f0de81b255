"""``optcore list``: every name, where it comes from, what shadows what.

The table reads metadata only: torch's names, optcore's table of third-party
packages and the plugins' entry points. No plugin is imported unless capability
flags are asked for (``--all`` or ``--flags``), since the flags are facts about
the class. The line under it names the installed packages whose own registries add
names (from metadata: counting them would import those packages), so that
none is hidden unsaid, and the plugin distributions that are not loaded because
a look-alike has their name (:mod:`optcore.distributions`), with both folders.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from .._errors import OptcoreError
from .._plugins import clashes as plugin_clashes
from .._values import clean_text
from ._output import console, fit_text, table

_FLAG_TITLE = "flags, sharding"
_LEGEND = (
    f"{_FLAG_TITLE}: the capability flags supports_memory_efficient_fp16 / supports_step_with_scale / "
    "supports_flat_params / supports_groups, in that order (✓ true, · false), then the sharding kind "
    "(elementwise, factored, per_tensor, global or unknown); `optcore show NAME` says what each means. ? the "
    "class failed to load; (optcore show NAME) not known without importing the class (--all or --flags does)."
)


def _flags(spec: Any, load: bool) -> dict[str, bool | str] | None:
    """The capability flags; without ``load``, only those known without running
    plugin or package code (``None`` otherwise: `optcore show NAME` has them)."""
    try:
        caps = spec.capabilities if load else spec.known_capabilities
    except OptcoreError:
        return {}
    return None if caps is None else caps.as_dict()


def _flag_cell(caps: dict[str, bool | str] | None) -> str:
    if caps is None:
        return "(optcore show NAME)"
    return " ".join(v if isinstance(v, str) else "✓" if v else "·" for v in caps.values()) if caps else "?"


def cmd_list(args: argparse.Namespace) -> int:
    if args.schedulers:
        from ..schedulers import list_schedulers

        specs = list_schedulers(all=args.all)
    else:
        from .._registry import list_optimizers  # torch: imported by the command, not by --help

        specs = list_optimizers(all=args.all, ask_packages=args.all)
    flags = not args.schedulers and (args.flags if args.flags is not None else True)
    load = bool(args.all or args.flags)
    rows = []
    for spec in specs:
        row = spec.describe()
        if flags:
            row["capabilities"] = _flags(spec, load)
        rows.append(row)
    clashes = [f"Not loaded: {clean_text(why, 2000)}." for why in plugin_clashes()]
    if args.json:
        print(json.dumps(rows, indent=2))
        for line in clashes:  # stdout stays the JSON rows
            print(line, file=sys.stderr)
        return 0
    header = ["name", "source", "provider", "select with", "shadows"] + ([_FLAG_TITLE] if flags else [])
    cells = [
        [r["name"], r["source"], r["provider"], r["qualified"], ", ".join(r["shadowed"])]
        + ([_flag_cell(r["capabilities"])] if flags else [])
        for r in rows
    ]
    title = f"optcore {'schedulers' if args.schedulers else 'optimizers'} ({len(rows)})"
    out = table(title, header, whole=[0])  # the name is what a reader looks for: never folded
    for row_cells in cells:
        out.add_row(*row_cells)
    console().print(out)
    notes = ([_LEGEND] if flags else []) + ([] if args.all or args.schedulers else _unlisted(specs)) + clashes
    if notes:
        console().print(fit_text("\n".join(notes)), highlight=False, markup=False)
    return 0


def _unlisted(listed: list[Any]) -> list[str]:
    """The installed packages whose own registries resolve more names than the table shows.

    Read from package metadata: counting those names would import the packages
    (seconds, and their side effects), which only ``--all`` does."""
    from .._packages import KNOWN_PACKAGES, is_installed

    asked = sorted({p.distribution for p in KNOWN_PACKAGES if p.ask_names is not None and is_installed(p.top_level)})
    if not asked:
        return []
    return [f"Not listed: the further names that the registries of {', '.join(asked)} resolve (`type` takes them; "
            "counting them imports those packages); `optcore list --all` lists them."]  # fmt: skip

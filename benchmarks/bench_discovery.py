"""Entry-point discovery: optcore's own entry_points.txt scanner against importlib.metadata.

    python benchmarks/bench_discovery.py [--fakes 50] [--optcore-fakes 10] [--runs 7]

``--fakes`` fake distributions are put first on ``sys.path``; ``--optcore-fakes``
of them declare entry points in optcore's groups, the rest only in other groups
(console_scripts, pytest11, ...), as most installed packages do. Each route is
timed in fresh processes (the routes interleaved run by run, median of
``--runs``), after ``import torch, optcore`` (torch already imports
``importlib.metadata``, so no route pays for that import), for the first
look-up of one group and for all three optcore groups:

* ``optcore._plugins`` — the custom scanner: each ``entry_points.txt`` read as
  text, parsed only when it mentions ``[optcore.``, one scan for all groups;
* ``metadata.entry_points(group=...)`` — the standard call, once per group
  (each call rescans every distribution);
* ``metadata.entry_points()`` once — every group parsed once, then
  ``.select(group=...)`` per group (what "cache it once per process" costs);
* ``distributions() + read_text`` — the standard distributions, with the same
  text pre-check before parsing (``dist.read_text("entry_points.txt")``).

Every route must find the same entries (checked), or the script fails.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

GROUPS = ("optcore.optimizers", "optcore.schedulers", "optcore.hooks")

SETUP = """
import json, sys, time, torch, optcore, optcore._plugins
from importlib import metadata
sys.path.insert(0, {root!r})
GROUPS = {groups!r}
"""

ROUTES = {
    "optcore._plugins scanner": """
def lookup(group):
    return [(e.group, e.name, e.value) for e in optcore._plugins.entry_points(group)]
""",
    "metadata.entry_points(group=...) per group": """
def lookup(group):
    return [(e.group, e.name, e.value) for e in metadata.entry_points(group=group)]
""",
    "metadata.entry_points() once, then select": """
_all = []
def lookup(group):
    if not _all:
        _all.append(metadata.entry_points())
    return [(e.group, e.name, e.value) for e in _all[0].select(group=group)]
""",
    "distributions() + read_text pre-check": """
_found = {}
def lookup(group):
    if not _found:
        seen = set()
        for dist in metadata.distributions():
            text = dist.read_text("entry_points.txt")
            if not text or "[optcore." not in text:
                continue
            name = dist.metadata["Name"]
            if name in seen:
                continue
            seen.add(name)
            for e in dist.entry_points:
                if e.group.startswith("optcore."):
                    _found.setdefault(e.group, []).append((e.group, e.name, e.value))
        _found.setdefault(None, [])
    return _found.get(group, [])
""",
}

TIMING = """
t = time.perf_counter()
first = lookup(GROUPS[0])
one = time.perf_counter() - t
rest = [lookup(g) for g in GROUPS[1:]]
every = time.perf_counter() - t
print(json.dumps({"one": one, "all": every, "entries": sorted(map(list, first + sum(rest, [])))}))
"""


def make_fakes(root: Path, n: int, n_optcore: int) -> None:
    """``n`` distributions, ``n_optcore`` of them with optcore entry points."""
    for i in range(n):
        name = f"fakedist{i}"
        info = root / f"{name}-1.{i}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.{i}\nSummary: fake\n\n")
        lines = ["[console_scripts]", *(f"{name}-tool{k} = {name}.cli:main{k}" for k in range(3)),
                 "", "[pytest11]", f"{name} = {name}.plugin"]
        if i < n_optcore:
            lines += ["", "[optcore.optimizers]", f"Fake{i} = {name}:Fake{i}"]
            if i % 3 == 0:
                lines += ["", "[optcore.schedulers]", f"fake_sched{i} = {name}:sched"]
            if i % 5 == 0:
                lines += ["", "[optcore.hooks]", f"{name} = {name}.hooks"]
        (info / "entry_points.txt").write_text("\n".join(lines) + "\n")
        (info / "RECORD").write_text("")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--fakes", type=int, default=50)
    parser.add_argument("--optcore-fakes", type=int, default=10)
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        make_fakes(root, args.fakes, args.optcore_fakes)
        setup = SETUP.format(root=str(root), groups=GROUPS)
        codes = {name: setup + textwrap.dedent(route) + TIMING for name, route in ROUTES.items()}
        samples: dict[str, list[dict]] = {name: [] for name in codes}
        for _ in range(args.runs):
            for name, code in codes.items():  # interleaved: machine noise hits every route alike
                out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
                samples[name].append(json.loads(out.splitlines()[-1]))
    entries = {name: runs[0]["entries"] for name, runs in samples.items()}
    reference = entries["optcore._plugins scanner"]
    for name, found in entries.items():
        if found != reference:
            raise SystemExit(f"{name} found different entries than the scanner:\n{found}\nvs\n{reference}")
    n_installed = subprocess.run([sys.executable, "-c", "from importlib import metadata; "
                                  "print(len(list(metadata.distributions())))"],
                                 check=True, capture_output=True, text=True).stdout.strip()
    print(f"python {sys.version.split()[0]}, {n_installed} installed distributions + {args.fakes} fakes "
          f"({args.optcore_fakes} with optcore entry points); {len(reference)} optcore entries found by every route; "
          f"fresh process each, median of {args.runs}\n")
    base = statistics.median(s["one"] for s in samples["optcore._plugins scanner"])
    print("| route | first look-up, one group (ms) | all three optcore groups (ms) | one group vs scanner |")
    print("|---|---:|---:|---:|")
    for name, runs in samples.items():
        one = statistics.median(s["one"] for s in runs)
        every = statistics.median(s["all"] for s in runs)
        print(f"| {name} | {one * 1e3:.2f} | {every * 1e3:.2f} | {one / base:.2f} |")


if __name__ == "__main__":
    main()

"""Whole `optcore` commands against `python -c "import torch"`, side by side.

Each round runs every command once in a fresh process, in turn (so a busy
machine slows them alike); the figure is the median over rounds of each
command's wall time minus the same round's `import torch`. Goals: `--help`
imports no torch and costs about a bare interpreter; `list` at most +0.3 s over
importing torch; `show`/`check` of a torch or plugin name at most +0.5 s.

    python benchmarks/bench_cli.py [--rounds 7]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

GOALS = {"--help": None, "list": 0.3, "show AdamW": 0.5, "show optcore-lion:Lion": 0.5, "check": 0.5}


def _time(argv: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    config = Path(tempfile.mkdtemp()) / "run.json"
    config.write_text(json.dumps({"type": "AdamW", "lr": 3e-4, "weight_decay": 0.01}))
    cli = [sys.executable, "-m", "optcore.cli"]
    commands = {
        "--help": [*cli, "--help"],
        "list": [*cli, "list"],
        "show AdamW": [*cli, "show", "AdamW"],
        "show optcore-lion:Lion": [*cli, "show", "optcore-lion:Lion"],
        "check": [*cli, "check", str(config)],
    }
    baseline = {"python": [sys.executable, "-c", "pass"], "import torch": [sys.executable, "-c", "import torch"]}
    samples: dict[str, list[float]] = {name: [] for name in [*baseline, *commands]}
    for _ in range(args.rounds):
        times = {name: _time(argv) for name, argv in {**baseline, **commands}.items()}
        for name, t in times.items():
            ref = times["python"] if name in ("python", "--help") else times["import torch"]
            samples[name].append(t if name in baseline else t - ref)
    print(f"| command | median of {args.rounds} rounds (s) | goal |")
    print("|---|---|---|")
    print(f"| `python -c pass` | {statistics.median(samples['python']):.3f} (absolute) | |")
    print(f"| `python -c 'import torch'` | {statistics.median(samples['import torch']):.3f} (absolute) | |")
    for name in commands:
        goal = GOALS[name]
        ref = "bare python" if name == "--help" else "import torch"
        goal_text = "no torch import" if goal is None else f"<= +{goal} s"
        print(f"| `optcore {name}` | +{statistics.median(samples[name]):.3f} over {ref} | {goal_text} |")


if __name__ == "__main__":
    main()

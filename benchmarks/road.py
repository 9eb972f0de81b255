"""The road of a config (issue 10's walk): every call from one module of optcore
or its plugins into another during one ``build_optimizer``, in order.

    python benchmarks/road.py                                  # print the roads
    python benchmarks/road.py --json docs/results/road.json    # the figure in docs/architecture.md

A hop is a call into another module; calls repeated back to back (a loop over
groups) count once. Calls from a spec into the loader its registry gave it
(dependency inversion, not an import) are left out. Each build is made once
before it is traced, so first-use imports and caches are not on the road.
``tests/core/test_architecture.py`` traces the same builds and fails when the road
differs from the committed results, so the page cannot drift from the code.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import torch

import optcore

PACKAGE = Path(optcore.__file__).resolve().parent

#: The configs whose road the architecture page shows: a torch optimizer with a
#: regex group, and issue 10's plugin optimizer under the precision shorthand.
CONFIGS: list[dict[str, Any]] = [
    {"type": "AdamW", "lr": 1e-3, "betas": "(0.9, 0.98)", "param_groups": [{"params": r"^0\.", "lr_scale": 2.0}]},
    {"type": "optcore-lion:Lion", "lr": 1e-4, "precision": "fp16"},
]

#: (caller, callee, caller's function): a spec calling the loader of its class or schema.
LOADERS = {("_spec", "_registry", "target"), ("_spec", "_registry", "schema"), ("_spec", "_plugins", "target"),
           ("_spec", "_plugins", "schema"), ("_spec", "_plugins", "capabilities")}


def module_of(filename: str) -> str | None:
    """``_plan`` for a core module, ``optcore_lion.lion`` for a plugin's, else ``None``."""
    path = Path(filename).resolve()
    try:
        parts = path.relative_to(PACKAGE).with_suffix("").parts
        return "optcore" if parts == ("__init__",) else parts[0]
    except ValueError:
        pass
    for i, part in enumerate(path.parts):
        if part.startswith("optcore_") and path.suffix == ".py":
            return ".".join(path.with_suffix("").parts[i:])
    return None


def trace(fn: Any) -> list[tuple[str, str]]:
    """The hops of ``fn()``: (caller module, callee module) pairs, in order."""
    hops: list[tuple[str, str]] = []

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event != "call" or frame.f_back is None:
            return
        callee, caller = module_of(frame.f_code.co_filename), module_of(frame.f_back.f_code.co_filename)
        if callee and caller and callee != caller and (caller, callee, frame.f_back.f_code.co_name) not in LOADERS:
            if not hops or hops[-1] != (caller, callee):
                hops.append((caller, callee))

    sys.setprofile(profile)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return hops


def road(config: dict[str, Any], half: bool | None = None) -> list[tuple[str, str]]:
    """The hops of building ``config`` over a small model (in fp16 when
    ``half``, by default when the config asks for a precision)."""
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4))
    if config.get("precision") if half is None else half:
        model = model.half()
    optcore.build_optimizer(dict(config), model)  # warm: plugin imports and lazy names happen once
    return trace(lambda: optcore.build_optimizer(dict(config), model))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", type=Path, help="write the roads here")
    args = parser.parse_args(argv)
    roads = [{"config": c, "hops": [list(h) for h in road(c)]} for c in CONFIGS]
    for r in roads:
        print(f"{json.dumps(r['config'])}: {len(r['hops'])} hops")
        for caller, callee in r["hops"]:
            print(f"  {caller} -> {callee}")
    if args.json:
        out = {"command": "python benchmarks/road.py --json docs/results/road.json", "roads": roads}
        args.json.write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

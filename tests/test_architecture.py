"""The shape of the code, checked: the layers of pyproject.toml's import-linter
contract hold for imports (``lint-imports`` in the test command) *and* for the
calls one build makes, so a config travels down the layers and never back up."""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path

import pytest
import torch

import optcore

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = Path(optcore.__file__).resolve().parent


def _layers() -> dict[str, int]:
    """module name -> layer index (0 = top) from the import-linter contract."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    (contract,) = [c for c in config["contracts"] if c["type"] == "layers"]
    ranks: dict[str, int] = {}
    for index, layer in enumerate(contract["layers"]):
        for name in layer.split("|"):
            ranks[f"optcore.{name.strip()}"] = index
    return ranks


def _core_module(filename: str) -> str | None:
    try:
        rel = Path(filename).resolve().relative_to(PACKAGE)
    except ValueError:
        return None
    parts = rel.with_suffix("").parts
    return "optcore." + parts[0] if parts[0] != "__init__" else "optcore"


#: Upward calls that are callbacks, not imports: the registry hands each spec the
#: zero-argument loader of its class and schema (dependency inversion), and the
#: spec calls it on first use.
CALLBACKS = {("optcore._spec", "optcore._registry"), ("optcore._spec", "optcore._plugins")}


def _trace(fn) -> list[tuple[str, str]]:
    """The (caller, callee) module pairs of every call between two optcore modules
    (callbacks of :data:`CALLBACKS` that are loaders are left out)."""
    edges: list[tuple[str, str]] = []

    def profile(frame, event, arg):
        if event != "call":
            return
        callee = _core_module(frame.f_code.co_filename)
        caller = _core_module(frame.f_back.f_code.co_filename) if frame.f_back else None
        if callee and caller and callee != caller:
            if (caller, callee) in CALLBACKS and frame.f_back.f_code.co_name in ("target", "schema", "capabilities"):
                return  # a spec loading its class or schema through the loader it was given
            edges.append((caller, callee))

    sys.setprofile(profile)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return edges


CONFIGS = [
    {"type": "AdamW", "lr": 1e-3, "betas": "(0.9, 0.98)", "param_groups": [{"params": r"^0\.", "lr_scale": 2.0}]},
    pytest.param(
        {"type": "optcore-lion:Lion", "lr": 1e-4, "precision": "fp16"},
        marks=pytest.mark.skipif(
            not any(s.qualified == "optcore-lion:Lion" for s in optcore.list_optimizers(all=True))
            or not any(s.name == "FP16Optimizer" for s in optcore.list_optimizers()),
            reason="optcore-lion and optcore-fp16 are not installed",
        ),
    ),
]


@pytest.mark.parametrize("config", CONFIGS)
def test_a_build_walks_down_the_layers(config):
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4))
    if config.get("precision"):
        model = model.half()
    optcore.build_optimizer(dict(config), model)  # warm: plugin imports and lazy names happen once
    edges = _trace(lambda: optcore.build_optimizer(dict(config), model))
    ranks = _layers()
    assert edges, "the trace saw no call between optcore modules"
    upward = sorted({(a, b) for a, b in edges if a in ranks and b in ranks and ranks[a] > ranks[b]})
    assert not upward, f"calls that climb the layers: {upward}"
    # The road enters the package's __init__ only through the public entry point.
    assert all(b != "optcore" for _, b in edges)
    hops = [b for i, (a, b) in enumerate(edges) if i == 0 or edges[i - 1] != (a, b)]
    print(f"{len(hops)} hops over {len({b for _, b in edges})} modules")


def _calls(config, model) -> list[tuple[str, str]]:
    optcore.build_optimizer(dict(config), model)  # warm
    return _trace(lambda: optcore.build_optimizer(dict(config), model))


def test_the_road_does_not_grow_with_the_model():
    """A build calls across modules a fixed number of times: a model of 40
    layers (160 parameters, each matched against the regex groups) makes the
    calls a model of 1 layer makes."""
    config = {"type": "AdamW", "param_groups": [{"params": r"^0\.", "lr_scale": 2.0}, {"params": "^9$", "optional": True}]}

    def model(layers: int) -> torch.nn.Module:
        return torch.nn.Sequential(*[m for _ in range(layers) for m in (torch.nn.Linear(2, 2), torch.nn.LayerNorm(2))])

    assert _calls(config, model(1)) == _calls(config, model(40))


def test_the_type_checking_imports_name_every_lazy_public_name():
    """``optcore/__init__``'s TYPE_CHECKING block (for IDEs and type checkers) imports
    exactly the names of ``_LAZY`` (what runs), each from the same module."""
    import ast

    tree = ast.parse((PACKAGE / "__init__.py").read_text())
    (block,) = [n for n in tree.body if isinstance(n, ast.If) and getattr(n.test, "id", "") == "TYPE_CHECKING"]
    imported = {a.name: "." * n.level + (n.module or "") for n in block.body for a in n.names}
    assert imported == optcore._LAZY

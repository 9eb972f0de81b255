"""The shape of the code, checked: the layers of pyproject.toml's import-linter
contract hold for imports (``lint-imports`` in the test command) *and* for the
calls one build makes, so a config travels down the layers and never back up."""

from __future__ import annotations

import ast
import importlib
import json
import re
import subprocess
import sys
import warnings
import tomllib
from collections import Counter
from pathlib import Path

import pytest
import torch

import optcore
from optcore.plugin._deprecated import MOVED, REMOVED_IN

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = Path(optcore.__file__).resolve().parent
sys.path.insert(0, str(ROOT / "benchmarks"))
import road  # noqa: E402 - benchmarks/road.py: the tracer the architecture page's figure comes from


def _layers() -> dict[str, int]:
    """module name -> layer index (0 = top) from the import-linter contract."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    (contract,) = [c for c in config["contracts"] if c["type"] == "layers"]
    ranks: dict[str, int] = {}
    for index, layer in enumerate(contract["layers"]):
        for name in layer.split("|"):
            ranks[f"optcore.{name.strip()}"] = index
    return ranks


CORE = {"optcore"} | {p.stem for p in PACKAGE.glob("*.py")} | {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists()}
RESULTS = json.loads((ROOT / "docs" / "results" / "road.json").read_text())
PLUGINS_INSTALLED = any(s.qualified == "optcore-lion:Lion" for s in optcore.list_optimizers(all=True)) and any(
    s.name == "FP16Optimizer" for s in optcore.list_optimizers()
)
needs_plugins = pytest.mark.skipif(not PLUGINS_INSTALLED, reason="optcore-lion and optcore-fp16 are not installed")
CONFIGS = [road.CONFIGS[0], pytest.param(road.CONFIGS[1], marks=needs_plugins)]


def _core(hops: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """The hops between two core modules."""
    return [(a, b) for a, b in hops if a in CORE and b in CORE]


@pytest.mark.parametrize("config", CONFIGS)
def test_a_build_walks_down_the_layers(config):
    hops = _core(road.road(config))
    ranks = _layers()
    assert hops, "the trace saw no call between optcore modules"
    upward = sorted({(a, b) for a, b in hops if ranks.get(f"optcore.{a}", -1) > ranks.get(f"optcore.{b}", 99)})
    assert not upward, f"calls that climb the layers: {upward}"
    # The road enters the package's __init__ only through the public entry point.
    assert all(b != "optcore" for _, b in hops)


@needs_plugins
def test_the_road_is_the_one_the_architecture_page_shows():
    """docs/architecture.md renders docs/results/road.json (``python benchmarks/road.py --json ...``);
    a change of the road must regenerate it."""
    assert [r["config"] for r in RESULTS["roads"]] == road.CONFIGS
    for config, shown in zip(road.CONFIGS, RESULTS["roads"]):
        assert [list(h) for h in road.road(config)] == shown["hops"], f"rerun: {RESULTS['command']}"


def test_each_module_is_entered_once():
    """Each core module is entered at one step of the road. Two steps need one
    twice: validation (``_schema``, with ``_literals`` under it), for the
    hyper-parameters and then for the built groups' overrides, which need the
    first; discovery (``_plugins``), once per entry-point group (hook
    plugins, then optimizers); and the checks of untrusted input (``guards``),
    for the config's nesting and for its regexes."""
    entered = Counter(b for _, b in _core(road.road(road.CONFIGS[0])))
    assert {m: n for m, n in entered.items() if n > 1} == {"_schema": 2, "_literals": 2, "_plugins": 2, "guards": 2}


@needs_plugins
def test_a_wrapper_adds_its_own_resolution_and_validation_only():
    """The precision shorthand walks the inner optimizer's road once: the
    wrapper adds one resolution and one validation (of its own options, and
    of its link's nesting: the inner config is the rewrite hook's, made plain again),
    and the installing of its own first-step checks (``placement``: entered from
    its ``__init__`` and from its base class's, both wrapped by the contract)."""
    wrapped = Counter(b for _, b in _core(road.road(road.CONFIGS[1])))
    alone = {k: v for k, v in road.CONFIGS[1].items() if k != "precision"}
    plain = Counter(b for _, b in _core(road.road(alone, half=True)))
    assert wrapped - plain == Counter(
        ["_registry", "_resolution", "_import_paths", "_plugins", "_names", "_spec", "_schema", "guards",
         "_contract", "placement", "placement"]
    )
    assert not plain - wrapped


def _calls(config, model) -> list[tuple[str, str]]:
    optcore.build_optimizer(dict(config), model)  # warm
    return road.trace(lambda: optcore.build_optimizer(dict(config), model))


def test_the_road_does_not_grow_with_the_model():
    """A build calls across modules a fixed number of times: a model of 40
    layers (160 parameters, each matched against the regex groups) makes the
    calls a model of 1 layer makes."""
    config = {"type": "AdamW", "param_groups": [{"params": r"^0\.", "lr_scale": 2.0}, {"params": "^9$", "optional": True}]}

    def model(layers: int) -> torch.nn.Module:
        return torch.nn.Sequential(*[m for _ in range(layers) for m in (torch.nn.Linear(2, 2), torch.nn.LayerNorm(2))])

    assert _calls(config, model(1)) == _calls(config, model(40))


@pytest.mark.parametrize("module", ["optcore", "optcore.plugin"])
def test_the_type_checking_imports_name_every_lazy_public_name(module):
    """The users' and the plugin authors' modules: the TYPE_CHECKING block (for IDEs
    and type checkers) imports exactly the names of ``_LAZY`` (what runs), each from
    the same module, and each name resolves."""
    public = importlib.import_module(module)
    tree = ast.parse(Path(public.__file__).read_text())
    (block,) = [n for n in tree.body if isinstance(n, ast.If) and getattr(n.test, "id", "") == "TYPE_CHECKING"]
    imported = {a.name: "." * n.level + (n.module or "") for n in block.body for a in n.names}
    assert imported == public._LAZY
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert all(getattr(public, name) is not None for name in public._LAZY)


def test_the_users_and_the_authors_surfaces_share_only_the_optimizer_base():
    """``optcore`` is the users' API and ``optcore.plugin`` the authors'; the one name
    in both is ``Optimizer``: the type users annotate and the class plugins subclass."""
    import optcore.plugin

    assert set(optcore.__all__) & set(optcore.plugin.__all__) == {"Optimizer"}
    assert optcore.Optimizer is optcore.plugin.Optimizer
    assert not set(MOVED) & set(optcore.__all__)
    assert not set(MOVED) & set(dir(optcore))


@pytest.mark.parametrize("name", sorted(MOVED))
def test_a_name_that_left_the_top_level_resolves_with_a_warning_naming_its_place(name):
    module, where = MOVED[name]
    with pytest.warns(DeprecationWarning, match=rf"optcore\.{name} is deprecated .* optcore {REMOVED_IN}") as seen:
        value = getattr(optcore, name)
    assert seen[0].filename == __file__, "the warning points at the line that asked for the name"
    assert value is getattr(importlib.import_module(module), name)
    if where:
        assert f"from {where} import {name}" in str(seen[0].message)
        assert getattr(importlib.import_module(where), name) is value
    else:
        assert "internal" in str(seen[0].message)


def test_from_optcore_import_a_moved_name_warns_at_the_import_line():
    namespace: dict[str, object] = {}
    with pytest.warns(DeprecationWarning, match="from optcore.plugin import hookimpl") as seen:
        exec(compile("from optcore import hookimpl", "<user code>", "exec"), namespace)
    assert seen[0].filename == "<user code>"
    assert namespace["hookimpl"] is importlib.import_module("optcore.plugin").hookimpl
    with pytest.raises(AttributeError, match="no attribute 'hookimpll'"):
        optcore.hookimpll  # noqa: B018 - an unknown name is still an AttributeError


def _moved_names_used(source: str) -> list[str]:
    """The names of :data:`MOVED` that ``source`` takes from ``optcore``'s top level:
    ``from optcore import NAME`` or ``optcore.NAME``."""
    used = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module == "optcore" and node.level == 0:
            used += [a.name for a in node.names if a.name in MOVED]
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "optcore":
            used += [node.attr] if node.attr in MOVED else []
    return used


def test_the_moved_names_check_finds_both_spellings():
    assert _moved_names_used("from optcore import ConfigError, hookimpl\nimport optcore\noptcore.HParams") == [
        "hookimpl", "HParams"]
    assert _moved_names_used("from optcore.plugin import hookimpl\nimport optcore.plugin\noptcore.plugin.HParams") == []


def test_no_code_in_the_repository_uses_a_name_that_left_the_top_level():
    """Plugins hold to the new surfaces (import-linter sees modules, not names, so
    this is a test beside the "plugins use optcore's public API only" contract),
    and so do the core, the tests, the examples and the benchmarks."""
    folders = ["plugins", "optcore", "tests", "examples", "benchmarks", "docs"]
    # only what git tracks: a plugin's build/ folder holds copies of an installed version
    tracked = subprocess.run(["git", "ls-files", "-z", "--", *folders], cwd=ROOT, capture_output=True, check=True)
    files = [ROOT / name for name in tracked.stdout.decode().split("\0") if name.endswith(".py")]
    assert len([f for f in files if "plugins" in f.parts]) > 10
    used = {str(f.relative_to(ROOT)): names for f in files if (names := _moved_names_used(f.read_text()))}
    assert not used, f"import these from optcore.plugin (or stop using internals): {used}"


#: the most lines the core's modules (``optcore/*.py``) may hold together
CORE_LINES = 3450


def test_the_core_stays_small():
    """New code goes into a subsystem package or a plugin (docs/architecture.md,
    "where new things go"), not into the core's modules."""
    lines = {p.name: len(p.read_text().splitlines()) for p in PACKAGE.glob("*.py")}
    assert sum(lines.values()) <= CORE_LINES, (
        f"optcore/*.py holds {sum(lines.values())} lines, over {CORE_LINES}; the largest: "
        f"{sorted(lines.items(), key=lambda kv: -kv[1])[:3]}. Move subsystem code into its package.")


def _table_layers() -> list[tuple[int, set[str]]]:
    """docs/architecture.md's layer table: (layer number, the modules it names)."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    rows = re.findall(r"^\| (\d+) \| ([^|]+) \|", text, re.M)
    return [(int(n), {m.rstrip("/") for m in re.findall(r"`([^`]+)`", cell)}) for n, cell in rows]


def test_the_architecture_pages_layer_table_is_the_import_linter_contract():
    """The table reads the contract bottom up (layer 0 is its last line), one row per
    layer with the same modules, so the page cannot drift from what lint-imports checks."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    (contract,) = [c for c in config["contracts"] if c["type"] == "layers"]
    bottom_up = [{m.strip() for m in layer.split("|")} for layer in reversed(contract["layers"])]
    table = _table_layers()
    assert [n for n, _ in table] == list(range(len(bottom_up)))
    assert [modules for _, modules in table] == bottom_up
    on_disk = {p.stem for p in PACKAGE.glob("*.py") if p.stem != "__init__"} | {
        p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists()}
    assert on_disk == set().union(*bottom_up), "every module of optcore/ has its layer"

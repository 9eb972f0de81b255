"""The resolution modules import only lower layers, and only at module top
(pydantic's laziness excepted); a spec still pickles to its registry's resolve."""

from __future__ import annotations

import ast
import pickle
from pathlib import Path

import pytest
import torch

import optcore
from optcore._spec import OptimizerSpec

CORE = Path(optcore.__file__).parent


def _layers() -> dict[str, int]:
    """module -> rank (higher imports lower), from pyproject.toml's import-linter contract."""
    import tomllib

    config = tomllib.loads((CORE.parent / "pyproject.toml").read_text())["tool"]["importlinter"]
    (contract,) = [c for c in config["contracts"] if c["type"] == "layers"]
    layers = contract["layers"]
    return {name.strip(): len(layers) - i for i, layer in enumerate(layers) for name in layer.split("|")}


LAYERS = _layers()
OWNED = ["_errors", "_names", "_packages", "_spec", "_plugins", "_import_paths", "_resolution", "_registry"]
#: Function-level imports kept on purpose: these modules import pydantic.
LAZY_FOR_PYDANTIC = {"_schema", "_torch_optims"}
KNOWN_EXCEPTIONS: set[tuple[str, str]] = set()


def _optcore_imports(module: str) -> list[tuple[str, bool]]:
    """(imported optcore module, at module top?) for each import in ``module``."""
    tree = ast.parse((CORE / f"{module}.py").read_text())
    top = {id(node) for node in tree.body}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            names = [node.module] if node.module else [a.name for a in node.names]
            found += [(n.split(".")[0], id(node) in top) for n in names]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("optcore."):
            found.append((node.module.split(".")[1], id(node) in top))
    return found


@pytest.mark.parametrize("module", OWNED)
def test_no_module_imports_a_higher_layer(module):
    for imported, _ in _optcore_imports(module):
        if (module, imported) in KNOWN_EXCEPTIONS:
            continue
        assert LAYERS.get(imported, 99) <= LAYERS[module], f"{module} imports {imported}, a higher layer"


@pytest.mark.parametrize("module", OWNED)
def test_function_level_imports_are_only_for_pydantic(module):
    for imported, at_top in _optcore_imports(module):
        if not at_top and (module, imported) not in KNOWN_EXCEPTIONS:
            assert imported in LAZY_FOR_PYDANTIC, f"{module} imports {imported} inside a function"


def test_spec_does_not_know_the_registry():
    assert all(imported != "_registry" for imported, _ in _optcore_imports("_spec"))


def test_specs_pickle_to_their_registrys_resolve(model):
    for spec in (optcore.resolve("AdamW"), optcore.resolve("torch.optim.SGD"), optcore.resolve("optcore-lion:Lion")):
        clone = pickle.loads(pickle.dumps(spec))
        assert (clone.qualified, clone.target) == (spec.qualified, spec.target)
    assert pickle.dumps(optcore.resolve("AdamW")).count(b"optcore._registry") == 1
    from optcore.schedulers import resolve_scheduler

    assert pickle.loads(pickle.dumps(resolve_scheduler("cosine"))).name == "cosine"
    built = optcore.build_optimizer("AdamW", model)
    assert pickle.loads(pickle.dumps(built.optcore_spec)).target is torch.optim.AdamW


def test_a_spec_made_by_hand_says_why_it_does_not_pickle():
    spec = OptimizerSpec(name="X", source="user", provider="me", qualified="user:X", loader=lambda: None)
    with pytest.raises(TypeError, match="not made by a registry"):
        pickle.dumps(spec)

"""The CLI as a newcomer meets it: exported config-file schemas that real files
pass, listings that survive a pipe, descriptions that describe the class, and a
``--help`` that imports nothing heavy."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest

import optcore
from optcore.files import load_config_file
from optcore.cli import config_file_schema, main, optimizer_file_schema

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.fixture(scope="module")
def file_schema() -> dict:
    schema = config_file_schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    return schema


def _example_files() -> list[Path]:
    return [p for p in sorted(EXAMPLES.rglob("*.yaml")) if "hydra" not in p.parts]


@pytest.mark.parametrize("path", _example_files(), ids=lambda p: p.name)
def test_every_example_file_matches_the_exported_schema(file_schema, path):
    jsonschema.validate(load_config_file(path), file_schema)


@pytest.mark.parametrize(
    "broken",
    [
        {"optimizer": {"type": "AdamW", "lr": -1.0}},  # constraint
        {"optimizer": {"type": "AdamW", "learning_rate": 1e-3}},  # unknown key
        {"optimizer": {"type": "AdamW"}, "num_training_step": 10},  # typo at the top
        {"configs": [{"name": "x", "optimizer": {"type": "SGD", "momentum": "lots"}}]},
        {"configs": [{"optimizer": {"type": "SGD"}, "search_space": {"learning_rate": [1e-3, 1e-1]}}]},  # name
        {"configs": [{"optimizer": {"type": "SGD"}, "search_space": {"lr": [1e-3, 1e-1, "cubic"]}}]},  # scale
        {"configs": [{"optimizer": {"type": "SGD"}, "search_space": {"lr": {"low": 1e-3}}}]},  # no high
    ],
)
def test_a_broken_file_fails_the_schema(file_schema, broken):
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(broken, file_schema)


def test_one_optimizer_schema_describes_a_config_file():
    schema = optimizer_file_schema(optcore.resolve("AdamW"))
    assert {"type", "lr", "param_groups", "optim_args", "no_decay"} <= set(schema["properties"])
    assert "AdamW" in schema["properties"]["type"]["enum"] and schema["required"] == ["type"]
    jsonschema.validate({"type": "AdamW", "lr": 1e-3, "param_groups": [{"params": "^head", "lr_scale": 2}]}, schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"type": "AdamW", "lr": 1e-3, "wd": 0.1}, schema)


def test_plugin_keys_are_in_the_schema_when_the_plugin_is_installed():
    if not any(s.name == "FP16Optimizer" for s in optcore.list_optimizers()):
        pytest.skip("optcore-fp16 is not installed")
    schema = optimizer_file_schema(optcore.resolve("SGD"))
    assert {"precision", "memory_efficient", "loss_scaler"} <= set(schema["properties"])


def test_list_piped_is_not_cut(capsys, monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)  # with it, plain output fits that width (test_cli_list_width.py)
    assert main(["list", "--all"]) == 0  # capsys: not a terminal
    out = capsys.readouterr().out
    assert "…" not in out
    lines = out.splitlines()
    for spec in optcore.list_optimizers(all=True):
        assert any(spec.qualified in line.split() for line in lines), spec.qualified


def test_show_uses_the_class_or_module_docstring_and_names_other_providers(capsys):
    from optcore.cli._show import description

    class Undocumented(optcore.Optimizer):
        pass

    assert "Base class" not in description(Undocumented)
    assert main(["show", "AdamW", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["description"].startswith("Implements AdamW")
    lion = [s for s in optcore.list_optimizers(all=True) if s.name == "Lion"]
    if len(lion) > 1:
        assert main(["show", "Lion", "--json"]) == 0
        info = json.loads(capsys.readouterr().out)
        assert "Base class for all optimizers" not in info["description"]
        assert {p["type"] for p in info["providers"]} == {s.qualified for s in lion} - {info["qualified"]}


def test_help_imports_no_torch_and_list_no_third_party_package():
    """``list`` imports no third-party optimizer package, nor torch's compiler
    stack (``torch._dynamo`` costs ~1 s: adapting LBFGS once imported it)."""
    code = (
        "import sys\nfrom optcore.cli import main\n"
        "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
        "print('HELP', sorted({'torch', 'pydantic', 'rich'} & set(sys.modules)))\n"
        "main(['list'])\n"
        "print('LIST', sorted(m for m in ('pytorch_optimizer', 'lion_pytorch', 'transformers', 'timm', 'optimi', "
        "'optcore_lion', 'optcore_fp16', 'torch._dynamo') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.splitlines()
    marks = dict(line.split(" ", 1) for line in out if line.startswith(("HELP ", "LIST ")))
    assert marks["HELP"] == "[]"
    assert marks["LIST"] == "[]"

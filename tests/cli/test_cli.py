"""The optcore command."""

from __future__ import annotations

import json

import pytest

from optcore.cli import build_parser, main


def test_list_json_has_sources_flags_and_shadowing(capsys):
    assert main(["list", "--json", "--all"]) == 0
    rows = json.loads(capsys.readouterr().out)
    by_q = {r["qualified"]: r for r in rows}
    assert by_q["torch:AdamW"]["source"] == "torch"
    assert by_q["torch:AdamW"]["capabilities"]["supports_step_with_scale"] is True
    assert "shadowed" in by_q["torch:AdamW"]


def test_list_table_and_schedulers(capsys):
    assert main(["list", "--no-flags"]) == 0
    assert "AdamW" in capsys.readouterr().out
    assert main(["list", "--schedulers", "--json"]) == 0
    assert "cosine" in {r["name"] for r in json.loads(capsys.readouterr().out)}


def test_show(capsys):
    assert main(["show", "adamw", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    fields = {f["field"]: f for f in info["fields"]}
    assert fields["lr"]["default"] == "0.001" and "fused" in info["implementation"]
    assert main(["show", "cosine"]) == 0
    assert main(["show", "nosuchthing"]) == 1
    assert "No optimizer named" in capsys.readouterr().err


@pytest.mark.parametrize("suffix,text,ok", [
    (".json", '{"type": "AdamW", "lr": 0.001}', True),
    (".yaml", "optimizer:\n  type: Lion\n  lr: 1e-4\nlr_scheduler:\n  type: cosine\n  warmup_steps: 10\nnum_training_steps: 100\n", True),
    (".toml", 'type = "SGD"\nlr = 0.1\nmomentum = 0.9\n', True),
    (".json", '{"type": "AdamW", "lr": -1, "bettas": [0.9, 0.9]}', False),
    (".yaml", "optimizer: {type: AdamW}\nlr_scheduler: {type: cosine, warmup_steps: -5}\n", False),
    (".json", "{not json", False),
])
def test_check(tmp_path, capsys, suffix, text, ok):
    path = tmp_path / f"c{suffix}"
    path.write_text(text)
    assert main(["check", str(path)]) == (0 if ok else 1)
    if not ok:
        assert capsys.readouterr().err.strip()


def test_check_names_each_bad_file_and_checks_the_rest(tmp_path, capsys):
    good, bad = tmp_path / "good.yaml", tmp_path / "bad.json"
    good.write_text("type: SGD\nlr: 0.1\n")
    bad.write_text('{"type": "AdamW", "lr": -1}')
    assert main(["check", str(bad), str(tmp_path / "missing.yaml"), str(good)]) == 1
    out, err = capsys.readouterr()
    assert out == f"{good}: OK\n"
    assert f"{bad}: 1 error\n  Invalid configuration for AdamW:" in err and f"{tmp_path / 'missing.yaml'}: 1 error" in err
    assert err.rstrip().endswith("2 of 3 files failed")


def test_the_check_transcript_in_the_docs_is_what_check_prints(capsys, monkeypatch):
    """docs/cli.md shows a run of `optcore check`: run it, and compare every line."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    page = (root / "docs" / "cli.md").read_text()
    block = page.split("```text\n$ optcore check ", 1)[1].split("```", 1)[0]
    command, _, shown = block.partition("\n")
    monkeypatch.chdir(root)
    assert main(["check", *command.split()]) == 1
    out, err = capsys.readouterr()
    assert out + err == shown


def test_schema_export(capsys):
    assert main(["schema", "AdamW"]) == 0
    schema = json.loads(capsys.readouterr().out)
    assert schema["properties"]["lr"]["minimum"] == 0
    assert schema["additionalProperties"] is False


def test_check_accepts_compare_and_run_files(tmp_path, capsys):
    from pathlib import Path

    examples = Path(__file__).resolve().parents[2] / "examples"
    assert main(["check", str(examples / "compare.yaml")]) == 0
    assert main(["check", str(examples / "run.yaml")]) == 0
    bad = tmp_path / "cmp.yaml"
    bad.write_text("- {name: a, optimizer: {type: AdamW, lr: -1}}\n- {type: Lion, lr: 3e-4}\n")
    assert main(["check", str(bad)]) == 1
    assert "lr" in capsys.readouterr().err


def test_show_says_types_and_constraints_as_a_reader_writes_them(capsys):
    """Not pydantic's internals (``WrapValidator(func=<function ... at 0x...>)``,
    ``strict=True``) nor a bare ``Optional``: the bounds, "finite", and what a
    Literal or an Optional allows."""
    assert main(["show", "torch:Adafactor", "--json"]) == 0
    fields = {f["field"]: f for f in json.loads(capsys.readouterr().out)["fields"]}
    assert fields["lr"]["constraints"] == ">= 0.0, finite" and fields["d"]["constraints"] == "> 0.0"
    assert fields["foreach"]["type"] == "bool | None" and fields["maximize"]["constraints"] == ""
    # a tuple's constraints are its members'
    assert fields["eps"]["type"] == "tuple[float | None, float]" and fields["eps"]["constraints"] == "each >= 0.0"
    assert main(["show", "optcore-lion:Lion", "--json"]) == 0
    fields = {f["field"]: f for f in json.loads(capsys.readouterr().out)["fields"]}
    assert fields["betas"]["constraints"] == "each >= 0.0, < 1.0, finite"
    assert main(["show", "torch:Rprop", "--json"]) == 0
    fields = {f["field"]: f for f in json.loads(capsys.readouterr().out)["fields"]}
    assert fields["etas"]["constraints"] == "each > 0.0" and fields["step_sizes"]["constraints"] == "each >= 0.0"
    assert main(["show", "torch:Adafactor"]) == 0
    table = capsys.readouterr().out
    assert "0x" not in table and "Validator" not in table and "strict" not in table
    pytest.importorskip("optcore_adafactor")
    assert main(["show", "optcore-adafactor:Adafactor", "--json"]) == 0
    fields = {f["field"]: f for f in json.loads(capsys.readouterr().out)["fields"]}
    assert fields["implementation"]["type"] == "Literal['auto', 'c', 'torch', 'compiled']"
    assert fields["beta1"]["type"] == "float | None"


def test_show_names_each_member_when_a_tuples_members_differ():
    from typing import Annotated

    from pydantic import Field

    from optcore.cli._show import _member_constraints

    assert _member_constraints(tuple[Annotated[float, Field(gt=0)], float]) == ["[0] > 0", "[1] any"]
    assert _member_constraints(tuple[float, float]) == [] and _member_constraints(float) == []
    positive = Annotated[float, Field(gt=0)]
    # a union's alternatives (Adan's betas: two or three) share theirs; None adds none
    assert _member_constraints(tuple[positive, positive] | tuple[positive, positive, positive] | None) == ["each > 0"]
    assert _member_constraints(tuple[positive, positive] | tuple[float, float]) == []


def test_a_warning_is_one_clean_line(tmp_path, capsys):
    """Not Python's form (``.../bin/optcore:8: ShadowedNameWarning: ...`` and the
    ``sys.exit(main())`` line under it): one ``optcore: warning:`` line per warning."""
    pytest.importorskip("lion_pytorch")
    pytest.importorskip("optcore_lion")
    from optcore._registry import OPTIMIZERS

    OPTIMIZERS._warned.clear()  # the shadowing warning is said once per process
    path = tmp_path / "lion.yaml"
    path.write_text("type: Lion\nlr: 1e-4\n")
    assert main(["check", str(path)]) == 0
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert lines and all(line.startswith("optcore: warning: ") for line in lines), err
    assert "Warning:" not in err and "sys.exit" not in err and "resolved to lion_pytorch:Lion" in err


def test_the_error_count_counts_problems_not_sections(tmp_path, capsys):
    """One optimizer section with three bad fields is three errors; with a bad
    scheduler section beside it, four."""
    path = tmp_path / "bad.yaml"
    path.write_text("type: AdamW\nlr: -1\nbettas: [0.9, 0.9]\nweight_decay: -2\n")
    assert main(["check", str(path)]) == 1
    assert capsys.readouterr().err.startswith(f"{path}: 3 errors\n")
    path.write_text("optimizer: {type: AdamW, lr: -1, bettas: [0.9, 0.9], weight_decay: -2}\n"
                    "lr_scheduler: {type: cosine, warmup_steps: -1}\nnum_training_steps: 10\n")
    assert main(["check", str(path)]) == 1
    assert capsys.readouterr().err.startswith(f"{path}: 4 errors\n")


def test_show_says_what_a_class_takes_of_its_parameters(capsys):
    assert main(["show", "Muon", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["parameters"] == ["2-D parameters only (matrices)", "real parameters only"]
    assert main(["show", "Muon"]) == 0
    assert "Parameters: 2-D parameters only (matrices); real parameters only" in capsys.readouterr().out
    assert main(["show", "AdamW", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["parameters"] == []


def test_list_says_what_it_hides_and_what_its_flag_column_means(capsys, monkeypatch):
    import optcore

    monkeypatch.delenv("COLUMNS", raising=False)  # pytest-xdist's workers set 80: the notes' lines whole, as piped

    assert main(["list"]) == 0
    out = capsys.readouterr().out
    assert "✓ true, · false" in out and "supports_memory_efficient_fp16 / supports_step_with_scale" in out
    listed = {s.qualified for s in optcore.list_optimizers()}
    hidden = {s.qualified: s for s in optcore.list_optimizers(ask_packages=True) if s.qualified not in listed}
    if hidden:  # pytorch_optimizer's AdaMuon, MuonClip, ...: resolvable, and their packages named with the way to see them
        providers = {s.provider for s in hidden.values()}
        assert "Not listed: the further names that the registries of" in out and "`optcore list --all` lists them" in out
        assert all(p in out for p in providers)
        assert all(optcore.resolve(s.qualified) for s in list(hidden.values())[:3])
        assert main(["list", "--all", "--no-flags"]) == 0
        shown = capsys.readouterr().out
        assert "Not listed" not in shown and all(q in shown for q in hidden)
    help_text = build_parser()._subparsers._group_actions[0].choices["list"].format_help()
    assert "registries" in help_text and "shadowed" in help_text


def test_a_name_only_a_missing_known_package_has_says_what_to_install():
    """AdamW8bit -> bitsandbytes, and every class of every package optcore knows
    that is not installed (and that nothing installed resolves)."""
    import optcore
    from optcore._packages import KNOWN_PACKAGES, is_installed

    missing = [(p.distribution, c) for p in KNOWN_PACKAGES if not is_installed(p.top_level) for c in p.classes]
    if not missing:
        pytest.skip("every package optcore knows is installed")
    checked = 0
    for dist, name in missing:
        try:
            optcore.resolve(name)
        except optcore.OptimizerNotFoundError as exc:
            assert f"`pip install {dist}`" in str(exc) and "not installed" in str(exc), str(exc)
            checked += 1
    assert checked
    if ("bitsandbytes", "AdamW8bit") in missing:
        with pytest.raises(optcore.OptimizerNotFoundError, match="optimizer of bitsandbytes.*pip install bitsandbytes"):
            optcore.resolve("adamw_8bit")


_PROBE = """
import pathlib
pathlib.Path(__file__).with_name("RAN").write_text("imported")
import torch


class ProbeSGD(torch.optim.SGD):
    pass
"""


@pytest.mark.parametrize("command", ["check", "show --config", "show"])
def test_check_and_show_do_not_import_the_module_a_config_names(tmp_path, capsys, monkeypatch, command):
    """``{"type": "this:x"}`` printed the Zen of Python; a module beside the
    config ran. The module is located, not run, and the message names the
    switches; --import-modules judges it by importing (as a build does)."""
    import sys

    module = f"optcore_probe_{command.replace(' ', '_').replace('-', '')}"
    (tmp_path / f"{module}.py").write_text(_PROBE)
    monkeypatch.syspath_prepend(str(tmp_path))
    config = tmp_path / "c.json"
    config.write_text(json.dumps({"type": f"{module}:ProbeSGD", "lr": 0.1}))
    target = str(config) if command != "show" else f"{module}.ProbeSGD"
    argv = [*command.split(), target]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert not (tmp_path / "RAN").exists() and module not in sys.modules
    assert f"module {module} ({tmp_path / module}.py)" in err.replace("\n  ", " ")
    assert "--import-modules" in err and "OPTCORE_ALLOW_IMPORT_PATHS=0" in err
    assert main([argv[0], "--import-modules", *argv[1:]]) == 0
    assert (tmp_path / "RAN").exists()
    sys.modules.pop(module, None)


def test_check_never_runs_this(tmp_path, capsys):
    import sys

    config = tmp_path / "zen.json"
    config.write_text('{"type": "this:x"}')
    had = "this" in sys.modules
    assert main(["check", str(config)]) == 1
    out = capsys.readouterr()
    assert "Beautiful is better than ugly" not in out.out + out.err
    assert had or "this" not in sys.modules


def test_check_of_a_module_that_is_nowhere_says_so_without_importing_its_parent(tmp_path, capsys, monkeypatch):
    package = tmp_path / "optcore_probe_pkg"
    package.mkdir()
    (package / "__init__.py").write_text('raise SystemExit("the package ran")')
    monkeypatch.syspath_prepend(str(tmp_path))
    config = tmp_path / "c.json"
    config.write_text('{"type": "optcore_probe_pkg.missing:X"}')
    assert main(["check", str(config)]) == 1
    err = capsys.readouterr().err
    assert "There is no module 'optcore_probe_pkg.missing'" in err and "the package ran" not in err

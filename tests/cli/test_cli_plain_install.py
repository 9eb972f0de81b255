"""The ``optcore`` command in a plain ``pip install optcore``: no rich, no
PyYAML, no matplotlib (the extras). ``list``, ``show``, ``check`` and ``schema``
work, every command an optcore message tells the user to run works, and an
application that needs an extra says which one, without a traceback.

The extras are hidden from a fresh interpreter by a ``sys.meta_path`` finder
that refuses to import them, as if they were not installed.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap

import pytest
import torch

import optcore

HIDDEN = ("rich", "yaml", "matplotlib", "optuna")
PRELUDE = textwrap.dedent(f"""
    import contextlib, io, json, sys, traceback

    class NotInstalled:
        def find_spec(self, name, path=None, target=None):
            if name.partition(".")[0] in {HIDDEN!r}:
                raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
            return None

    sys.meta_path.insert(0, NotInstalled())
    from optcore.cli import main

    results = []
    for argv in json.loads(sys.argv[1]):
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                rc = main(argv)
            except SystemExit as exc:
                rc = exc.code
            except BaseException:
                traceback.print_exc()
                rc = "raised"
        results.append({{"rc": rc, "out": out.getvalue(), "err": err.getvalue()}})
    print(json.dumps(results))
""")


def optcore_cli(*commands: list[str], cwd=None) -> list[dict]:
    """Each command's exit code, stdout and stderr, run by ``main`` in one fresh
    interpreter where the extras cannot be imported."""
    done = subprocess.run([sys.executable, "-c", PRELUDE, json.dumps(commands)], capture_output=True, text=True,
                          timeout=300, cwd=cwd)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def commands_named_by_errors() -> set[str]:
    """The `optcore ...` commands optcore's own error messages tell the user to run."""
    messages = []
    model = torch.nn.Linear(2, 2)
    for config in ({"type": "AdamWW"}, {"type": "AdamW", "lr": -1}, {"type": "AdamW", "lrr": 1},
                   {"type": "lion_pytorch:Lion", "lr": -1}, {"type": "nosuchpackage.Opt"}):
        try:
            optcore.build_optimizer(config, model)
        except optcore.OptcoreError as exc:
            messages.append(str(exc))
    for config in ({"type": "cosin"}, {"type": "cosine", "warmup_steps": -1}):
        try:
            optcore.build_scheduler(config, torch.optim.SGD(model.parameters(), lr=0.1), num_training_steps=10)
        except optcore.OptcoreError as exc:
            messages.append(str(exc))
    return {m for message in messages for m in re.findall(r"`(optcore [^`]+)`", message)}


def test_the_messages_name_commands():
    named = commands_named_by_errors()
    assert {"optcore list", "optcore show AdamW", "optcore list --schedulers"} <= named


def test_every_command_a_message_names_works_without_the_extras():
    named = sorted(commands_named_by_errors())
    for command, done in zip(named, optcore_cli(*(c.split()[1:] for c in named))):
        assert done["rc"] == 0, (command, done["err"])
        assert "Traceback" not in done["err"] and done["out"].strip()


def test_list_show_check_and_schema_work_without_the_extras(tmp_path):
    config = tmp_path / "opt.json"
    config.write_text(json.dumps({"optimizer": {"type": "AdamW", "lr": 3e-4},
                                  "lr_scheduler": {"type": "cosine", "warmup_steps": 10}, "num_training_steps": 100}))
    commands = (["list"], ["list", "--schedulers"], ["show", "AdamW"], ["show", "cosine"],
                ["show", "--config", str(config)], ["check", str(config)], ["schema", "AdamW"])
    results = optcore_cli(*commands)
    for args, done in zip(commands, results):
        assert done["rc"] == 0, (args, done["err"])
        assert "Traceback" not in done["err"] and "[bold]" not in done["out"]
    assert "torch:AdamW" in results[4]["out"] and "lr_scheduler: optcore:cosine" in results[4]["out"]


def test_yaml_and_the_applications_name_the_extra_they_need(tmp_path):
    config = tmp_path / "opt.yaml"
    config.write_text("type: AdamW\n")
    check, compare = optcore_cli(["check", str(config)],
                                 ["compare", "--optimizers", "AdamW", "--steps", "1", "--out", str(tmp_path / "out")],
                                 cwd=tmp_path)
    assert check["rc"] == 1 and "Traceback" not in check["err"]
    assert "needs PyYAML" in check["err"] and "pip install 'optcore[yaml]'" in check["err"]
    assert compare["rc"] == 1 and "Traceback" not in compare["err"], compare["err"]
    assert "pip install 'optcore[compare]'" in compare["err"]


def test_show_on_a_terminal_without_rich_prints_plain_text(monkeypatch, capsys):
    """A terminal is where rich would be used: without it, plain text, not a crash."""
    from optcore.cli import main

    class NotInstalled:
        def find_spec(self, name, path=None, target=None):
            if name.partition(".")[0] == "rich":
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            return None

    for name in [m for m in sys.modules if m.partition(".")[0] == "rich"]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setattr(sys, "meta_path", [NotInstalled(), *sys.meta_path])
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
    assert main(["show", "AdamW"]) == 0
    assert main(["list", "--no-flags"]) == 0
    out = capsys.readouterr().out
    assert "hyper-parameters" in out and "[bold]" not in out and "torch:AdamW" in out

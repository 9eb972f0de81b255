"""``optcore show --config FILE`` shows everything the build will do: the
optimizer's plan, the automatic no-decay group, the file's ``lr_scheduler``;
and it reads every file ``optcore check`` reads (compare files too)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from optcore.cli import main

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
RUN = "optimizer: {type: AdamW, lr: 3.0e-4, weight_decay: 0.1}\nlr_scheduler: {type: cosine, warmup_steps: 500}\n"
COMPARE = ("- {name: adamw, optimizer: {type: AdamW, lr: 3.0e-3}, lr_scheduler: {type: cosine, warmup_steps: 10}}\n"
           "- {name: sgd, type: SGD, lr: 0.1, momentum: 0.9}\n")


def show(tmp_path, text, *flags, suffix=".yaml"):
    path = tmp_path / f"c{suffix}"
    path.write_text(text)
    return main(["show", "--config", str(path), *flags])


def test_the_files_schedule_and_the_no_decay_group_are_shown(tmp_path, capsys):
    assert show(tmp_path, RUN + "num_training_steps: 1000\n", "--json") == 0
    info = json.loads(capsys.readouterr().out)
    assert info["type"] == "torch:AdamW" and info["hparams"]["weight_decay"] == 0.1
    assert "weight_decay=0.0 for biases and normalisation weights" in info["no_decay_group"]
    sched = info["lr_scheduler"]
    assert sched["type"] == "optcore:cosine"
    assert sched["arguments"]["warmup_steps"] == 500 and sched["arguments"]["num_training_steps"] == 1000
    assert "note" not in sched
    assert show(tmp_path, RUN + "num_training_steps: 1000\n") == 0
    out = capsys.readouterr().out
    assert "no-decay group: weight_decay=0.0" in out and "lr_scheduler: optcore:cosine" in out
    assert "warmup_steps = 500" in out and "num_training_steps = 1000" in out


def test_a_length_from_code_is_shown_as_such(tmp_path, capsys):
    assert show(tmp_path, RUN, "--json") == 0
    sched = json.loads(capsys.readouterr().out)["lr_scheduler"]
    assert sched["arguments"]["num_training_steps"].startswith("given at build")
    assert "optcore.build(config, model, num_training_steps=N)" in sched["note"]


@pytest.mark.parametrize("config,shown", [
    ({"type": "AdamW", "weight_decay": 0.0}, None),  # nothing to split off
    ({"type": "AdamW", "no_decay": False}, "none ('no_decay': false)"),
    ({"type": "Adadelta", "weight_decay": 0.1}, "weight_decay=0.0 for biases"),
    ({"type": "FP16Optimizer", "optimizer": {"type": "AdamW"}}, "weight_decay=0.0 for biases"),  # AdamW: 0.01
])
def test_the_no_decay_group_is_shown_when_the_build_makes_it(tmp_path, capsys, config, shown):
    assert show(tmp_path, json.dumps(config), "--json", suffix=".json") == 0
    info = json.loads(capsys.readouterr().out)
    info = info.get("wraps", info)
    assert (shown is None and "no_decay_group" not in info) or shown in info["no_decay_group"]


def test_compare_files_are_shown_run_by_run(tmp_path, capsys):
    assert show(tmp_path, COMPARE, "--json") == 0
    runs = json.loads(capsys.readouterr().out)
    assert [r["name"] for r in runs] == ["adamw", "sgd"]
    assert runs[0]["lr_scheduler"]["type"] == "optcore:cosine" and "lr_scheduler" not in runs[1]
    assert runs[1]["hparams"]["momentum"] == 0.9
    assert show(tmp_path, COMPARE) == 0
    out = capsys.readouterr().out
    assert "run adamw" in out and "run sgd" in out


@pytest.mark.parametrize("path", sorted(p for p in EXAMPLES.glob("*.yaml")), ids=lambda p: p.name)
def test_every_example_file_check_accepts_is_shown(path, capsys):
    if main(["check", str(path)]) != 0:
        pytest.skip("check refuses it")
    capsys.readouterr()
    assert main(["show", "--config", str(path)]) == 0, capsys.readouterr().err

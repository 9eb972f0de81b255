"""``optcore check`` on a config whose schedule gets its length from code
(``optcore.build(config, model, num_training_steps=N)``, the README's pattern):
``--num-training-steps N`` checks it with that length, and without it the file
passes with a note saying where the length must come from."""

from __future__ import annotations

import pytest
import torch

import optcore
from optcore.cli import check_config, main

#: the README's "three ways in" config: the length is passed to optcore.build
README_CONFIG = {"optimizer": {"type": "AdamW", "lr": 3e-4}, "lr_scheduler": {"type": "cosine", "warmup_steps": 500}}


@pytest.fixture
def run_file(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("optimizer: {type: AdamW, lr: 3.0e-4}\nlr_scheduler: {type: cosine, warmup_steps: 500}\n")
    return path


def test_the_readme_pattern_builds_and_checks_with_a_note(run_file, capsys):
    optcore.build(README_CONFIG, torch.nn.Linear(2, 2), num_training_steps=10_000)
    assert main(["check", str(run_file)]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"{run_file}: OK\n  note: cosine needs the length of the run")
    assert "num_training_steps=N" in out and "--num-training-steps N" in out


def test_the_flag_gives_the_length_and_no_note(run_file, capsys):
    assert main(["check", "--num-training-steps", "10000", str(run_file)]) == 0
    assert capsys.readouterr().out == f"{run_file}: OK\n"


@pytest.mark.parametrize("bad", ["0", "-3", "1.5", "many"])
def test_the_flag_takes_a_positive_whole_number(run_file, bad, capsys):
    with pytest.raises(SystemExit) as info:
        main(["check", f"--num-training-steps={bad}", str(run_file)])
    assert info.value.code == 2
    assert "positive whole number of steps" in capsys.readouterr().err


def test_a_length_from_code_hides_no_other_error():
    notes: list[str] = []
    errors = check_config({**README_CONFIG, "lr_scheduler": {"type": "cosine", "warmup_steps": -5}}, notes=notes)
    assert len(errors) == 1 and "warmup_steps" in errors[0] and "length of the run" not in errors[0]


def test_the_flag_wins_over_the_file_as_builds_argument_does():
    config = {**README_CONFIG, "num_training_steps": "bad"}
    with pytest.raises(optcore.ConfigError):
        optcore.build(config, torch.nn.Linear(2, 2))
    optcore.build(config, torch.nn.Linear(2, 2), num_training_steps=1000)
    assert check_config(config) and check_config(config, num_training_steps=1000) == []


def test_a_schedule_that_needs_no_length_gets_no_note():
    notes: list[str] = []
    assert check_config({**README_CONFIG, "lr_scheduler": {"type": "constant"}}, notes=notes) == [] and notes == []

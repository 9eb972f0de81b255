"""optcore.add_args / config_from_args: flags from schemas, parsed and validated."""

from __future__ import annotations

import argparse
import sys
import warnings

import pytest
import torch

import optcore
from optcore.plugin import HParams


def parse(argv: list[str], parser: argparse.ArgumentParser | None = None, **kwargs) -> argparse.Namespace:
    parser = parser or argparse.ArgumentParser(prog="train")
    optcore.add_args(parser, argv, **kwargs)
    return parser.parse_args(argv)


def help_text(argv: list[str], capsys: pytest.CaptureFixture[str], **kwargs) -> str:
    with pytest.raises(SystemExit) as exit_info:
        parse([*argv, "--help"], **kwargs)
    assert exit_info.value.code == 0
    return capsys.readouterr().out


def parse_error(argv: list[str], capsys: pytest.CaptureFixture[str], **kwargs) -> str:
    with pytest.raises(SystemExit) as exit_info:
        parse(argv, **kwargs)
    assert exit_info.value.code == 2
    return capsys.readouterr().err


# ---------------------------------------------------------------- types
def test_values_get_the_schema_types():
    args = parse(["--optimizer", "adamw", "--lr", "3e-4", "--weight-decay", "0.1", "--eps", "1e-6"])
    assert args.lr == 3e-4 and isinstance(args.lr, float)
    assert args.weight_decay == 0.1
    assert optcore.config_from_args(args) == {"type": "adamw", "lr": 3e-4, "weight_decay": 0.1, "eps": 1e-6}


def test_int_fields_accept_scientific_step_counts():
    argv = ["--optimizer", "sgd", "--lr-scheduler", "cosine", "--warmup-steps", "1e3", "--num-training-steps", "20"]
    args = parse(argv)
    assert args.warmup_steps == 1000 and isinstance(args.warmup_steps, int)
    with pytest.raises(SystemExit):
        parse(["--optimizer", "sgd", "--lr-scheduler", "cosine", "--warmup-steps", "2.5"])


def test_a_word_that_is_not_of_the_type_is_an_argparse_error(capsys):
    err = parse_error(["--optimizer", "adamw", "--lr", "fast"], capsys)
    assert "--lr" in err and "invalid float value: 'fast'" in err


def test_literal_fields_are_choices(capsys):
    args = parse(["--optimizer", "sgd", "--lr-scheduler", "ReduceLROnPlateau", "--mode", "max"])
    assert optcore.config_from_args(args)["lr_scheduler"] == {"type": "ReduceLROnPlateau", "mode": "max"}
    err = parse_error(["--optimizer", "sgd", "--lr-scheduler", "ReduceLROnPlateau", "--mode", "up"], capsys)
    assert "invalid choice" in err and "min" in err


def test_lists_and_scalar_or_list_fields():
    args = parse(["--optimizer", "sgd", "--lr-scheduler", "MultiStepLR", "--milestones", "3", "6"])
    assert optcore.config_from_args(args)["lr_scheduler"]["milestones"] == [3, 6]
    args = parse(["--optimizer", "sgd", "--lr-scheduler", "ReduceLROnPlateau", "--min-lr", "0.01"])
    assert args.min_lr == 0.01  # float | list[float]: one value stays a float
    args = parse(["--optimizer", "sgd", "--lr-scheduler", "ReduceLROnPlateau", "--min-lr", "0.01", "0.02"])
    assert args.min_lr == [0.01, 0.02]


# ------------------------------------------------------------- defaults
def test_defaults_come_from_the_schema_and_are_left_out_of_the_config():
    args = parse(["--optimizer", "adamw"])
    fields = optcore.resolve("adamw").schema.model_fields
    assert args.lr == fields["lr"].default
    assert args.betas == fields["betas"].default
    assert args.fused is None
    # only given fields: optcore still chooses the fused kernel itself
    assert optcore.config_from_args(args) == {"type": "adamw"}


def test_full_config_lists_every_field():
    config = optcore.config_from_args(parse(["--optimizer", "adamw", "--lr", "0.01"]), full=True)
    assert config["lr"] == 0.01
    assert set(config) == {"type", *optcore.resolve("adamw").schema.model_fields}


def test_a_value_given_equal_to_the_default_still_counts_as_given():
    args = parse(["--optimizer", "adamw", "--lr", "0.001", "--no-fused"])
    assert optcore.config_from_args(args) == {"type": "adamw", "lr": 0.001, "fused": False}


def test_values_changed_on_args_after_parsing_are_included():
    args = parse(["--optimizer", "adamw"])
    args.lr = 0.5
    assert optcore.config_from_args(args) == {"type": "adamw", "lr": 0.5}


def test_default_optimizer_when_none_is_named():
    args = parse([], default="sgd")
    assert args.optimizer == "sgd" and args.momentum == 0.0
    assert optcore.config_from_args(args) == {"type": "sgd"}


def test_optimizer_is_required_without_a_default(capsys):
    assert "--optimizer" in parse_error([], capsys)


def test_optimizer_is_read_from_sys_argv(monkeypatch):
    argv = ["--optimizer=sgd", "--momentum", "0.9"]
    monkeypatch.setattr(sys, "argv", ["train.py", *argv])
    parser = argparse.ArgumentParser()
    optcore.add_args(parser)
    assert optcore.config_from_args(parser.parse_args()) == {"type": "sgd", "momentum": 0.9}


# ------------------------------------------------------------- booleans
@pytest.mark.parametrize(("flag", "value"), [("--amsgrad", True), ("--no-amsgrad", False)])
def test_boolean_flags(flag, value):
    args = parse(["--optimizer", "adamw", flag])
    assert args.amsgrad is value
    assert optcore.config_from_args(args) == {"type": "adamw", "amsgrad": value}


def test_kebab_case_boolean_maps_back_to_the_snake_case_field():
    name = "optcore-adafactor:Adafactor"
    args = parse(["--optimizer", name, "--no-scale-parameter", "--no-relative-step", "--lr", "1e-3"])
    assert args.scale_parameter is False
    assert optcore.config_from_args(args) == {
        "type": name,
        "lr": 1e-3,
        "scale_parameter": False,
        "relative_step": False,
    }


# --------------------------------------------------------------- tuples
def test_tuples_take_one_word_per_element(capsys):
    args = parse(["--optimizer", "adamw", "--betas", "0.9", "0.95"])
    assert args.betas == (0.9, 0.95)
    assert optcore.config_from_args(args)["betas"] == (0.9, 0.95)
    assert "expected 2 arguments" in parse_error(["--optimizer", "adamw", "--betas", "0.9"], capsys)


def test_optional_fields_and_tuple_elements_accept_none():
    args = parse(["--optimizer", "torch:Adafactor", "--eps", "none", "1e-3"])
    assert optcore.config_from_args(args)["eps"] == (None, 1e-3)
    args = parse(["--optimizer", "sgd", "--lr-scheduler", "inverse_sqrt", "--timescale", "None"])
    assert args.timescale is None
    args = parse(["--optimizer", "sgd", "--lr-scheduler", "inverse_sqrt", "--timescale", "50"])
    assert args.timescale == 50


# ------------------------------------------------------------ help text
def test_help_lists_the_chosen_optimizers_flags(capsys):
    out = help_text(["--optimizer", "adamw"], capsys)
    assert "optimizer (AdamW)" in out
    for flag in ("--lr LR", "--betas BETAS BETAS", "--weight-decay", "--amsgrad, --no-amsgrad"):
        assert flag in out
    assert "learning rate (default: 0.001)" in out
    assert "coefficients of the running averages" in out


def test_help_without_an_optimizer_lists_only_the_selectors(capsys):
    out = help_text([], capsys)
    assert "--optimizer NAME" in out and "--lr-scheduler NAME" in out
    assert "--weight-decay" not in out


def test_help_lists_the_schedulers_flags(capsys):
    out = help_text(["--optimizer", "lion_pytorch:Lion", "--lr-scheduler", "cosine"], capsys)
    assert "lr scheduler (cosine)" in out and "--warmup-steps" in out and "--num-training-steps" in out


def test_percent_signs_in_descriptions_do_not_break_help(capsys):
    from pydantic import Field

    class PctConfig(HParams):
        lr: float = Field(0.1, description="raise by 10% per epoch")

    optcore.register_optimizer("PctOpt", torch.optim.SGD, schema=PctConfig)
    try:
        assert "raise by 10% per epoch" in help_text(["--optimizer", "PctOpt"], capsys)
    finally:
        optcore.unregister_optimizer("PctOpt")


# --------------------------------------------------------------- errors
def test_unknown_optimizer_names_the_closest():
    with pytest.raises(optcore.OptimizerNotFoundError, match=r"adamw|AdamW"):
        parse(["--optimizer", "adamww"])


def test_unknown_scheduler():
    with pytest.raises(optcore.SchedulerNotFoundError):
        parse(["--optimizer", "sgd", "--lr-scheduler", "cosinee"])


def test_invalid_values_raise_one_config_error_naming_each_field():
    args = parse(["--optimizer", "adamw", "--lr", "-1", "--betas", "0.9", "1.5"])
    with pytest.raises(optcore.ConfigError) as exc_info:
        optcore.config_from_args(args)
    fields = [field for field, _ in exc_info.value.problems]
    assert "lr" in fields and any(f.startswith("betas") for f in fields)


def test_invalid_scheduler_value_is_a_config_error():
    args = parse(["--optimizer", "sgd", "--lr-scheduler", "cosine", "--warmup-steps", "-5"])
    with pytest.raises(optcore.ConfigError, match="warmup_steps"):
        optcore.config_from_args(args)


def test_missing_required_scheduler_field_is_named():
    args = parse(["--optimizer", "sgd", "--lr-scheduler", "StepLR"])
    with pytest.raises(optcore.ConfigError, match="step_size"):
        optcore.config_from_args(args)


def test_args_parsed_from_another_command_line_are_rejected():
    parser = argparse.ArgumentParser()
    optcore.add_args(parser, ["--optimizer", "adamw"])
    with pytest.raises(optcore.ConfigError, match="same argv"):
        optcore.config_from_args(parser.parse_args(["--optimizer", "sgd"]))


def test_args_without_add_args_are_rejected():
    with pytest.raises(optcore.ConfigError, match="add_args"):
        optcore.config_from_args(argparse.Namespace(optimizer="adamw"))


def test_wrapper_optimizers_are_not_selectable():
    pytest.importorskip("optcore_fp16")
    with pytest.raises(optcore.ConfigError, match="precision"):
        parse(["--optimizer", "FP16Optimizer"])


# -------------------------------------------------------------- clashes
def test_a_flag_the_script_already_has_moves_under_the_kind():
    parser = argparse.ArgumentParser()
    parser.add_argument("--lr", type=float, default=1.0, help="the script's own")
    args = parse(["--optimizer", "adamw", "--lr", "2", "--optimizer-lr", "0.01"], parser)
    assert args.lr == 2.0
    assert optcore.config_from_args(args) == {"type": "adamw", "lr": 0.01}


def test_prefix_puts_every_field_under_it():
    parser = argparse.ArgumentParser()
    parser.add_argument("--lr", type=float, default=1.0)
    argv = ["--optimizer", "adamw", "--opt-lr", "0.01", "--no-opt-amsgrad", "--opt-betas", "0.8", "0.9"]
    args = parse(argv, parser, prefix="opt-")
    assert args.opt_lr == 0.01 and args.lr == 1.0
    assert optcore.config_from_args(args) == {"type": "adamw", "lr": 0.01, "amsgrad": False, "betas": (0.8, 0.9)}


def test_scheduler_field_named_like_an_optimizer_field():
    argv = ["--optimizer", "adamw", "--eps", "1e-6", "--lr-scheduler", "ReduceLROnPlateau", "--lr-scheduler-eps", "0"]
    config = optcore.config_from_args(parse(argv))
    assert config == {
        "optimizer": {"type": "adamw", "eps": 1e-6},
        "lr_scheduler": {"type": "ReduceLROnPlateau", "eps": 0.0},
    }


def test_an_existing_optimizer_flag_is_reported():
    parser = argparse.ArgumentParser()
    parser.add_argument("--optimizer")
    with pytest.raises(ValueError, match="already has --optimizer"):
        optcore.add_args(parser, [])


def test_scheduler_flags_can_be_left_out():
    parser = argparse.ArgumentParser()
    optcore.add_args(parser, ["--optimizer", "sgd"], scheduler=False)
    assert "--lr-scheduler" not in parser.format_help()
    assert optcore.config_from_args(parser.parse_args(["--optimizer", "sgd"])) == {"type": "sgd"}


# ----------------------------------------------------------- round trip
def test_round_trip_into_build_optimizer(model):
    argv = ["--optimizer", "adamw", "--lr", "0.02", "--betas", "0.8", "0.9", "--weight-decay", "0.1", "--amsgrad"]
    optimizer = optcore.build_optimizer(optcore.config_from_args(parse(argv)), model)
    assert isinstance(optimizer, torch.optim.AdamW)
    group = optimizer.param_groups[0]
    assert group["lr"] == 0.02 and group["betas"] == (0.8, 0.9) and group["amsgrad"] is True
    assert {g["weight_decay"] for g in optimizer.param_groups} == {0.0, 0.1}  # no decay on biases and norms


def test_round_trip_into_build_with_a_scheduler(model):
    argv = ["--optimizer", "sgd", "--lr", "0.1", "--momentum", "0.9", "--lr-scheduler", "linear", "--warmup-steps", "2"]
    config = optcore.config_from_args(parse(argv))
    assert config == {
        "optimizer": {"type": "sgd", "lr": 0.1, "momentum": 0.9},
        "lr_scheduler": {"type": "linear", "warmup_steps": 2},
    }
    optimizer, scheduler = optcore.build(config, model, num_training_steps=10)
    lrs = []
    for _ in range(4):
        optimizer.step()
        scheduler.step()
        lrs.append(optimizer.get_lr())
    assert lrs[:2] == pytest.approx([0.05, 0.1])  # two warm-up steps, then linear decay
    assert lrs[3] < lrs[2] < lrs[1]


def test_nested_shape_on_request():
    config = optcore.config_from_args(parse(["--optimizer", "sgd"]), nested=True)
    assert config == {"optimizer": {"type": "sgd"}}


def test_num_training_steps_can_validate_the_run_length():
    args = parse(["--optimizer", "sgd", "--lr-scheduler", "cosine", "--warmup-steps", "5"])
    config = optcore.config_from_args(args, num_training_steps=100, full=True)
    assert config["lr_scheduler"]["num_training_steps"] == 100
    # without it the length is left for build(): never a stand-in value
    assert "num_training_steps" not in optcore.config_from_args(args, full=True)["lr_scheduler"]


def _selectable(specs):
    for spec in specs:
        try:
            if not spec.is_wrapper:
                yield spec
        except optcore.OptcoreError:
            continue


def test_every_installed_optimizer_gets_flags_that_parse():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for spec in _selectable(optcore.list_optimizers()):
            argv = ["--optimizer", spec.qualified]
            parser = argparse.ArgumentParser()
            optcore.add_args(parser, argv, scheduler=False)
            parser.format_help()
            try:
                assert optcore.config_from_args(parser.parse_args(argv)) == {"type": spec.qualified}
            except optcore.ConfigError as exc:
                # a class whose lr has no default (bitsandbytes' SGD8bit): the flags say so, and take it
                assert [field for field, _ in exc.problems] == ["lr"], (spec.qualified, exc)
                assert "--lr" in parser.format_help()
                argv += ["--lr", "0.01"]
                config = optcore.config_from_args(parser.parse_args(argv))
                assert config == {"type": spec.qualified, "lr": 0.01}


def test_every_installed_scheduler_gets_flags():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for spec in optcore.list_schedulers():
            argv = ["--optimizer", "sgd", "--lr-scheduler", spec.qualified]
            parser = argparse.ArgumentParser()
            optcore.add_args(parser, argv)
            assert f"lr scheduler ({spec.name})" in parser.format_help()


def test_add_args_reads_the_list_given_to_parse_args(monkeypatch):
    monkeypatch.setattr(sys, "argv", ["train.py"])  # nothing there: the list handed to parse_args counts
    parser = argparse.ArgumentParser()
    optcore.add_args(parser, scheduler=False)
    args = parser.parse_args(["--optimizer", "sgd", "--momentum", "0.9", "--nesterov"])
    assert optcore.config_from_args(args) == {"type": "sgd", "momentum": 0.9, "nesterov": True}
    again = parser.parse_args(["--optimizer", "sgd", "--momentum", "0.5"])  # a second parse reuses the fields
    assert optcore.config_from_args(again)["momentum"] == 0.5

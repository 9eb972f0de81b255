"""``TrainingArguments(optim="galore_*", optim_target_modules=..., optim_args=...)`` as
an optcore config (:func:`optcore.integrations.hf.galore_config`): the optimizer it
builds steps the Trainer's own GaLore optimizer's numbers, bit for bit."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from torch import nn

import optcore

pytest.importorskip("galore_torch")
pytest.importorskip("transformers", reason="install optcore[hf] to test the Trainer integration")
pytest.importorskip("accelerate", reason="the Trainer needs accelerate (optcore[hf])")

from transformers import Trainer, TrainingArguments  # noqa: E402

from optcore.integrations import hf  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "composite"))  # the composite tests' models
from test_composite import loss_of, tiny  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore")


def args_for(tmp_path, **overrides) -> TrainingArguments:
    return TrainingArguments(str(tmp_path), use_cpu=True, report_to="none", learning_rate=3e-3, weight_decay=0.05,
                             adam_beta1=0.8, adam_epsilon=1e-7, **overrides)  # fmt: skip


def _trainers(args: TrainingArguments, model: nn.Module) -> torch.optim.Optimizer:
    cls, kwargs = Trainer.get_optimizer_cls_and_kwargs(args, model)
    kwargs = dict(kwargs)
    return cls(kwargs.pop("params"), **kwargs)


def _train(model: nn.Module, opt: torch.optim.Optimizer) -> list[torch.Tensor]:
    for i in range(5):
        opt.zero_grad()
        loss_of(model, i).backward()
        opt.step()
    return [p.detach().clone() for p in model.parameters()]


@pytest.mark.parametrize("optim,targets,optim_args", [
    ("galore_adamw", ["blocks"], "rank=2, update_proj_gap=2, scale=0.5, proj_type=reverse_std"),
    ("galore_adamw", "all-linear", None),
    ("galore_adafactor", r"blocks\.\d", "rank=3, update_proj_gap=3"),
])  # fmt: skip
def test_galore_config_trains_what_the_trainer_builds_bit_for_bit(tmp_path, optim, targets, optim_args) -> None:
    args = args_for(tmp_path, optim=optim, optim_target_modules=targets, optim_args=optim_args)
    want = _train(reference := tiny(), _trainers(args, reference))
    model = tiny()
    config = hf.config_from_training_args(args, model)
    assert config == hf.galore_config(args, model)
    opt = optcore.build_optimizer(config, model)
    matrices = {r["name"] for r in opt.routing if r["optimizer"].startswith("GaLore")}
    linear = {"blocks.0.weight", "blocks.2.weight"} | ({"lm_head.weight"} if targets == "all-linear" else set())
    assert matrices == linear
    got = _train(model, opt)
    for (name, _), a, b in zip(model.named_parameters(), got, want, strict=True):
        assert torch.equal(a, b), name


@pytest.mark.parametrize("optim", ["galore_adamw_layerwise", "galore_adafactor_layerwise"])
def test_layerwise_galore_is_refused_naming_step_in_backward(tmp_path, optim) -> None:
    args = args_for(tmp_path, optim=optim, optim_target_modules=["blocks"])
    for call in (lambda: hf.config_from_training_args(args, tiny()), lambda: hf.galore_config(args, tiny())):
        with pytest.raises(optcore.ConfigError, match="step_in_backward") as info:
            call()
        assert "gradient hook inside backward" in str(info.value)


def test_galore_needs_the_model_target_modules_and_its_own_optim_args(tmp_path) -> None:
    with pytest.raises(optcore.ConfigError, match="model"):
        hf.config_from_training_args(args_for(tmp_path, optim="galore_adamw", optim_target_modules=["blocks"]))
    with pytest.raises(optcore.ConfigError, match="optim_target_modules"):
        hf.galore_config(args_for(tmp_path, optim="galore_adamw"), tiny())
    with pytest.raises(optcore.ConfigError, match="no nn.Linear"):
        hf.galore_config(args_for(tmp_path, optim="galore_adamw", optim_target_modules=["norm"]), tiny())
    with pytest.raises(optcore.ConfigError, match="momentum"):
        hf.galore_config(args_for(tmp_path, optim="galore_adamw", optim_target_modules=["blocks"],
                                  optim_args="rank=2, momentum=0.9"), tiny())  # fmt: skip

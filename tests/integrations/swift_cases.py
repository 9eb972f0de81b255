"""The ms-swift cases, with the real ms-swift package.

``test_integrations_swift.py`` runs this file in a child pytest process
(importing swift patches transformers' Trainer for the whole process); the
file name keeps it out of the main session's collection. Run it alone with
``pytest tests/integrations/swift_cases.py``.

swift's full ``Trainer`` needs a model from its model registry and a chat
template; the part that picks the optimizer is ``SwiftMixin``'s
``optimizer_callback = optimizers_map[args.optimizer](args, trainer)`` and its
``create_optimizer`` / ``create_scheduler`` / ``create_optimizer_and_scheduler``,
which the trainer below takes from swift itself, on top of the Hugging Face
Trainer swift builds on. The arguments are swift's ``TrainingArguments``,
parsed from the command line swift users write.
"""

from __future__ import annotations

import importlib.util
import math
import warnings
from pathlib import Path

import pytest
import torch

pytest.importorskip("swift.optimizers", reason="ms-swift is not installed: scripts/dev setup installs it")

from swift.optimizers import optimizers_map  # noqa: E402
from swift.trainers import TrainingArguments  # noqa: E402
from swift.trainers.mixin import SwiftMixin  # noqa: E402
from transformers import GPT2Config, GPT2LMHeadModel, HfArgumentParser  # noqa: E402
from transformers import Trainer as HfTrainer  # noqa: E402

import optcore  # noqa: E402
from optcore._registry import ShadowedNameWarning  # noqa: E402
from optcore.integrations import swift as optcore_swift  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")


@pytest.fixture(scope="module", autouse=True)
def plugin_file() -> None:
    """Import examples/swift_plugin.py as ``--external_plugins`` does."""
    spec = importlib.util.spec_from_file_location("swift_plugin", ROOT / "examples" / "swift_plugin.py")
    assert spec is not None and spec.loader is not None
    spec.loader.exec_module(importlib.util.module_from_spec(spec))


class SwiftOptimizerTrainer(HfTrainer):
    """The HF Trainer with swift's optimizer plumbing, taken from swift."""

    def __init__(self, *args, **kwargs) -> None:
        self.optimizer_callback = optimizers_map[kwargs["args"].optimizer or "default"](kwargs["args"], self)
        super().__init__(*args, **kwargs)

    create_optimizer_and_scheduler = SwiftMixin.create_optimizer_and_scheduler
    create_optimizer = SwiftMixin.create_optimizer
    create_scheduler = SwiftMixin.create_scheduler
    _disable_foreach_for_deepspeed = SwiftMixin._disable_foreach_for_deepspeed


class Tokens(torch.utils.data.Dataset):
    def __init__(self, n: int = 16) -> None:
        g = torch.Generator().manual_seed(0)
        self.ids = (torch.randint(0, 50, (n, 1), generator=g) + torch.arange(12) % 4) % 50

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def swift_args(tmp_path, *cli: str) -> TrainingArguments:
    (args,) = HfArgumentParser(TrainingArguments).parse_args_into_dataclasses(
        [
            "--output_dir", str(tmp_path), "--max_steps", "3", "--per_device_train_batch_size", "4",
            "--use_cpu", "true", "--report_to", "none", "--save_strategy", "no", "--logging_steps", "1",
            "--disable_tqdm", "true", *cli,
        ]
    )  # fmt: skip
    return args


def train(tmp_path, *cli: str) -> HfTrainer:
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=50, n_positions=32))
    trainer = SwiftOptimizerTrainer(model=model, args=swift_args(tmp_path, *cli), train_dataset=Tokens())
    trainer.train()
    return trainer


def test_register_puts_optcore_in_swifts_optimizers_map():
    assert optimizers_map["optcore"] is optcore_swift.callback_class()
    assert issubclass(optimizers_map["optcore"], optimizers_map["default"])
    assert optcore_swift.register() is optimizers_map["optcore"]  # again: unchanged


@pytest.mark.parametrize("name", ["Lion", "optcore-lion:Lion"])
def test_optimizer_optcore_with_optim_args_trains_lion(tmp_path, name):
    # The bare name resolves inside swift as everywhere else in optcore: where lion-pytorch is
    # installed too (the test extras) it comes first and a ShadowedNameWarning names the plugin;
    # the qualified name picks the plugin.
    pytest.importorskip("optcore_lion")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ShadowedNameWarning)
        expected = optcore.resolve(name).qualified
        trainer = train(
            tmp_path, "--optimizer", "optcore", "--optim_args", f"type={name},lr=3e-4,betas=(0.9, 0.99),weight_decay=0.1"
        )
    inner = optcore.unwrap(trainer.optimizer)
    assert inner.optcore_spec.qualified == expected
    if name == "optcore-lion:Lion":
        assert type(inner).__module__.startswith("optcore_lion")
    assert inner.optimizer_config["betas"] == (0.9, 0.99)
    assert {g["weight_decay"] for g in inner.param_groups} == {0.0, 0.1}  # optcore's no-decay group
    assert inner.param_groups[0]["initial_lr"] == pytest.approx(3e-4)  # swift's schedule on the config's lr
    assert trainer.state.global_step == 3
    assert all(math.isfinite(e["loss"]) for e in trainer.state.log_history if "loss" in e)


def test_swifts_learning_rate_does_not_apply_and_says_so(tmp_path):
    with pytest.warns(UserWarning, match=r"learning_rate=0.01 \(applies instead: the config's lr=0.05\)"):
        trainer = train(tmp_path, "--optimizer", "optcore", "--optim_args", "type=SGD,lr=0.05", "--learning_rate", "1e-2")
    assert isinstance(optcore.unwrap(trainer.optimizer), torch.optim.SGD)


def test_relative_step_adafactor_logs_the_applied_lr(tmp_path):
    pytest.importorskip("optcore_adafactor")
    trainer = train(tmp_path, "--optimizer", "optcore", "--optim_args", "type=optcore-adafactor:Adafactor")
    logged = [e["learning_rate"] for e in trainer.state.log_history if "loss" in e]
    assert all(isinstance(lr, float) and lr > 0 for lr in logged)
    assert logged[-1] == pytest.approx(optcore.unwrap(trainer.optimizer).get_lr())


def test_optim_args_without_a_type_says_what_to_write(tmp_path):
    with pytest.raises(optcore.ConfigError, match="type=Lion"):
        train(tmp_path, "--optimizer", "optcore", "--optim_args", "lr=1e-3")

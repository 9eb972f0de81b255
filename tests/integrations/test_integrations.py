"""optcore inside other frameworks, with the real libraries: the Hugging Face
Trainer, PyTorch Lightning, Hydra/OmegaConf. Each test runs the example in
examples/ that documents the integration, so the examples cannot rot.
Nothing is downloaded: models are built from configs, data are generated."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch

import optcore

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def load_example(relative: str) -> ModuleType:
    path = EXAMPLES / relative
    name = "optcore_example_" + path.stem
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def unwrapped(optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """The optimizer inside accelerate's / Lightning's wrapper."""
    return getattr(optimizer, "optimizer", optimizer)


def changed(model: torch.nn.Module, fresh: torch.nn.Module) -> bool:
    before = fresh.state_dict()
    after = model.state_dict()
    return any(not torch.equal(value, before[key]) for key, value in after.items() if value.is_floating_point())


# ---------------------------------------------------------- Hugging Face
@pytest.fixture
def hf_example(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    pytest.importorskip("transformers", reason="install optcore[hf] to test the Trainer integration")
    pytest.importorskip("accelerate", reason="the Trainer needs accelerate (optcore[hf])")
    pytest.importorskip("optcore_lion", reason="the example trains with optcore-lion's Lion")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")
    return load_example("hf_trainer.py")


def test_hf_trainer_takes_optcore_build_as_optimizers(hf_example, tmp_path):
    trainer = hf_example.train_with_optimizers(str(tmp_path), steps=3)
    optimizer = unwrapped(trainer.optimizer)
    assert type(optimizer).__module__.startswith("optcore_lion")
    assert trainer.state.global_step == 3
    assert trainer.lr_scheduler.last_epoch == 3  # optcore's cosine schedule, stepped by the Trainer
    assert {g["weight_decay"] for g in optimizer.param_groups} == {0.0, 0.1}  # optcore's no-decay group
    assert math.isfinite(trainer.state.log_history[-1]["train_loss"])
    assert changed(trainer.model, hf_example.tiny_model())


def test_hf_trainer_builds_optcore_through_optimizer_cls_and_kwargs(hf_example, tmp_path):
    trainer = hf_example.train_with_factory(str(tmp_path), steps=2)
    optimizer = unwrapped(trainer.optimizer)
    assert type(optimizer).__module__.startswith("optcore_lion")
    assert optimizer.optimizer_config["betas"] == (0.9, 0.99)
    assert {g["weight_decay"] for g in optimizer.param_groups} == {0.0, 0.1}
    assert trainer.state.global_step == 2
    assert changed(trainer.model, hf_example.tiny_model())


# ------------------------------------------------------------- Lightning
@pytest.fixture
def lightning_example() -> ModuleType:
    try:
        import lightning.pytorch  # noqa: F401
    except ImportError:
        pytest.importorskip("pytorch_lightning", reason="install optcore[lightning] to test the Lightning integration")
    return load_example("lightning_module.py")


def test_lightning_configure_optimizers_returns_optcore_optimizer_and_schedule(lightning_example, tmp_path):
    pytest.importorskip("optcore_lion")
    config = {
        "optimizer": {"type": "optcore-lion:Lion", "lr": 1e-3, "weight_decay": 0.1},
        "lr_scheduler": {"type": "cosine", "warmup_steps": 2},
    }
    trainer = lightning_example.train(str(tmp_path), max_steps=5, optim=config)
    optimizer = unwrapped(trainer.optimizers[0])
    assert type(optimizer).__module__.startswith("optcore_lion")
    schedule = trainer.lr_scheduler_configs[0]
    assert schedule.interval == "step" and schedule.scheduler.last_epoch == 5
    assert optimizer.get_lr() < 1e-3  # past the warm-up, on the way down
    torch.manual_seed(0)
    assert changed(trainer.lightning_module, lightning_example.Regressor(config))


def test_lightning_without_a_schedule(lightning_example, tmp_path):
    trainer = lightning_example.train(str(tmp_path), max_steps=2, optim={"optimizer": {"type": "SGD", "lr": 0.1}})
    assert isinstance(trainer.optimizers[0], torch.optim.SGD)
    assert trainer.lr_scheduler_configs == []


# ---------------------------------------------------------- Hydra / OmegaConf
@pytest.fixture
def hydra_example() -> ModuleType:
    pytest.importorskip("omegaconf", reason="install optcore[hydra] to test the Hydra/OmegaConf integration")
    return load_example("hydra/train.py")


def optimizer_options(example: ModuleType) -> list[str]:
    return sorted(p.stem for p in (example.CONF / "optimizer").glob("*.yaml"))


def test_hydra_config_group_has_the_documented_options(hydra_example):
    assert optimizer_options(hydra_example) == ["adamw", "lion", "sgd"]


@pytest.mark.parametrize("option", ["adamw", "lion", "sgd"])
def test_every_optimizer_option_composes_and_builds(hydra_example, option, model):
    if option == "lion":
        pytest.importorskip("optcore_lion")
    cfg = hydra_example.compose([f"optimizer={option}"])
    optimizer, scheduler = optcore.build(cfg, model, num_training_steps=cfg.num_training_steps)
    assert optimizer.get_lr() == pytest.approx(0.0)  # cosine starts its warm-up at 0
    assert scheduler is not None
    assert optimizer.param_groups[0]["initial_lr"] == pytest.approx(cfg.optimizer.lr)


def test_overrides_swap_groups_and_set_keys(hydra_example, model):
    cfg = hydra_example.compose(["optimizer=sgd", "optimizer.momentum=0.5", "~lr_scheduler"])
    assert "lr_scheduler" not in cfg
    optimizer, scheduler = optcore.build(cfg, model)
    assert scheduler is None and isinstance(optimizer, torch.optim.SGD)
    assert optimizer.param_groups[0]["momentum"] == 0.5 and optimizer.param_groups[0]["nesterov"] is True


def test_hydra_example_trains(hydra_example):
    cfg = hydra_example.compose(["num_training_steps=30"])
    assert math.isfinite(hydra_example.run(cfg))


def test_compose_matches_hydra(hydra_example):
    hydra = pytest.importorskip("hydra", reason="hydra-core not installed; compose() is the OmegaConf-only path")
    from omegaconf import OmegaConf

    overrides = ["optimizer=lion", "optimizer.lr=1e-4", "lr_scheduler=constant"]
    with hydra.initialize_config_dir(config_dir=str(hydra_example.CONF), version_base="1.3"):
        expected = hydra.compose("config", overrides=overrides)
    assert OmegaConf.to_container(hydra_example.compose(overrides)) == OmegaConf.to_container(expected)


def test_dictconfig_is_accepted_by_build_optimizer_build_and_build_scheduler(model):
    from omegaconf import OmegaConf

    cfg = OmegaConf.create(
        {
            "base_lr": 0.05,
            "optimizer": {
                "type": "SGD",
                "lr": "${base_lr}",
                "momentum": 0.9,
                "param_groups": [{"params": r"\.bias$", "lr_scale": 0.5}],
            },
            "lr_scheduler": {"type": "linear", "warmup_steps": 2},
        }
    )
    optimizer = optcore.build_optimizer(cfg.optimizer, model)  # a node: ${base_lr} resolves against the root
    lrs = sorted({g["lr"] for g in optimizer.param_groups})
    assert lrs == pytest.approx([0.025, 0.05])

    scheduler = optcore.build_scheduler(cfg.lr_scheduler, optimizer, num_training_steps=10)
    assert scheduler.get_last_lr()[0] == 0.0

    optimizer, scheduler = optcore.build(cfg, model, num_training_steps=10)
    assert isinstance(optimizer, torch.optim.SGD) and scheduler is not None

    lion = OmegaConf.create({"type": "lion_pytorch:Lion", "betas": [0.9, 0.95]})  # a ListConfig inside
    assert optcore.build_optimizer(lion, model).param_groups[0]["betas"] == (0.9, 0.95)


def test_bad_values_in_a_dictconfig_are_config_errors(model):
    from omegaconf import OmegaConf

    with pytest.raises(optcore.ConfigError, match="momentum"):
        optcore.build_optimizer(OmegaConf.create({"type": "SGD", "momentum": -1}), model)

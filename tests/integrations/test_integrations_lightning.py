"""optcore.integrations.lightning with a real Lightning Trainer: the
configure_optimizers dict, the schedule's length from
``estimated_stepping_batches``, and unwrap through ``LightningOptimizer``."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import optcore

try:
    import lightning.pytorch as pl
except ImportError:
    pl = pytest.importorskip("pytorch_lightning", reason="install optcore[lightning] to test the Lightning integration")

from test_integrations import load_example  # noqa: E402

from optcore.integrations import lightning as optcore_lightning  # noqa: E402


@pytest.fixture(scope="module")
def example():
    return load_example("lightning_module.py")


def test_schedule_length_is_estimated_stepping_batches(example, tmp_path):
    # 256 samples / 32 = 8 batches, accumulated 2 at a time: 4 optimizer steps in the epoch.
    config = {"optimizer": {"type": "AdamW", "lr": 1e-2}, "lr_scheduler": {"type": "linear"}}
    trainer = example.train(str(tmp_path), max_steps=-1, max_epochs=1, accumulate_grad_batches=2, optim=config)
    assert trainer.estimated_stepping_batches == 4
    (schedule,) = trainer.lr_scheduler_configs
    assert schedule.interval == "step" and schedule.frequency == 1
    assert schedule.scheduler.last_epoch == 4
    assert optcore.unwrap(trainer.optimizers[0]).get_lr() == pytest.approx(0.0)  # linear decay ended on time


def test_unwrap_reaches_the_optimizer_inside_lightning_optimizer(example, tmp_path):
    seen: dict[str, Any] = {}

    class Probe(example.Regressor):
        def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
            wrapper = self.optimizers()
            seen["wrapper"] = wrapper
            inner = optcore.unwrap(wrapper)
            seen["inner"] = inner
            seen["lr"] = inner.get_lr()
            seen["norm"] = float(inner.clip_grad_norm(0.0))

    trainer = example.train(str(tmp_path), max_steps=6, module=Probe)
    assert isinstance(seen["wrapper"], pl.core.optimizer.LightningOptimizer)
    assert seen["wrapper"] is not trainer.optimizers[0]
    assert seen["inner"] is trainer.optimizers[0]
    assert isinstance(seen["inner"], torch.optim.AdamW)
    assert seen["lr"] == pytest.approx(trainer.lr_scheduler_configs[0].scheduler.get_last_lr()[0])
    assert seen["norm"] >= 0.0


def test_without_a_schedule_only_the_optimizer():
    module = torch.nn.Linear(2, 1)
    out = optcore_lightning.configure_optimizers(module, {"type": "SGD", "lr": 0.1})
    assert set(out) == {"optimizer"} and isinstance(out["optimizer"], torch.optim.SGD)


def test_a_schedule_without_a_known_length_says_what_to_set():
    module = torch.nn.Linear(2, 1)
    module.trainer = type("T", (), {"estimated_stepping_batches": float("inf")})()
    with pytest.raises(optcore.ConfigError, match="max_steps"):
        optcore_lightning.configure_optimizers(module, {"optimizer": "SGD", "lr_scheduler": {"type": "cosine"}})
    out = optcore_lightning.configure_optimizers(
        module, {"optimizer": "SGD", "lr_scheduler": {"type": "cosine"}, "num_training_steps": 10}
    )
    assert out["lr_scheduler"]["interval"] == "step"

"""PyTorch Lightning: ``configure_optimizers`` returns optcore's optimizer and schedule.

The optimizer config is a hyper-parameter of the module, so it is saved in
the checkpoint and logged like any other; ``configure_optimizers`` builds
from it with :func:`optcore.integrations.lightning.configure_optimizers`::

    from optcore.integrations import lightning as optcore_lightning

    def configure_optimizers(self):
        return optcore_lightning.configure_optimizers(self, self.hparams.optim)

which returns ``{"optimizer": ..., "lr_scheduler": {"scheduler": ..., "interval": "step"}}``
with the schedule's length from ``trainer.estimated_stepping_batches``.
``"interval": "step"`` because optcore's named schedules (``cosine``,
``linear``, ...) count optimizer steps, as transformers' do; Lightning's
default would step them once per epoch. Lightning calls
``optimizer.step(closure)``, which every optcore optimizer accepts.
``self.optimizers()`` is Lightning's wrapper; ``optcore.unwrap(self.optimizers())``
is the optcore optimizer (``get_lr()``, ``clip_grad_norm()``, ...).

Needs ``pip install "optcore[lightning]"`` (``lightning`` or
``pytorch-lightning``). Run: ``python examples/lightning_module.py``
"""

from __future__ import annotations

import tempfile
from typing import Any

import torch

import optcore
from optcore.integrations import lightning as optcore_lightning

try:  # the unified package ...
    import lightning.pytorch as pl
except ImportError:  # ... or the standalone one
    import pytorch_lightning as pl

CONFIG = {
    "optimizer": {"type": "AdamW", "lr": 2e-2, "weight_decay": 0.01},
    "lr_scheduler": {"type": "cosine", "warmup_steps": 5},
}


class Regressor(pl.LightningModule):
    """A small MLP on a regression task; ``optim`` is an optcore config."""

    def __init__(self, optim: dict[str, Any] = CONFIG) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(8, 32), torch.nn.LayerNorm(32), torch.nn.ReLU(), torch.nn.Linear(32, 1)
        )

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        self.log("loss", loss, prog_bar=True)
        return loss

    def configure_optimizers(self) -> dict[str, Any]:
        return optcore_lightning.configure_optimizers(self, self.hparams.optim)


def data(n: int = 256, seed: int = 0) -> torch.utils.data.DataLoader:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 8, generator=g)
    y = x @ torch.randn(8, 1, generator=g) + 0.1 * torch.randn(n, 1, generator=g)
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=32, shuffle=True, generator=g)


def train(
    root_dir: str,
    max_steps: int = 40,
    optim: dict[str, Any] = CONFIG,
    module: type[Regressor] = Regressor,
    **trainer_kwargs: Any,
) -> pl.Trainer:
    options: dict[str, Any] = {
        "accelerator": "cpu",
        "devices": 1,
        "logger": False,
        "enable_checkpointing": False,
        "enable_model_summary": False,
        "enable_progress_bar": False,
        **trainer_kwargs,
    }
    trainer = pl.Trainer(max_steps=max_steps, default_root_dir=root_dir, **options)
    torch.manual_seed(0)
    trainer.fit(module(optim), data())
    return trainer


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as root:
        trainer = train(root, max_steps=80, enable_progress_bar=True)
        optimizer = optcore.unwrap(trainer.optimizers[0])
        loss = float(trainer.callback_metrics["loss"])
        print(f"{type(optimizer).__name__}: final loss {loss:.4f}, lr at the end {optimizer.get_lr():.2e}")

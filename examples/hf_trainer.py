"""Train with the Hugging Face ``Trainer`` and an optimizer chosen by an optcore config.

The one-liner: :func:`optcore.integrations.hf.optimizers` returns
``(optimizer, scheduler)`` from one optcore config, which is exactly what
``Trainer(optimizers=...)`` takes (the schedule's length is ``args.max_steps``)::

    from optcore.integrations import hf
    trainer = Trainer(model, args, train_dataset=data, optimizers=hf.optimizers(config, model, args),
                      callbacks=[hf.ContractCallback()])

``hf.ContractCallback()`` keeps the optcore contract on ``trainer.optimizer``
(the Trainer wraps it in accelerate's ``AcceleratedOptimizer``, which would
hide it): ``trainer.optimizer.get_lr()``, ``.clip_grad_norm(1.0)``,
``.step(scale=...)``, ``.load_state_dict(sd, optimizer_overrides=...)``.

optcore puts biases and norm weights in a ``weight_decay=0`` group itself
(as the Trainer would), validates every hyper-parameter, and the optimizer is
a ``torch.optim.Optimizer``, so the Trainer's gradient clipping, accelerate
wrapping and checkpointing work unchanged.

To let the Trainer build the optimizer itself (after it has moved or wrapped
the model) and keep its own ``lr_scheduler_type`` / ``warmup_steps``, give
``optimizer_cls_and_kwargs`` optcore's factory and the optimizer config::

    trainer = Trainer(model, args, train_dataset=data,
                      optimizer_cls_and_kwargs=hf.optimizer_cls_and_kwargs({"type": "optcore-lion:Lion", "lr": 3e-4}),
                      callbacks=[hf.ContractCallback()])

The optcore config wins over ``TrainingArguments.learning_rate`` /
``weight_decay`` / ``adam_*`` (``hf.optimizers`` warns when they were set).
Adafactor in relative-step mode (no ``lr``) logs the step size it applies as
``learning_rate`` (:func:`train_adafactor_relative_step`).

Needs ``pip install "optcore[hf]"`` (transformers and accelerate) and, for
Lion, ``pip install optcore-lion``. Nothing is downloaded: the model is built
from a config and the data are random tokens.

Run: ``python examples/hf_trainer.py``
"""

from __future__ import annotations

import tempfile
from typing import Any

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

import optcore
from optcore.integrations import hf

CONFIG = {
    "optimizer": {"type": "optcore-lion:Lion", "lr": 1e-3, "betas": [0.9, 0.99], "weight_decay": 0.1},
    "lr_scheduler": {"type": "cosine", "warmup_steps": 2},
}


def tiny_model(seed: int = 0) -> GPT2LMHeadModel:
    """A one-layer GPT-2 built from a config (no weights to download)."""
    torch.manual_seed(seed)
    return GPT2LMHeadModel(
        GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=50, n_positions=32, bos_token_id=0, eos_token_id=0)
    )


class RepeatingTokens(torch.utils.data.Dataset):
    """Short sequences of a repeating pattern: a language model learns them in a few steps."""

    def __init__(self, n: int = 64, length: int = 16, vocab: int = 50, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        starts = torch.randint(0, vocab, (n, 1), generator=g)
        self.ids = (starts + torch.arange(length) % 4) % vocab

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def training_args(output_dir: str, steps: int, **overrides: Any) -> TrainingArguments:
    return TrainingArguments(
        output_dir=output_dir,
        max_steps=steps,
        per_device_train_batch_size=8,
        use_cpu=True,
        report_to="none",
        save_strategy="no",
        logging_steps=1,
        disable_tqdm=True,
        dataloader_num_workers=0,
        **overrides,
    )


def train_with_optimizers(output_dir: str, steps: int = 6, config: dict[str, Any] = CONFIG) -> Trainer:
    """The one-liner: the optcore optimizer and schedule go in through ``optimizers=``."""
    model, args = tiny_model(), training_args(output_dir, steps)
    trainer = Trainer(
        model,
        args,
        train_dataset=RepeatingTokens(),
        optimizers=hf.optimizers(config, model, args),
        callbacks=[hf.ContractCallback()],  # trainer.optimizer keeps get_lr(), clip_grad_norm(), step(scale=), ...
    )
    trainer.train()
    return trainer


def train_with_factory(output_dir: str, steps: int = 6, optimizer: dict[str, Any] = CONFIG["optimizer"]) -> Trainer:
    """The Trainer builds the optcore optimizer itself and its own schedule (``lr_scheduler_type``)."""
    trainer = Trainer(
        tiny_model(),
        training_args(output_dir, steps),
        train_dataset=RepeatingTokens(),
        optimizer_cls_and_kwargs=hf.optimizer_cls_and_kwargs(optimizer),
        callbacks=[hf.ContractCallback()],
    )
    trainer.train()
    return trainer


def train_adafactor_relative_step(output_dir: str, steps: int = 6) -> Trainer:
    """Adafactor computing its own step size: the Trainer logs the lr it applies, not ``None``."""
    model, args = tiny_model(), training_args(output_dir, steps)
    config = {"type": "optcore-adafactor:Adafactor"}  # lr unset: relative_step=True
    trainer = Trainer(model, args, train_dataset=RepeatingTokens(), optimizers=hf.optimizers(config, model, args),
                      callbacks=[hf.ContractCallback()])
    trainer.train()
    return trainer


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as out:
        for train in (train_with_optimizers, train_with_factory, train_adafactor_relative_step):
            trainer = train(out, steps=20)
            losses = [round(e["loss"], 3) for e in trainer.state.log_history if "loss" in e]
            lrs = [e["learning_rate"] for e in trainer.state.log_history if "learning_rate" in e]
            print(
                f"{train.__name__}: {type(optcore.unwrap(trainer.optimizer)).__name__}, "
                f"losses {losses[0]} -> {losses[-1]}, lr {lrs[0]:.2e} -> {lrs[-1]:.2e}"
            )

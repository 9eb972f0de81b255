"""Muon + AdamW from one config in the training stacks: a small transformer (a
one-layer GPT-2 built from a config, nothing downloaded) in the Hugging Face
Trainer and in Lightning, its routing read from the plan, its resume from the
stack's own checkpoint equal to an uninterrupted run, and ``optcore memory``'s
prediction equal to the state the run holds."""

from __future__ import annotations

import sys
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import optcore
from optcore.compare.memory import predict
from optcore.compare.probes import optimizer_state_bytes

transformers = pytest.importorskip("transformers", reason="install optcore[hf] to train the small transformer")
pytest.importorskip("accelerate", reason="the Trainer needs accelerate (optcore[hf])")

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integrations"))
from test_integrations import load_example  # noqa: E402  (tests/integrations/, put on sys.path above)

if not hasattr(torch.optim, "Muon"):
    pytest.skip("this torch has no torch.optim.Muon", allow_module_level=True)

pytestmark = pytest.mark.filterwarnings("ignore")

MUON = {"type": "Muon", "lr": 0.02, "fallback": {"type": "AdamW", "lr": 3e-3}}


@pytest.fixture(autouse=True)
def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")


@pytest.fixture(scope="module")
def example():
    return load_example("hf_trainer.py")


def _routes(optimizer: Any, model: nn.Module) -> dict[str, str]:
    names = {id(p): n for n, p in model.named_parameters()}
    return {names[id(p)]: g["optimizer"] for g in optimizer.param_groups for p in g["params"]}


def _check_routing_and_memory(optimizer: Any, model: nn.Module, factory: Any) -> None:
    """Muon has exactly the 2-D hidden matrices (the plan's routing table says the same),
    and the prediction equals the state the trained optimizer holds, by optimizer too."""
    routes = _routes(optimizer, model)
    params = dict(model.named_parameters())
    muon = {n for n, label in routes.items() if label == "Muon"}
    assert muon and all(params[n].ndim == 2 and "wte" not in n and "wpe" not in n for n in muon)
    assert {n for n in params if params[n].ndim == 2 and "wte" not in n and "wpe" not in n} == muon
    table = {row["name"]: row["optimizer"] for row in optcore.plan(MUON, model).routing}
    assert table == routes
    row = predict(MUON, factory)
    trained = [p for p in model.parameters() if p.requires_grad]
    assert row["state_bytes"] == optimizer_state_bytes(optimizer, trained)["state_bytes"]
    assert row["state_by_optimizer"]["Muon"] == sum(4 * params[n].numel() for n in muon)  # one buffer per matrix


def test_hf_trainer_trains_resumes_and_matches_the_memory_prediction(example: Any, tmp_path: Path) -> None:
    from transformers import Trainer, TrainingArguments

    from optcore.integrations import hf

    def trainer_for(out: Path) -> Trainer:
        model = example.tiny_model()
        args = TrainingArguments(str(out), max_steps=4, per_device_train_batch_size=8, use_cpu=True, report_to="none",
                                 save_strategy="steps", save_steps=2, logging_steps=1, disable_tqdm=True,
                                 dataloader_num_workers=0)  # fmt: skip
        return Trainer(model, args, train_dataset=example.RepeatingTokens(), optimizers=hf.optimizers(MUON, model, args))

    straight = trainer_for(tmp_path / "straight")
    straight.train()
    optimizer = optcore.unwrap(straight.optimizer)
    assert type(optimizer).__name__ == "CompositeOptimizer" and set(optimizer.parts) == {"Muon", "AdamW"}
    losses = [e["loss"] for e in straight.state.log_history if "loss" in e]
    assert len(losses) == 4 and losses[-1] < losses[0]
    _check_routing_and_memory(optimizer, straight.model, example.tiny_model)

    resumed = trainer_for(tmp_path / "resumed")
    resumed.train(resume_from_checkpoint=str(tmp_path / "straight" / "checkpoint-2"))
    for (name, a), b in zip(straight.model.named_parameters(), resumed.model.parameters()):
        assert torch.equal(a, b), name


def test_lightning_trains_resumes_and_matches_the_memory_prediction(example: Any, tmp_path: Path) -> None:
    try:
        import lightning.pytorch as pl
    except ImportError:
        pl = pytest.importorskip("pytorch_lightning", reason="install optcore[lightning]")
    from optcore.integrations import lightning as optcore_lightning

    class LM(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.model = example.tiny_model()
            for m in self.model.modules():  # Lightning does not restore the RNG on resume: no dropout
                if isinstance(m, nn.Dropout):
                    m.p = 0.0

        def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
            return self.model(**batch).loss

        def configure_optimizers(self) -> dict[str, Any]:
            return optcore_lightning.configure_optimizers(self, MUON)

    def fit(steps: int, ckpt: str | None = None) -> tuple[Any, LM]:
        trainer = pl.Trainer(max_steps=steps, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                             enable_model_summary=False, enable_progress_bar=False, default_root_dir=str(tmp_path))  # fmt: skip
        module = LM()
        # one batch an epoch: a run resumed from step 2 restarts its data loader, and sees the same batches
        data = torch.utils.data.DataLoader(example.RepeatingTokens(n=8), batch_size=8)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trainer.fit(module, data, ckpt_path=ckpt)
        return trainer, module

    straight, module = fit(4)
    optimizer = optcore.unwrap(straight.optimizers[0])
    assert type(optimizer).__name__ == "CompositeOptimizer"
    _check_routing_and_memory(optimizer, module.model, example.tiny_model)

    half, _ = fit(2)
    half.save_checkpoint(str(tmp_path / "half.ckpt"))
    _, resumed = fit(4, ckpt=str(tmp_path / "half.ckpt"))
    for (name, a), b in zip(module.model.named_parameters(), resumed.model.parameters()):
        assert torch.equal(a, b), name

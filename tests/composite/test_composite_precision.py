"""A composite in every precision: Muon+AdamW under the fp16 wrappers.

``{"type": "Muon", "fallback": {"type": "AdamW"}, "precision": "bf16"}`` wraps the
composite in FP16Optimizer, which re-points every group to fp32 master copies after
the build; the composite's first-step routing check once took that for a changed
routing and refused. Each precision is compared with the loop it stands for: fp32
masters stepped by a plain fp32 composite, copied back to the half-precision model.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

import optcore
from optcore import ConfigError

pytestmark = pytest.mark.skipif(not hasattr(torch.optim, "Muon"), reason="torch has no Muon")
pytest.importorskip("optcore_fp16", reason="optcore-fp16 is not installed (pip install ./plugins/optcore-fp16)")

MUON_ADAMW = {"type": "Muon", "lr": 0.02, "fallback": {"type": "AdamW", "lr": 3e-3}}
STEPS = 4
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(16, 8)
        self.up, self.down = nn.Linear(8, 16), nn.Linear(16, 8)
        self.norm = nn.LayerNorm(8)
        self.lm_head = nn.Linear(8, 16, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x)
        return self.lm_head(self.norm(h + self.down(torch.relu(self.up(h)))))


def _model(dtype: torch.dtype) -> Block:
    torch.manual_seed(0)
    return Block().to(dtype)


def _loss(model: nn.Module, i: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(i)
    x, y = torch.randint(0, 16, (4, 6), generator=g), torch.randint(0, 16, (4, 6), generator=g)
    return nn.functional.cross_entropy(model(x).float().flatten(0, 1), y.flatten())


def _by_hand(dtype: torch.dtype) -> list[torch.Tensor]:
    """fp32 masters stepped by a plain composite; the model holds their rounding."""
    model = _model(dtype)
    masters = {n: p.detach().float().clone().requires_grad_() for n, p in model.named_parameters()}
    opt = optcore.build_optimizer(MUON_ADAMW, masters)
    for i in range(STEPS):
        model.zero_grad()
        _loss(model, i).backward()
        for n, p in model.named_parameters():
            masters[n].grad = p.grad.float()
        opt.step()
        with torch.no_grad():
            for n, p in model.named_parameters():
                p.copy_(masters[n])
    return [p.detach() for p in model.parameters()]


@pytest.mark.parametrize("precision", list(DTYPES))
def test_the_composite_trains_in_every_precision_as_fp32_masters_do(precision):
    dtype = DTYPES[precision]
    model = _model(dtype)
    config = {**MUON_ADAMW, "precision": precision}
    if precision == "fp16":  # a fixed scale: the reference loop scales nothing
        config["loss_scaler"] = {"init_scale": 1.0, "scale_window": 1000}
    opt = optcore.build_optimizer(config, model)
    for i in range(STEPS):
        opt.zero_grad()
        opt.backward(_loss(model, i))
        opt.step()
    routing = {row["name"]: row["optimizer"] for row in optcore.plan(MUON_ADAMW, model).routing}
    assert routing["up.weight"] == routing["down.weight"] == "Muon" and routing["embed.weight"] == "AdamW"
    for (name, got), want in zip(model.named_parameters(), _by_hand(dtype)):
        torch.testing.assert_close(got.detach(), want, rtol=0, atol=0, msg=lambda m, name=name: f"{name}: {m}")
        assert got.dtype == dtype


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_memory_efficient_precision_refuses_muon_by_name(precision):
    with pytest.raises(ConfigError, match="Muon does not support memory-efficient"):
        optcore.build_optimizer({**MUON_ADAMW, "precision": precision, "memory_efficient": True}, _model(DTYPES[precision]))

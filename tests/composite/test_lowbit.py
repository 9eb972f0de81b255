"""Low-bit optimizer states from torchao, by name, through the contract and the composite form;
``optcore memory`` counts their real bytes (the quantised codes and scales, not the logical fp32 size)."""

from __future__ import annotations

import io
import warnings
from typing import Any

import pytest
import torch
from torch import nn

import optcore

pytest.importorskip("torchao.optim")
pytestmark = pytest.mark.filterwarnings("ignore")


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 64))  # matrices above torchao's 4096-element floor


def _train(model: nn.Module, opt: Any, steps: range) -> None:
    for i in steps:
        g = torch.Generator().manual_seed(i)
        opt.zero_grad()
        model(torch.randn(4, 64, generator=g)).square().mean().backward()
        opt.step()


@pytest.mark.parametrize("name", ["torchao.optim.AdamW8bit", "torchao.optim.AdamW4bit"])
def test_low_bit_states_resume_exactly_through_torch_save(name: str) -> None:
    config = {"type": name, "lr": 1e-3}
    straight = _model()
    _train(straight, optcore.build_optimizer(config, straight), range(4))
    first = _model()
    opt = optcore.build_optimizer(config, first)
    _train(first, opt, range(2))
    buffer = io.BytesIO()
    torch.save({"model": first.state_dict(), "opt": opt.state_dict()}, buffer)
    buffer.seek(0)
    saved = torch.load(buffer, weights_only=False)
    resumed = _model()
    resumed.load_state_dict(saved["model"])
    opt2 = optcore.build_optimizer(config, resumed)
    opt2.load_state_dict(saved["opt"])
    _train(resumed, opt2, range(2, 4))
    for a, b in zip(straight.parameters(), resumed.parameters()):
        assert torch.equal(a, b)


def test_low_bit_state_routed_to_the_matrices() -> None:
    config = {"type": "AdamW", "lr": 1e-3,
              "param_groups": [{"params": r"weight$", "optimizer": {"type": "torchao.optim.AdamW8bit", "lr": 1e-3}}]}
    model = _model()
    opt = optcore.build_optimizer(config, model)
    _train(model, opt, range(2))
    kinds = {type(opt.state[p]["exp_avg"]).__name__ for p in (model[0].weight, model[2].weight)}
    assert kinds == {"OptimState8bit"}
    assert type(opt.state[model[0].bias]["exp_avg"]) is torch.Tensor


def test_memory_counts_the_quantised_bytes() -> None:
    from optcore.compare.memory import predict
    from optcore.compare.probes import optimizer_state_bytes

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        predicted = predict({"type": "torchao.optim.AdamW8bit"}, _model)["state_bytes"]
        fp32 = predict({"type": "AdamW"}, _model)["state_bytes"]
    model = _model()
    opt = optcore.build_optimizer({"type": "torchao.optim.AdamW8bit"}, model)
    _train(model, opt, range(1))
    assert predicted == optimizer_state_bytes(opt, list(model.parameters()))["state_bytes"]
    matrices = 2 * 64 * 256
    codes = 2 * matrices  # two states, one byte each
    assert codes < predicted < codes + 0.2 * codes + 2 * 4 * 2 * (256 + 64) + 8192  # + scales, the biases' fp32 states, qmaps
    assert predicted < fp32 / 3

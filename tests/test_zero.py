"""optcore.distributed.zero_redundancy: ZeRO-1 that steps what build_optimizer builds."""

from __future__ import annotations

import pytest
import torch

import optcore
from optcore.distributed import zero_redundancy

from _dist_util import run_ranks

pytestmark = pytest.mark.distributed

CONFIG = {"type": "AdamW", "lr": 1e-2, "weight_decay": 0.1, "param_groups": [{"params": r"^2\.", "lr_scale": 0.5}]}


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.LayerNorm(8), torch.nn.Linear(8, 3))


def _batches(steps: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(16, 6, generator=g), torch.randn(16, 3, generator=g)) for _ in range(steps)]


def _train(opt, model, steps: int) -> list[torch.Tensor]:
    for x, y in _batches(steps):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    return [p.detach().clone() for p in model.parameters()]


def _sharded(rank: int, world: int, config: dict) -> dict:
    model = _model()
    zero = zero_redundancy(config, model)
    local = optcore.unwrap(zero)
    info = {
        "groups": [{k: v for k, v in g.items() if k != "params"} for g in zero.param_groups],
        "local_class": type(local).__name__,
        "fused": [g.get("fused") for g in local.param_groups],
    }
    info["params"] = _train(zero, model, 5)
    return info


def test_zero_redundancy_equals_the_unsharded_build():
    model = _model()
    reference = optcore.build_optimizer(dict(CONFIG), model)
    expected_groups = [{k: v for k, v in g.items() if k != "params"} for g in reference.param_groups]
    expected = _train(reference, model, 5)
    results = run_ranks(_sharded, 2, dict(CONFIG))
    for info in results:
        assert [g["weight_decay"] for g in info["groups"]] == [g["weight_decay"] for g in expected_groups]
        assert [g["lr"] for g in info["groups"]] == pytest.approx([g["lr"] for g in expected_groups])
        assert info["local_class"] == "AdamW" and all(info["fused"])  # the plan's fused choice, on each shard
        for got, want in zip(info["params"], expected):
            torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-7)


def test_zero_redundancy_refuses_wrappers_before_any_collective():
    if not any(s.name == "FP16Optimizer" for s in optcore.list_optimizers()):
        pytest.skip("optcore-fp16 is not installed")
    with pytest.raises(optcore.ConfigError, match="shards plain optimizers"):
        zero_redundancy({"type": "SGD", "precision": "bf16"}, _model().bfloat16())


def test_unwrap_finds_the_optimizer_or_says_what_it_found():
    opt = optcore.build_optimizer("SGD", _model())
    assert optcore.unwrap(opt) is opt

    class Wrapper:  # the shape of accelerate's and Lightning's wrappers
        def __init__(self, inner):
            self._optimizer = inner

        @property
        def param_groups(self):
            return self._optimizer.param_groups

    assert optcore.unwrap(Wrapper(Wrapper(opt))) is opt
    plain = torch.optim.SGD(_model().parameters(), lr=0.1)
    with pytest.raises(optcore.ConfigError, match="No optcore optimizer inside Wrapper -> SGD"):
        optcore.unwrap(Wrapper(plain))

"""Composite optimizers on real gloo ranks: DDP equals one process (FSDP2: tests/distributed/test_muon_fsdp2.py)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import optcore
from _dist_util import run_ranks
from test_composite import MUON_ADAMW, batch, tiny
from torch import nn

pytestmark = pytest.mark.skipif(not hasattr(torch.optim, "Muon"), reason="torch has no Muon")
STEPS = 3


def _loss(model: nn.Module, i: int, rows: slice) -> torch.Tensor:
    x, y = batch(i)
    return nn.functional.cross_entropy(model(x[rows]).flatten(0, 1), y[rows].flatten())


def _worker(rank: int, world: int) -> dict[str, Any]:
    from torch.nn.parallel import DistributedDataParallel as DDP

    out: dict[str, Any] = {}
    model = tiny()
    ddp = DDP(model)
    opt = optcore.build_optimizer(MUON_ADAMW, model)
    half = slice(2 * rank, 2 * rank + 2)
    for i in range(STEPS):
        opt.zero_grad()
        _loss(ddp, i, half).backward()
        opt.step()
    out["ddp"] = [p.detach().clone() for p in model.parameters()]

    try:
        optcore.build_optimizer({**MUON_ADAMW, "step_in_backward": True}, tiny())
    except optcore.ConfigError as exc:
        out["in_backward"] = str(exc)
    return out


@pytest.fixture(scope="module")
def results() -> list[dict[str, Any]]:
    return run_ranks(_worker, 2)


def test_ddp_on_two_ranks_equals_one_process(results: list[dict[str, Any]]) -> None:
    model = tiny()
    opt = optcore.build_optimizer(MUON_ADAMW, model)
    for i in range(STEPS):
        opt.zero_grad()
        _loss(model, i, slice(0, 4)).backward()
        opt.step()
    for rank, got in enumerate(results):
        for (name, want), p in zip(model.named_parameters(), got["ddp"]):
            # Muon orthogonalises in bf16: the ranks' averaged gradient may round one bf16 ulp apart
            assert torch.allclose(p, want, atol=1e-3, rtol=1e-3), f"rank {rank} {name}: {(p - want).abs().max():.3g}"
    assert torch.equal(results[0]["ddp"][0], results[1]["ddp"][0])


def test_step_in_backward_is_refused_on_several_ranks(results: list[dict[str, Any]]) -> None:
    for got in results:
        assert "data-parallel training" in got["in_backward"]


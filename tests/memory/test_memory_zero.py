"""``optcore memory --sharding zero1|zero2|zero3`` against DeepSpeed on its CPU
accelerator (three gloo ranks): the optimizer state each rank's optimizer makes on
its flat slices, and at stage 2 the slices (the gradient partition), are what was
predicted for rank 0."""

from __future__ import annotations

import os

import pytest
import torch
from torch import nn

from _dist_util import run_ranks
from optcore.compare.memory import predict_all
from optcore.compare.probes import _count, _tensors

pytestmark = pytest.mark.distributed

os.environ.setdefault("DS_ACCELERATOR", "cpu")
pytest.importorskip("deepspeed", reason="DeepSpeed is not installed (pip install 'optcore[deepspeed]')")

WORLD = 3
CONFIGS = [{"type": "AdamW", "lr": 1e-2, "weight_decay": 0.1}, {"type": "SGD", "lr": 1e-2, "momentum": 0.9}]
STAGES = (1, 2, 3)


def model() -> nn.Module:
    """Group sizes (weights 6*7 + 7*3 = 63, biases and norm 7+7+7+3 = 24) that three ranks do not divide."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 7), nn.LayerNorm(7), nn.Linear(7, 3))


def _worker(rank: int, world: int) -> dict:
    import deepspeed.ops

    from optcore.integrations import deepspeed as ds

    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False  # inference's kernel: not needed, slow to build
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(world))
    out = {}
    for i, config in enumerate(CONFIGS):
        for stage in STAGES:
            net = model()
            ds_config = {"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": stage},
                         "optimizer": {"type": "optcore", "params": config}}  # fmt: skip
            engine, _, _, _ = ds.initialize(net, ds_config)
            for step in range(2):
                g = torch.Generator().manual_seed(step * world + rank)
                engine.backward(engine(torch.randn(2, 6, generator=g)).square().mean())
                engine.step()
            basic = engine.basic_optimizer
            stepped = [p for g in basic.param_groups for p in g["params"]]
            out[i, stage] = {
                "slices": [p.numel() for p in stepped],
                "state_bytes": _count(_tensors(dict(basic.state)), {int(p.untyped_storage()._cdata) for p in stepped}),
            }
            engine.destroy()
    return out


def test_each_rank_steps_the_predicted_slice() -> None:
    ranks = run_ranks(_worker, WORLD, timeout=600)
    for i, config in enumerate(CONFIGS):
        for stage in STAGES:
            (row,) = predict_all([{"name": "x", "optimizer": config}], model, world_size=WORLD, sharding=f"zero{stage}")
            assert row["per_rank"] is not None, row.get("per_rank_note")
            real = ranks[0][i, stage]
            assert real["state_bytes"] == row["per_rank"]["state_bytes"], (config, stage, real)
            if stage == 2:  # at stage 3 DeepSpeed's groups hold its own partition objects, not the slices
                assert 4 * sum(real["slices"]) == row["per_rank"]["grad_bytes"], (config, stage, real)

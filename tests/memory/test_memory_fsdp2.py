"""``optcore memory --sharding fsdp2`` against a real FSDP2 run on three gloo ranks:
the parameters, gradients and optimizer state each rank holds, counted from the
storages of the DTensors' local shards, are at most rank 0's, and rank 0's are
the prediction."""

from __future__ import annotations


import pytest
import torch
from torch import nn

import optcore
from _dist_util import run_ranks
from optcore.compare.memory import predict_all
from optcore.compare.probes import _count, _tensors

pytestmark = pytest.mark.distributed
WORLD = 3
CONFIGS = [{"type": "torch:AdamW", "lr": 1e-2}, {"type": "torch:SGD", "lr": 1e-2, "momentum": 0.9}]


def model() -> nn.Module:
    """First dims three ranks do not divide (7 rows), and fewer rows than ranks (2)."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(5, 7), nn.ReLU(), nn.Linear(7, 2, bias=False))


def _local(t: torch.Tensor) -> torch.Tensor:
    return getattr(t, "_local_tensor", t)


def _worker(rank: int, world: int) -> list[dict[str, int]]:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    out = []
    for config in CONFIGS:
        net = model()
        fully_shard(net, mesh=init_device_mesh("cpu", (world,)))
        opt = optcore.build_optimizer(config, net)
        for i in range(2):
            g = torch.Generator().manual_seed(i)
            opt.zero_grad()
            net(torch.randn(4, 5, generator=g)).square().mean().backward()
            opt.step()
        params = list(net.parameters())
        seen: set[int] = set()
        param_bytes = _count((_local(p) for p in params), seen)
        grad_bytes = _count((_local(p.grad) for p in params), seen)
        out.append({"param_bytes": param_bytes, "grad_bytes": grad_bytes,
                    "state_bytes": _count(_tensors(dict(opt.state)), seen)})  # fmt: skip
    return out


def test_rank0_holds_what_was_predicted() -> None:
    ranks = run_ranks(_worker, WORLD)
    for i, config in enumerate(CONFIGS):
        (row,) = predict_all([{"name": "x", "optimizer": config}], model, world_size=WORLD, sharding="fsdp2")
        predicted = {k: row["per_rank"][k] for k in ("param_bytes", "grad_bytes", "state_bytes")}
        assert ranks[0][i] == predicted, config
        for other in ranks[1:]:
            assert all(other[i][k] <= predicted[k] for k in predicted), (config, other[i])

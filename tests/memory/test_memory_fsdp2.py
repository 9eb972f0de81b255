"""``optcore memory --sharding fsdp2`` against a real FSDP2 run on three gloo ranks:
the parameters, gradients and optimizer state each rank holds, counted from the
storages of the DTensors' local shards, are at most rank 0's, and rank 0's are
the prediction. Adafactor (factored matrices, a vector, a matrix with fewer rows
than ranks) and AdaScaleSGD reduce their statistics over the mesh: their state
and their step's peak (Adafactor's float64 reduction buffers) are rank 0's as
predicted."""

from __future__ import annotations

import contextlib

import pytest
import torch
from torch import nn

import optcore
from _dist_util import run_ranks
from optcore.compare.memory import predict_all
from optcore.compare.probes import _count, optimizer_state_bytes
from optcore.compare.transient import LiveStorages

pytestmark = pytest.mark.distributed
WORLD = 3
CONFIGS = [{"type": "torch:AdamW", "lr": 1e-2}, {"type": "torch:SGD", "lr": 1e-2, "momentum": 0.9},
           {"type": "optcore-adafactor:Adafactor", "lr": 1e-2, "relative_step": False, "beta1": 0.9},
           {"type": "optcore-adafactor:Adafactor"}, {"type": "optcore-adascale:AdaScaleSGD", "lr": 0.05, "momentum": 0.9}]
#: the optimizers whose step's peak is compared too (their own DTensor path, no DTensor op in the step)
PEAK = {"optcore-adafactor:Adafactor", "optcore-adascale:AdaScaleSGD"}


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
        watch = LiveStorages()
        for i in range(2):
            g = torch.Generator().manual_seed(i)
            opt.zero_grad()
            net(torch.randn(4, 5, generator=g)).square().mean().backward()
            with watch if i else contextlib.nullcontext():
                opt.step()
        params = list(net.parameters())
        seen: set[int] = set()
        param_bytes = _count((_local(p) for p in params), seen)
        grad_bytes = _count((_local(p.grad) for p in params), seen)
        out.append({"param_bytes": param_bytes, "grad_bytes": grad_bytes,
                    "state_bytes": optimizer_state_bytes(opt, params)["state_bytes"], "transient_bytes": watch.peak})
        getattr(opt, "unhook", lambda: None)()
    return out


def test_rank0_holds_what_was_predicted() -> None:
    ranks = run_ranks(_worker, WORLD)
    for i, config in enumerate(CONFIGS):
        (row,) = predict_all([{"name": "x", "optimizer": config}], model, world_size=WORLD, sharding="fsdp2")
        keys = ["param_bytes", "grad_bytes", "state_bytes"] + (["transient_bytes"] if config["type"] in PEAK else [])
        predicted = {k: row["per_rank"][k] for k in keys}
        assert {k: ranks[0][i][k] for k in keys} == predicted, config
        for other in ranks[1:]:
            assert all(other[i][k] <= predicted[k] for k in predicted), (config, other[i])

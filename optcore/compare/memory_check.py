"""``optcore memory --check``: one real step on the model beside the prediction.

The model is built for real on the CPU and each config's optimizer stepped
twice with real gradients; parameters, gradients and optimizer state are
counted from tensor storages after the first step, the transient peak during
the second (:class:`~optcore.compare.transient.LiveStorages`), and, with
``--sharding``, the same for the tensors one rank's optimizer steps. Storages,
not the process's resident memory, so the figures do not depend on what else
the machine runs.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

import optcore

from ..composite import StepInBackward
from .precision import param_dtype
from .probes import _storage_id, optimizer_state_bytes
from .transient import LiveStorages

#: the figures compared, as (row key, label)
COMPARED = (("param_bytes", "params"), ("grad_bytes", "grads"), ("state_bytes", "state"),
            ("transient_bytes", "transient"))  # fmt: skip


def measure(cfg: Any, factory: Callable[[], nn.Module], accumulations: int = 1, sharding: str | None = None,
            world_size: int = 1, whole: bool = True) -> dict[str, Any]:  # fmt: skip
    """The figures of one real run of ``cfg`` on ``factory()`` (and of one rank's
    shards); ``whole=False``: of one rank's alone (AdaScaleSGD steps on several
    ranks, not in one process)."""
    from .memory_shard import per_rank

    torch.manual_seed(0)
    measured: dict[str, Any] = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if whole:
            measured.update(_whole(cfg, factory, accumulations))
        if sharding is not None:
            rank: dict[str, Any] = {}
            per_rank(rank, cfg, _real(factory, cfg), sharding, world_size, accumulations)
            measured["per_rank"] = rank["per_rank"]
    return measured


def _whole(cfg: Any, factory: Callable[[], nn.Module], accumulations: int) -> dict[str, Any]:
    """The figures of one process stepping ``cfg`` on ``factory()``."""
    from .memory import step_on

    model = _real(factory, cfg)
    optimizer = optcore.build_optimizer(cfg, model)
    params = [p for p in model.parameters() if p.requires_grad]
    step_on(model, optimizer, accumulations)
    measured: dict[str, Any] = {
        "param_bytes": _bytes(model.parameters()),
        "grad_bytes": None if isinstance(optimizer, StepInBackward) else _bytes(p.grad for p in params),
        "state_bytes": optimizer_state_bytes(optimizer, params)["state_bytes"],
    }
    watch = LiveStorages()
    step_on(model, optimizer, accumulations, watch=watch)
    measured["transient_bytes"] = watch.peak
    return measured


def differences(row: dict[str, Any], measured: dict[str, Any]) -> list[str]:
    """The figures where prediction and measurement differ, as ``"state: 1.2 KiB predicted, 1.3 KiB measured"``."""
    out = []
    pairs = [(row, measured, "")]
    if row.get("per_rank") is not None and measured.get("per_rank") is not None:
        pairs.append((row["per_rank"], measured["per_rank"], "per rank "))
    for predicted, real, prefix in pairs:
        for key, label in COMPARED:
            if real.get(key) is not None and predicted.get(key) != real[key]:
                out.append(f"{prefix}{label}: {predicted.get(key)} B predicted, {real[key]} B measured")
    return out


def _real(factory: Callable[[], nn.Module], cfg: Any) -> nn.Module:
    model = factory()
    dtype = param_dtype(cfg)
    return model.to(dtype) if dtype is not None else model


def _bytes(tensors: Any) -> int:
    seen: set[int] = set()
    total = 0
    for t in tensors:
        if t is not None and _storage_id(t) not in seen:
            seen.add(_storage_id(t))
            total += t.untyped_storage().nbytes()
    return total

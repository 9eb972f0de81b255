"""One run: train a task's model with one config for a number of steps and
measure it (held-out loss, speed, optimizer state, peak memory, skipped steps).

Every config of a comparison starts from the same weights and sees the same
batches for a seed; the loop is the plain one a user writes (forward, backward
through the optimizer contract, step), so its step time is the optimizer's
(benchmarks/bench_compare.py checks the overhead).
"""

from __future__ import annotations

import contextlib
import math
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

import optcore
from optcore import OptcoreError, resolve

from .._config import typed_config
from .lineup import base_lr, built_name
from .precision import param_dtype
from .probes import memory_finish, memory_start, optimizer_state_bytes
from .tasks import DEFAULT_TASK, load_task, to_device


@dataclass(frozen=True)
class RunSettings:
    """What every config of one comparison shares (picklable: it goes to the spawned worker)."""

    steps: int = 300
    seed: int = 0
    device: str = "cpu"
    task: str = DEFAULT_TASK  # a --task spec (optcore.compare.tasks)
    evals: int = 10  # held-out evaluations besides the one before training


def empty_result(entry: Mapping[str, Any]) -> dict[str, Any]:
    """The JSON record of one run, before it has run."""
    return {
        "name": entry.get("name"),
        "config": {k: v for k, v in entry.items() if k != "name"},
        "built": None, "seed": None, "lr": None,
        "status": "ok", "error": None, "optimizer_class": None, "n_params": None,
        "losses": [], "val_losses": [], "eval_seconds": [], "final": None, "best": None, "best_step": None,
        "steps_per_s": None, "wall_s": None,
        "state_bytes": None, "master_bytes": None, "state_bytes_per_param": None,
        "peak_rss": None, "rss_before": None, "peak_rss_delta": None, "peak_rss_since": None,
        "peak_device_bytes": None, "skipped_steps": None, "loss_scale": None, "warnings": [],
    }  # fmt: skip


def run_config(
    entry: Mapping[str, Any],
    settings: RunSettings,
    report: Callable[[int, float, float | None], None] | None = None,
    sample_chars: int = 0,
) -> dict[str, Any]:
    """Train with one ``{"name", "optimizer", "lr_scheduler"}`` entry; return
    the measurements (:func:`empty_result`). A config that fails to build or
    raises while training comes back with ``status="failed"`` and its
    ``error``; a loss that turns inf/NaN stops the run as ``"diverged"``.
    Warnings are collected into ``result["warnings"]`` instead of printed."""
    result = empty_result(entry)
    result["seed"], result["built"], result["lr"] = settings.seed, built_name(entry["optimizer"]), base_lr(entry)
    start = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            _train(entry, settings, report, sample_chars, result)
        except Exception as exc:  # noqa: BLE001 - e.g. the task fails to load: reported, the others still run
            _fail(result, exc, "task")
    result["wall_s"] = time.perf_counter() - start
    result["warnings"] = list(dict.fromkeys(f"{w.category.__name__}: {w.message}" for w in caught))[:5]
    return result


def _train(
    entry: Mapping[str, Any],
    settings: RunSettings,
    report: Callable[[int, float, float | None], None] | None,
    sample_chars: int,
    result: dict[str, Any],
) -> None:
    device = torch.device(settings.device)
    task = load_task(settings.task)
    heldout = [to_device(b, device) for b in task.heldout(settings.seed)]
    torch.manual_seed(settings.seed)  # the same initial model for every config
    model = task.model()
    dtype = param_dtype(entry["optimizer"])
    model.to(device=device, dtype=dtype) if dtype else model.to(device)
    params = [p for p in model.parameters() if p.requires_grad]
    result["n_params"] = sum(p.numel() for p in params)
    _warm_up(task, model, heldout[0], entry["optimizer"])
    mark = memory_start(device)
    try:
        optimizer, scheduler = optcore.build(dict(entry), model, num_training_steps=settings.steps)
    except Exception as exc:  # noqa: BLE001 - reported in the table; the other configs still run
        _fail(result, exc, "build")
        return
    result["optimizer_class"] = type(optimizer).__name__
    batches = task.batches(settings.seed)
    torch.manual_seed(settings.seed)  # optimizers that draw random numbers draw the same ones
    eval_at = _eval_steps(settings.steps, settings.evals)
    train_seconds, spent, step = 0.0, 0.0, 0  # spent: every training step's time, for the time to target
    try:
        result["val_losses"].append([0, _evaluate(task, optimizer, model, heldout)])
        result["eval_seconds"].append(0.0)
        for step in range(1, settings.steps + 1):
            batch = to_device(next(batches), device)
            begin = time.perf_counter()
            loss = train_step(task, model, optimizer, batch)
            if scheduler is not None:
                _step_scheduler(scheduler, loss)
            took = time.perf_counter() - begin
            spent += took
            if step > 1:  # the first step allocates the state lazily: not representative of steps/s
                train_seconds += took
            result["losses"].append(loss)
            if not math.isfinite(loss):
                result["status"], result["error"] = "diverged", f"the training loss became {loss} at step {step}"
                break
            if step in eval_at:
                result["val_losses"].append([step, _evaluate(task, optimizer, model, heldout)])
                result["eval_seconds"].append(spent)
            if report is not None:
                report(step, loss, optimizer.param_groups[0].get("lr"))
    except Exception as exc:  # noqa: BLE001
        _fail(result, exc, f"step {step}")
    if step > 1 and train_seconds > 0:
        result["steps_per_s"] = (len(result["losses"]) - 1) / train_seconds
    finite = [(v, s) for s, v in result["val_losses"] if math.isfinite(v)]
    if finite:
        result["best"], result["best_step"] = min(finite)
        last = result["val_losses"][-1][1]
        result["final"] = last if result["status"] == "ok" and math.isfinite(last) else None
    result.update(optimizer_state_bytes(optimizer, params))
    result.update(memory_finish(mark, device))
    result["skipped_steps"] = getattr(optimizer, "skipped_steps", None)
    result["loss_scale"] = getattr(optimizer, "loss_scale", None)
    if sample_chars > 0 and result["status"] == "ok" and hasattr(task, "sample"):
        result["sample"] = task.sample(model, sample_chars, settings.seed, device)
    result["val_losses"] = [[s, v if math.isfinite(v) else None] for s, v in result["val_losses"]]
    result["losses"] = [v if math.isfinite(v) else None for v in result["losses"]]


def train_step(task: Any, model: nn.Module, optimizer: Any, batch: Any) -> float:
    """One step through the contract: ``backward`` (the fp16 wrappers scale the
    loss there), then ``step``; optimizers that must re-evaluate the loss
    (LBFGS) get a closure instead."""
    conflicts = getattr(optimizer, "contract_conflicts", ())
    backward = optimizer.backward if hasattr(optimizer, "backward") and "backward" not in conflicts else Tensor.backward

    def closure() -> Tensor:
        optimizer.zero_grad()
        loss = task.loss(model, batch)
        backward(loss)
        return loss

    if getattr(optimizer, "_passes_closure", False):
        out = optimizer.step(closure)
        return float(out.detach() if isinstance(out, Tensor) else out)
    loss = closure()
    optimizer.step()
    return float(loss.detach())


def _warm_up(task: Any, model: nn.Module, batch: Any, optimizer_cfg: Any) -> None:
    """Pay the one-off costs before memory is measured, so that the growth
    measured from there is the optimizer's: a forward and backward (autograd and
    oneDNN workspaces), the optimizer's class and schema (its package, pydantic)
    and ``torch._dynamo``, which torch's optimizers import on construction
    (~80 MB of modules in torch 2.13)."""
    task.loss(model, batch).backward()
    model.zero_grad(set_to_none=True)
    with contextlib.suppress(Exception):  # a bad config is reported by the build, with its own message
        import torch._dynamo  # noqa: F401

        resolve(typed_config(optimizer_cfg)["type"]).schema  # noqa: B018


@torch.no_grad()
def _evaluate(task: Any, optimizer: Any, model: nn.Module, batches: Sequence[Any]) -> float:
    """Mean held-out loss in eval mode; schedule-free optimizers evaluate at their averaged point."""
    switch = getattr(optimizer, "eval", None), getattr(optimizer, "train", None)
    averaged = callable(switch[0]) and callable(switch[1])
    if averaged:
        switch[0]()
    was_training = model.training
    model.eval()
    try:
        return sum(float(task.loss(model, b)) for b in batches) / len(batches)
    finally:
        model.train(was_training)
        if averaged:
            switch[1]()


def _step_scheduler(scheduler: Any, loss: float) -> None:
    if isinstance(scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau):
        scheduler.step(loss)
    else:
        scheduler.step()


def _eval_steps(steps: int, evals: int) -> set[int]:
    every = max(1, steps // max(1, evals))
    return set(range(every, steps + 1, every)) | {steps}


def _fail(result: dict[str, Any], exc: BaseException, where: str) -> None:
    message = str(exc) if isinstance(exc, OptcoreError) else f"{type(exc).__name__}: {exc}"
    result["status"], result["error"] = "failed", f"{where}: {message}"

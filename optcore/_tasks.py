"""The embedded task ``optcore compare`` and ``optcore train`` run: a tiny
character-level transformer language model on a corpus shipped in the package.

Why this task: it is the kind of model people pick optimizers for (attention,
layer norms, embeddings, weight decay that matters), it needs no download, and
at 2 layers x d=64 (~0.1M parameters) a few hundred steps take seconds on a CPU
while the optimizers still separate clearly.

The corpus (``optcore/data/corpus.txt``, 12 KB) is public-domain text:
Shakespeare's sonnets 1, 2, 18, 19, 29, 30, 55, 60, 65, 73, 104, 106, 116, 130
and 146, the Gettysburg Address, a passage of the Declaration of Independence
and the Preamble of the US Constitution. Every 8th block of 256 characters is
held out for validation.
"""

from __future__ import annotations

import contextlib
import math
import os
import time
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from importlib import resources
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn import functional as F

BLOCK = 256
HOLDOUT_EVERY = 8


@dataclass(frozen=True)
class TaskConfig:
    """Sizes of the embedded task (defaults: ~0.1M parameters, ~5 ms a step on 2 CPU cores)."""

    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 4
    context: int = 64
    batch_size: int = 16
    eval_batches: int = 4


def load_corpus() -> str:
    """The shipped text."""
    return resources.files("optcore").joinpath("data/corpus.txt").read_text(encoding="utf-8")


class CharData:
    """The corpus as token ids, split into train and held-out text, with
    batches drawn from a seeded generator (so a run is reproducible)."""

    def __init__(self, text: str, task: TaskConfig) -> None:
        self.vocab = sorted(set(text))
        index = {ch: i for i, ch in enumerate(self.vocab)}
        ids = torch.tensor([index[ch] for ch in text], dtype=torch.long)
        blocks = list(ids.split(BLOCK))
        held = [b for i, b in enumerate(blocks) if i % HOLDOUT_EVERY == HOLDOUT_EVERY - 1]
        self.train = torch.cat([b for i, b in enumerate(blocks) if i % HOLDOUT_EVERY != HOLDOUT_EVERY - 1])
        self.val = torch.cat(held)
        self.task = task

    def batch(self, generator: torch.Generator, split: str = "train") -> tuple[Tensor, Tensor]:
        """``(inputs, targets)`` of shape (batch, context): random windows, targets shifted by one."""
        data = self.train if split == "train" else self.val
        n = self.task.context
        starts = torch.randint(0, len(data) - n - 1, (self.task.batch_size,), generator=generator)
        x = torch.stack([data[s : s + n] for s in starts.tolist()])
        y = torch.stack([data[s + 1 : s + n + 1] for s in starts.tolist()])
        return x, y

    def fixed_val_batches(self, seed: int) -> list[tuple[Tensor, Tensor]]:
        """The same held-out batches for every config of a run."""
        generator = torch.Generator().manual_seed(seed + 1)
        return [self.batch(generator, "val") for _ in range(self.task.eval_batches)]


class Block(nn.Module):
    """Pre-norm transformer block: causal self-attention, then a 4x MLP."""

    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x: Tensor) -> Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        attn = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(attn.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.ln2(x))


class CharLM(nn.Module):
    """Token + position embeddings, ``n_layers`` blocks, a final norm and an untied head."""

    def __init__(self, vocab_size: int, task: TaskConfig) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab_size, task.d_model)
        self.pos = nn.Embedding(task.context, task.d_model)
        self.blocks = nn.ModuleList(Block(task.d_model, task.n_heads) for _ in range(task.n_layers))
        self.ln_f = nn.LayerNorm(task.d_model)
        self.head = nn.Linear(task.d_model, vocab_size)

    def forward(self, idx: Tensor) -> Tensor:
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


@torch.no_grad()
def sample(model: CharLM, vocab: list[str], n: int, seed: int, device: torch.device, prompt: str = "Shall I ") -> str:
    """``n`` characters after ``prompt``, drawn at temperature 0.8 from a seeded generator."""
    index = {ch: i for i, ch in enumerate(vocab)}
    ids = torch.tensor([[index[ch] for ch in prompt if ch in index]], device=device)
    generator = torch.Generator(device=device).manual_seed(seed)
    context = model.pos.num_embeddings
    model.eval()
    for _ in range(n):
        logits = model(ids[:, -context:])[0, -1].float() / 0.8
        nxt = torch.multinomial(torch.softmax(logits, -1), 1, generator=generator)
        ids = torch.cat([ids, nxt.view(1, 1)], dim=1)
    model.train()
    return "".join(vocab[i] for i in ids[0].tolist())


def lm_loss(model: nn.Module, x: Tensor, y: Tensor) -> Tensor:
    """Mean cross-entropy in fp32 (also when the model computes in fp16/bf16)."""
    logits = model(x)
    return F.cross_entropy(logits.float().flatten(0, 1), y.flatten())


@torch.no_grad()
def evaluate(model: nn.Module, batches: list[tuple[Tensor, Tensor]], device: torch.device) -> float:
    """Mean held-out loss over ``batches``."""
    was_training = model.training
    model.eval()
    total = sum(lm_loss(model, x.to(device), y.to(device)).item() for x, y in batches)
    model.train(was_training)
    return total / len(batches)


# --------------------------------------------------------------------- a run
@dataclass(frozen=True)
class RunSettings:
    """What every config of one comparison shares."""

    steps: int = 300
    seed: int = 0
    device: str = "cpu"
    task: TaskConfig = TaskConfig()
    evals: int = 10  # held-out evaluations besides the one before training


_HALF = {"fp16": torch.float16, "float16": torch.float16, "bf16": torch.bfloat16, "bfloat16": torch.bfloat16}


def param_dtype(optimizer_cfg: Any) -> torch.dtype | None:
    """The half dtype the model must be converted to before building
    ``optimizer_cfg`` (precision wrappers step half-precision parameters), or None."""
    from ._config import optimizer_config
    from ._registry import resolve

    try:
        cfg = optimizer_config(optimizer_cfg)
        precision = cfg.get("precision")
        if precision is None:
            spec = resolve(cfg["type"])
            if spec.is_wrapper and "precision" in spec.schema.model_fields:
                precision = spec.schema.model_fields["precision"].default
    except Exception:  # noqa: BLE001 - the build reports a bad config with its own message
        return None
    return _HALF.get(str(precision).lower())


def run_config(
    entry: Mapping[str, Any],
    settings: RunSettings,
    report: Callable[[int, float, float | None], None] | None = None,
    sample_chars: int = 0,
) -> dict[str, Any]:
    """Train the task's model with one ``{"name", "optimizer", "lr_scheduler"}``
    entry; return the measurements (see :func:`empty_result`). A config that
    fails to build or raises while training comes back with ``status="failed"``
    and its ``error``; a loss that turns inf/NaN stops the run as ``"diverged"``.
    Warnings are collected into ``result["warnings"]`` instead of printed."""
    result = empty_result(entry)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _train(entry, settings, report, sample_chars, result)
    result["warnings"] = list(dict.fromkeys(f"{w.category.__name__}: {w.message}" for w in caught))[:5]
    return result


def _train(
    entry: Mapping[str, Any],
    settings: RunSettings,
    report: Callable[[int, float, float | None], None] | None,
    sample_chars: int,
    result: dict[str, Any],
) -> dict[str, Any]:
    from . import _build

    device = torch.device(settings.device)
    data = CharData(load_corpus(), settings.task)
    val = data.fixed_val_batches(settings.seed)
    torch.manual_seed(settings.seed)  # the same initial model for every config
    model = CharLM(len(data.vocab), settings.task)
    dtype = param_dtype(entry["optimizer"])
    model.to(device=device, dtype=dtype) if dtype else model.to(device)
    params = [p for p in model.parameters() if p.requires_grad]
    result["n_params"] = sum(p.numel() for p in params)
    _warm_up(model, val[0], device, entry["optimizer"])
    mark = _memory_start(device)
    try:
        optimizer, scheduler = _build.build(dict(entry), model, num_training_steps=settings.steps)
    except Exception as exc:  # noqa: BLE001 - reported in the table; the other configs still run
        return _fail(result, exc, "build")
    result["optimizer_class"] = type(optimizer).__name__
    batches = torch.Generator().manual_seed(settings.seed)
    torch.manual_seed(settings.seed)  # optimizers that draw random numbers draw the same ones
    eval_at = _eval_steps(settings.steps, settings.evals)
    train_seconds, step = 0.0, 0
    try:
        result["val_losses"].append([0, _evaluate(optimizer, model, val, device)])
        for step in range(1, settings.steps + 1):
            x, y = (t.to(device) for t in data.batch(batches))
            start = time.perf_counter()
            loss = train_step(model, optimizer, x, y)
            if scheduler is not None:
                _step_scheduler(scheduler, loss)
            if step > 1:  # the first step allocates the state lazily: not representative
                train_seconds += time.perf_counter() - start
            result["losses"].append(loss)
            if not math.isfinite(loss):
                result["status"], result["error"] = "diverged", f"the training loss became {loss} at step {step}"
                break
            if step in eval_at:
                result["val_losses"].append([step, _evaluate(optimizer, model, val, device)])
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
    result.update(_memory_finish(mark, device))
    result["skipped_steps"] = getattr(optimizer, "skipped_steps", None)
    result["loss_scale"] = getattr(optimizer, "loss_scale", None)
    if sample_chars > 0 and result["status"] == "ok":
        result["sample"] = sample(model, data.vocab, sample_chars, settings.seed, device)
    result["val_losses"] = [[s, v if math.isfinite(v) else None] for s, v in result["val_losses"]]
    result["losses"] = [v if math.isfinite(v) else None for v in result["losses"]]
    return result


def empty_result(entry: Mapping[str, Any]) -> dict[str, Any]:
    """The JSON record of one config, before it has run."""
    return {
        "name": entry.get("name"),
        "config": {k: v for k, v in entry.items() if k != "name"},
        "status": "ok",
        "error": None,
        "optimizer_class": None,
        "n_params": None,
        "losses": [],
        "val_losses": [],
        "final": None,
        "best": None,
        "best_step": None,
        "steps_per_s": None,
        "state_bytes": None,
        "master_bytes": None,
        "state_bytes_per_param": None,
        "peak_rss": None,
        "rss_before": None,
        "peak_rss_delta": None,
        "peak_rss_since": None,
        "peak_device_bytes": None,
        "skipped_steps": None,
        "loss_scale": None,
        "warnings": [],
    }


def train_step(model: nn.Module, optimizer: Any, x: Tensor, y: Tensor) -> float:
    """One step through the contract: ``backward`` (the fp16 wrappers scale the
    loss there), then ``step``; optimizers that must re-evaluate the loss
    (LBFGS) get a closure instead."""
    conflicts = getattr(optimizer, "contract_conflicts", ())
    backward = optimizer.backward if hasattr(optimizer, "backward") and "backward" not in conflicts else Tensor.backward

    def closure() -> Tensor:
        optimizer.zero_grad()
        loss = lm_loss(model, x, y)
        backward(loss)
        return loss

    if getattr(optimizer, "_passes_closure", False):
        out = optimizer.step(closure)
        return float(out.detach() if isinstance(out, Tensor) else out)
    loss = closure()
    optimizer.step()
    return float(loss.detach())


def _warm_up(model: nn.Module, batch: tuple[Tensor, Tensor], device: torch.device, optimizer_cfg: Any) -> None:
    """Pay the one-off costs before memory is measured, so that the growth
    measured from there is the optimizer's: a forward and backward (autograd and
    oneDNN workspaces), the optimizer's class and schema (its package, pydantic)
    and ``torch._dynamo``, which torch's optimizers import on construction
    (~80 MB of modules in torch 2.13)."""
    x, y = (t.to(device) for t in batch)
    lm_loss(model, x, y).backward()
    model.zero_grad(set_to_none=True)
    from ._config import optimizer_config
    from ._registry import resolve

    with contextlib.suppress(Exception):  # a bad config is reported by the build, with its own message
        import torch._dynamo  # noqa: F401

        resolve(optimizer_config(optimizer_cfg)["type"]).schema  # noqa: B018


def _evaluate(optimizer: Any, model: nn.Module, batches: list[tuple[Tensor, Tensor]], device: torch.device) -> float:
    """Held-out loss; schedule-free optimizers evaluate at their averaged point."""
    mode = getattr(optimizer, "eval", None), getattr(optimizer, "train", None)
    if callable(mode[0]) and callable(mode[1]):
        mode[0]()
    try:
        return evaluate(model, batches, device)
    finally:
        if callable(mode[0]) and callable(mode[1]):
            mode[1]()


def _step_scheduler(scheduler: Any, loss: float) -> None:
    if isinstance(scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau):
        scheduler.step(loss)
    else:
        scheduler.step()


def _eval_steps(steps: int, evals: int) -> set[int]:
    every = max(1, steps // max(1, evals))
    return {s for s in range(every, steps + 1, every)} | {steps}


def _fail(result: dict[str, Any], exc: BaseException, where: str) -> dict[str, Any]:
    from ._errors import OptcoreError

    message = str(exc) if isinstance(exc, OptcoreError) else f"{type(exc).__name__}: {exc}"
    result["status"], result["error"] = "failed", f"{where}: {message}"
    return result


# -------------------------------------------------------------------- memory
def optimizer_state_bytes(optimizer: Any, params: list[Tensor]) -> dict[str, Any]:
    """Bytes the optimizer holds besides the model: every tensor in its
    ``state`` (each storage once; a state entry that *is* a parameter is not
    counted), plus, for a precision wrapper, the master copies it steps (the
    inner optimizer's parameters that are not the model's) and their gradients."""
    model = {p.untyped_storage().data_ptr() for p in params}
    seen: set[int] = set()

    def count(tensors: Iterator[Tensor]) -> int:
        total = 0
        for t in tensors:
            ptr = t.untyped_storage().data_ptr()
            if ptr not in model and ptr not in seen:
                seen.add(ptr)
                total += t.untyped_storage().nbytes()
        return total

    state = count(_tensors(dict(optimizer.state)))
    inner = getattr(optimizer, "optimizer", None)
    masters = None
    if isinstance(inner, torch.optim.Optimizer) and inner is not optimizer:
        copies = [p for g in inner.param_groups for p in g["params"] if p.untyped_storage().data_ptr() not in model]
        tensors = (t for p in copies for t in (p, p.grad) if t is not None)
        masters = count(tensors)
    n = sum(p.numel() for p in params)
    total = state + (masters or 0)
    return {"state_bytes": total, "master_bytes": masters, "state_bytes_per_param": total / n if n else None}


def _tensors(obj: Any) -> Iterator[Tensor]:
    if isinstance(obj, Tensor):
        yield obj
    elif isinstance(obj, Mapping):
        for value in obj.values():
            yield from _tensors(value)
    elif isinstance(obj, (list, tuple)):
        for value in obj:
            yield from _tensors(value)


def _rss_now() -> int | None:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def _reset_peak_rss() -> bool:
    """Reset the kernel's high-water mark (VmHWM) to the current RSS (Linux >= 4.0),
    so that the peak read later belongs to this config alone."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _peak_rss() -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    try:
        import resource
        import sys

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return int(peak) if sys.platform == "darwin" else int(peak) * 1024
    except (ImportError, OSError):
        return None


def _memory_start(device: torch.device) -> dict[str, Any]:
    mark = {"reset": _reset_peak_rss(), "before": _rss_now()}
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    return mark


def _memory_finish(mark: dict[str, Any], device: torch.device) -> dict[str, Any]:
    peak, before = _peak_rss(), mark["before"]
    out = {
        "peak_rss": peak,
        "rss_before": before,
        "peak_rss_delta": peak - before if peak is not None and before is not None else None,
        "peak_rss_since": "optimizer build (VmHWM reset)" if mark["reset"] else "process start",
        "peak_device_bytes": None,
    }
    if device.type == "cuda":
        out["peak_device_bytes"] = int(torch.cuda.max_memory_allocated(device))
    return out

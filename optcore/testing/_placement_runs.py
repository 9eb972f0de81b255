"""What :func:`~optcore.testing.check_placements` trains, and how each placement trains it.

The problem is a transformer block in miniature (:class:`KitModel`): an
embedding, input and output projections, a LayerNorm, an MLP with a gate, in
shapes that 2, 3 and 4 ranks do not divide, with matrices of one to three rows
so that FSDP2 leaves some ranks an empty shard. Every rank steps its rows of
the batch (:func:`rows`); one process steps all of them. Each placement is a
list of stages (:data:`STAGES`): the stages of one round run on spawned gloo
ranks of one world size, or in the parent when the world size is 1, so a
checkpoint saved in one round is resumed at another world size in the next.
"""

from __future__ import annotations

import os
import traceback
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

ROWS = 48  # the batch: 2, 3 and 4 ranks each step an equal share of it
VOCAB, WIDTH, HIDDEN = 7, 12, 30


class Block(nn.Module):
    """A pre-norm MLP with its residual: the unit FSDP2 shards and tensor parallelism splits."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(WIDTH)
        self.up = nn.Linear(WIDTH, HIDDEN)
        self.down = nn.Linear(HIDDEN, WIDTH)

    def forward(self, h: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        return h + self.down(nn.functional.gelu(self.up(self.norm(h)))) * gate


class KitModel(nn.Module):
    """An embedding (7 rows), an input projection, a LayerNorm, an MLP (30 and
    12 rows) with a one-row gate, and a 3-row head: uneven shards on 2, 3 and 4
    ranks, empty ones for the gate and, on 4 ranks, the head. The token of a
    row is read from its features, so every rank embeds its rows as one
    process does."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.proj = nn.Linear(6, WIDTH)
        self.block = Block()
        self.gate = nn.Parameter(torch.full((1, WIDTH), 0.5))
        self.head = nn.Linear(WIDTH, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = (x[:, 0].float() * 3).floor().long().remainder(VOCAB)
        return self.head(self.block(self.proj(x) + self.embed(tokens), self.gate))

    def units(self) -> list[nn.Module]:
        """What FSDP2 shards on its own, before the root: the block and the projections."""
        return [self.proj, self.block, self.head]


def model(dtype: str, seed: int = 0) -> KitModel:
    torch.manual_seed(seed)
    return KitModel().to(getattr(torch, dtype))


def batch(step: int, dtype: str, part: slice = slice(None)) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(100 + step)
    x = torch.randn(ROWS, 6, generator=g)
    w = torch.randn(6, 3, generator=g)
    y = torch.tanh(x @ w)
    return x[part].to(getattr(torch, dtype)), y[part].to(getattr(torch, dtype))


def rows(rank: int, world: int) -> slice:
    n = ROWS // world
    return slice(rank * n, (rank + 1) * n)


def build(config: Any, module: nn.Module) -> Any:
    from .._build import build_optimizer

    return build_optimizer(config, module)


def backward(opt: Any, loss: torch.Tensor) -> None:
    through = getattr(opt, "backward", None)  # the contract's: a precision wrapper scales the loss
    if through is None:
        loss.backward()
    else:
        through(loss)


def train(
    dtype: str, module: Callable[..., torch.Tensor], opt: Any, steps: range, part: slice,
    micro: int = 1, reverse: bool = False,
) -> None:
    """``steps`` steps on ``part`` of each batch, as ``micro`` accumulated
    backward passes of ``1 / micro`` of the loss (last piece first with
    ``reverse``: another summation order, the one process's own noise)."""
    for step in steps:
        opt.zero_grad()
        x, y = batch(step, dtype, part)
        n = len(x) // micro
        order = range(micro - 1, -1, -1) if reverse else range(micro)
        for piece in order:
            take = slice(piece * n, (piece + 1) * n)
            backward(opt, nn.functional.mse_loss(module(x[take]), y[take]) / micro)
        opt.step()


def full(module: nn.Module) -> list[torch.Tensor]:
    return [(p.full_tensor() if hasattr(p, "full_tensor") else p).detach().clone() for p in module.parameters()]


def dcp_save(module: nn.Module, opt: Any, path: str) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

    dcp.save({"model": get_model_state_dict(module), "optim": get_optimizer_state_dict(module, opt)},
             checkpoint_id=path)


def dcp_load(module: nn.Module, opt: Any, path: str) -> None:
    """As DCP's documentation loads: the model first, then the optimizer into
    the template ``get_optimizer_state_dict`` makes of it."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict,
        get_optimizer_state_dict,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    state = {"model": get_model_state_dict(module)}
    dcp.load(state, checkpoint_id=path)
    set_model_state_dict(module, state["model"])
    state = {"optim": get_optimizer_state_dict(module, opt)}
    dcp.load(state, checkpoint_id=path)
    set_optimizer_state_dict(module, opt, state["optim"])


# ----------------------------------------------------------------------------- meshes
def fsdp(module: KitModel, world: int, *, mesh_per_call: bool = False) -> KitModel:
    """``fully_shard`` on each unit and the root, on one mesh, or with a mesh of
    its own per call (equal meshes, as docs/distributed.md's example makes)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    shared = init_device_mesh("cpu", (world,))
    for unit in module.units():
        fully_shard(unit, mesh=init_device_mesh("cpu", (world,)) if mesh_per_call else shared)
    fully_shard(module, mesh=init_device_mesh("cpu", (world,)) if mesh_per_call else shared)
    return module


def hsdp(module: KitModel, world: int) -> KitModel:
    """HSDP on a 2 x (world / 2) mesh: replicated over the first dimension, sharded over the second."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (2, world // 2), mesh_dim_names=("replicate", "shard"))
    for unit in module.units():
        fully_shard(unit, mesh=mesh)
    fully_shard(module, mesh=mesh)
    return module


# ----------------------------------------------------------------------------- stages on ranks
Run = Callable[[int, int, Any, str, int, str], list[torch.Tensor]]


def _ddp(rank: int, world: int, config: Any, dtype: str, steps: int, where: str) -> list[torch.Tensor]:
    from torch.nn.parallel import DistributedDataParallel

    module = model(dtype)
    opt = build(config, module)
    train(dtype, DistributedDataParallel(module), opt, range(steps), rows(rank, world))
    return full(module)


def _sharded(shard: Callable[[KitModel, int], KitModel]) -> Run:
    def run(rank: int, world: int, config: Any, dtype: str, steps: int, where: str) -> list[torch.Tensor]:
        module = shard(model(dtype), world)
        opt = build(config, module)
        train(dtype, module, opt, range(steps), rows(rank, world))
        return full(module)

    return run


def _zero1(rank: int, world: int, config: Any, dtype: str, steps: int, where: str) -> list[torch.Tensor]:
    from torch.nn.parallel import DistributedDataParallel

    from ..integrations.zero import zero_redundancy

    module = model(dtype)
    opt = zero_redundancy(config, module)
    train(dtype, DistributedDataParallel(module), opt, range(steps), rows(rank, world))
    return full(module)


def _deepspeed(stage: int) -> Run:
    def run(rank: int, world: int, config: Any, dtype: str, steps: int, where: str) -> list[torch.Tensor]:
        from ..integrations import deepspeed as ds

        missing = deepspeed_missing()
        if missing:
            raise _Skipped(missing)
        os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(world))
        ds_config = {
            "train_micro_batch_size_per_gpu": ROWS // world,
            "gradient_accumulation_steps": 1,
            "gradient_clipping": 0.0,
            "zero_optimization": {"stage": stage},
        }
        module = model(dtype)
        engine, _, _, _ = ds.initialize(module, ds_config, optimizer=config)
        try:
            for step in range(steps):
                x, y = batch(step, dtype, rows(rank, world))
                engine.backward(nn.functional.mse_loss(engine(x), y))
                engine.step()
            if stage == 3:
                import deepspeed

                with deepspeed.zero.GatheredParameters(list(module.parameters())):
                    return full(module)
            return full(module)
        finally:
            engine.destroy()

    return run


def _save_sharded(rank: int, world: int, config: Any, dtype: str, steps: int, where: str) -> list[torch.Tensor]:
    module = fsdp(model(dtype), world)
    opt = build(config, module)
    train(dtype, module, opt, range(steps // 2), rows(rank, world))
    dcp_save(module, opt, where)
    return []


def _load_sharded(rank: int, world: int, config: Any, dtype: str, steps: int, where: str) -> list[torch.Tensor]:
    module = fsdp(model(dtype, seed=7), world)
    opt = build(config, module)
    dcp_load(module, opt, where)
    train(dtype, module, opt, range(steps // 2, steps), rows(rank, world))
    return full(module)


class _Skipped(Exception):
    """The placement cannot run here (DeepSpeed is not installed)."""


def deepspeed_missing() -> str | None:
    os.environ.setdefault("DS_ACCELERATOR", "cpu")  # DeepSpeed would look for CUDA first
    try:
        import deepspeed.ops
    except ImportError as exc:
        return f"DeepSpeed is not installed ({exc}); pip install 'optcore[deepspeed]'"
    # its CPU backend JIT-compiles a shared-memory all-reduce on first use (minutes); training uses gloo's
    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    return None


#: placement -> its stages, each (world size, what a rank runs; None: the one
#: process in the parent, which saves or resumes a DCP checkpoint)
STAGES: dict[str, tuple[tuple[int, Run | None], ...]] = {
    "ddp": ((2, _ddp),),
    "fsdp2": ((2, _sharded(lambda m, w: fsdp(m, w, mesh_per_call=True))),),
    "fsdp2-3": ((3, _sharded(fsdp)),),
    "fsdp2-4": ((4, _sharded(fsdp)),),
    "hsdp-2x2": ((4, _sharded(hsdp)),),
    "zero1": ((2, _zero1),),
    "deepspeed-zero1": ((2, _deepspeed(1)),),
    "deepspeed-zero2": ((2, _deepspeed(2)),),
    "deepspeed-zero3": ((2, _deepspeed(3)),),
    "dcp-2to1": ((2, _save_sharded), (1, None)),
    "dcp-1to2": ((1, None), (2, _load_sharded)),
    "dcp-2to3": ((2, _save_sharded), (3, _load_sharded)),
    "dcp-3to2": ((3, _save_sharded), (2, _load_sharded)),
    "dcp-4to1": ((4, _save_sharded), (1, None)),
}


def on_ranks(
    rank: int, world: int, cells: list[tuple[str, str, Any, str, int, str]], stage: int
) -> dict[tuple[str, str], tuple[str, Any]]:
    """Every cell ``(row, placement, config, dtype, steps, checkpoint folder)``
    of this round on this rank, DeepSpeed's last (it sets up state of its own)."""
    out: dict[tuple[str, str], tuple[str, Any]] = {}
    for name, placement, config, dtype, steps, where in sorted(cells, key=lambda c: c[1].startswith("deepspeed")):
        run = STAGES[placement][stage][1]
        assert run is not None
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                out[name, placement] = ("ran", run(rank, world, config, dtype, steps, where))
        except _Skipped as skipped:
            out[name, placement] = ("skipped", str(skipped))
        except Exception as exc:  # noqa: BLE001 - every failure is the cell's outcome
            out[name, placement] = failure(exc)
    return out


def checkpoint_folder(root: str, placement: str, row: int) -> str:
    return str(Path(root, placement, str(row)))


def describe(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".strip()
    return text if len(text) <= 2000 else text[:2000] + " ..."


def failure(exc: BaseException) -> tuple[str, str]:
    """A :class:`~optcore.ConfigError` is a refusal, unless it only wraps an
    error the optimizer's constructor hit by accident (a ``RuntimeError`` from
    an operator that has no ``DTensor`` rule is a crash, not a reason)."""
    from .._errors import ConfigError

    cause = exc.__cause__
    if isinstance(exc, ConfigError) and (cause is None or isinstance(cause, (ConfigError, ValueError, TypeError))):
        return ("refused", str(exc))
    frames = traceback.extract_tb(exc.__traceback__)
    ours = [f for f in frames if "site-packages" not in f.filename] or frames
    last = ours[-1] if ours else None
    where = f" (at {Path(last.filename).name}:{last.lineno} in {last.name}: {last.line})" if last else ""
    return ("crashed", describe(exc) + where + "\n" + "".join(traceback.format_list(frames[-3:])))

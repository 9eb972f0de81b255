"""The kit's placement dimension: :func:`check_placements`.

Every optimizer runs a few steps of the kit's problem under each placement on
spawned gloo ranks (each rank on its half of the batch) and is compared with
ONE process stepping the full batch, never with another sharded run (gloo's
``AVG`` has summed instead of averaged in some torch versions, so two sharded
runs can agree and both be wrong). One process group runs every optimizer
under every placement, so a table of many optimizers costs one spawn.

Each cell ends in one of:

* ``equal``: the parameters match the one process within ``atol`` (the
  largest difference is kept);
* ``refused``: a :class:`~optcore.ConfigError` said why and what works
  instead (the message is kept);
* ``differs``: it ran and its parameters are not those of one process: a
  bug, the thing this kit exists to find;
* ``crashed``: anything else was raised (the error is kept);
* ``skipped``: the placement cannot run here (DeepSpeed not installed).

Placements (:data:`PLACEMENTS`): ``ddp``; ``fsdp2`` (``fully_shard`` on each
linear layer and the root); ``zero1`` (:func:`optcore.distributed.zero_redundancy`
under DDP); ``deepspeed-zero1`` / ``deepspeed-zero2`` (the real DeepSpeed on its
CPU accelerator through :mod:`optcore.integrations.deepspeed`, no clipping);
``dcp-2to1`` (two FSDP2 ranks train half the steps and save with
``torch.distributed.checkpoint``, one process loads and trains the rest) and
``dcp-1to2`` (the other way round).
"""

from __future__ import annotations

import importlib.metadata
import math
import os
import tempfile
import time
import traceback
import warnings
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ._fixtures import Net, data
from ._ranks import run_ranks

PLACEMENTS = ("ddp", "fsdp2", "zero1", "deepspeed-zero1", "deepspeed-zero2", "dcp-2to1", "dcp-1to2")
OUTCOMES = ("equal", "refused", "differs", "crashed", "skipped")
WORLD_SIZE = 2
READY = "one-process-done"  # the file the parent writes when its checkpoints for dcp-1to2 are saved
ROWS = 32  # the kit's batch (optcore.testing._fixtures.data); each rank steps ROWS // WORLD_SIZE


@dataclass(frozen=True)
class PlacementCase:
    """One optimizer for :func:`check_placements`.

    ``config`` is what ``optcore.build_optimizer`` takes (a mapping with
    ``type``: a name, a dotted path or a class). ``dtype`` is the model's
    (``"float16"`` for the precision wrappers). The one process steps with
    ``reference_config`` (default: ``config``), accumulating the full batch as
    ``micro_batches`` backward passes of ``1 / micro_batches`` of the loss: an
    optimizer that measures its gradients' spread (AdaScale) needs the same
    number of samples per step as the sharded run's ranks give it.
    """

    config: Any
    dtype: str = "float32"
    atol: float | None = None
    reference_config: Any = None
    micro_batches: int = 1


@dataclass(frozen=True)
class PlacementResult:
    optimizer: str
    placement: str
    outcome: str
    max_diff: float | None = None
    message: str = ""
    atol: float | None = None  # the tolerance the difference was judged by

    def short(self) -> str:
        """The table's cell."""
        if self.outcome in ("equal", "differs") and self.max_diff is not None:
            text = f"{self.outcome} ({self.max_diff:.1e})"
        else:
            text = self.outcome
        return f"**{text}**" if self.outcome in ("differs", "crashed") else text


@dataclass(frozen=True)
class PlacementReport:
    """What :func:`check_placements` found: one :class:`PlacementResult` per
    (optimizer, placement). ``str(report)`` is the table and every message."""

    optimizers: tuple[str, ...]
    placements: tuple[str, ...]
    results: tuple[PlacementResult, ...]
    steps: int
    atol: float
    environment: dict[str, str] = field(default_factory=dict)

    def __getitem__(self, key: tuple[str, str]) -> PlacementResult:
        for r in self.results:
            if (r.optimizer, r.placement) == key:
                return r
        raise KeyError(key)

    def problems(self) -> list[PlacementResult]:
        """The cells that differ from one process or crashed."""
        return [r for r in self.results if r.outcome in ("differs", "crashed")]

    def table(self) -> str:
        """A Markdown table: one row per optimizer, one column per placement."""
        lines = ["| optimizer | " + " | ".join(self.placements) + " |", "|---" * (len(self.placements) + 1) + "|"]
        for name in self.optimizers:
            lines.append(f"| {name} | " + " | ".join(self[name, p].short() for p in self.placements) + " |")
        return "\n".join(lines)

    def messages(self) -> str:
        """Every refusal's and failure's message, one line each."""
        out = []
        for r in self.results:
            if r.message:
                first = " ".join(r.message.split())
                out.append(f"- {r.optimizer} / {r.placement}: {r.outcome}: {first}")
        return "\n".join(out)

    def __str__(self) -> str:
        return self.table() + ("\n\n" + self.messages() if self.messages() else "")

    def to_dict(self) -> dict[str, Any]:
        return {
            "optimizers": list(self.optimizers),
            "placements": list(self.placements),
            "steps": self.steps,
            "atol": self.atol,
            "environment": dict(self.environment),
            "results": [asdict(r) for r in self.results],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PlacementReport:
        return cls(
            tuple(data["optimizers"]), tuple(data["placements"]),
            tuple(PlacementResult(**r) for r in data["results"]), data["steps"], data["atol"],
            dict(data.get("environment", {})),
        )


def check_placements(
    optimizers: Mapping[str, Any] | Iterable[Any],
    placements: Iterable[str] = PLACEMENTS,
    *,
    steps: int = 4,
    atol: float = 1e-5,
    timeout: float = 300.0,
) -> PlacementReport:
    """Run every optimizer under every placement on 2 spawned gloo ranks and
    compare each with one process on the full batch.

    ``optimizers`` maps a row name to a config or a :class:`PlacementCase`
    (a list of configs is named by their ``type``). A user's class must be
    importable by the spawned ranks (defined at module level). Returns a
    :class:`PlacementReport`; nothing is raised for a cell that fails, so one
    report shows all of them.
    """
    cases = _cases(optimizers)
    placements = tuple(placements)
    unknown = [p for p in placements if p not in PLACEMENTS]
    if unknown:
        raise ValueError(f"unknown placements {unknown}; the kit has {list(PLACEMENTS)}")
    if steps < 2:
        raise ValueError("steps must be >= 2 (a DCP resume saves after steps // 2)")
    half = steps // 2
    results: dict[tuple[str, str], PlacementResult] = {}
    with tempfile.TemporaryDirectory(prefix="optcore-placements-") as root:
        references: dict[str, list[torch.Tensor]] = {}

        def one_process() -> None:
            """The references and the checkpoints for ``dcp-1to2``, while the ranks import."""
            try:
                for name, case in cases.items():
                    try:
                        references[name] = _one_process(case, range(steps))
                        if "dcp-1to2" in placements:
                            _one_process(case, range(half), save=str(Path(root, "1to2", name)))
                    except Exception as exc:  # noqa: BLE001 - the whole row reports it
                        message = f"one process: {_describe(exc)}"
                        for p in placements:
                            results[name, p] = PlacementResult(name, p, "crashed", message=message)
            finally:
                Path(root, READY).touch()  # the ranks' dcp-1to2 cells wait for it

        ranks = run_ranks(_on_ranks, WORLD_SIZE, cases, placements, steps, root, timeout=timeout, meanwhile=one_process)
        runnable = {n: c for n, c in cases.items() if n in references}
        for name, case in runnable.items():
            tol = atol if case.atol is None else case.atol
            for p in placements:
                got = [r[name, p] for r in ranks]
                if p == "dcp-2to1" and all(g[0] == "ran" for g in got):
                    try:
                        got = [("ran", _one_process(case, range(half, steps), load=str(Path(root, "2to1", name))))]
                    except Exception as exc:  # noqa: BLE001
                        got = [_failure(exc)]
                results[name, p] = _judge(name, p, got, references[name], tol)
    environment = {"torch": torch.__version__, "world_size": str(WORLD_SIZE), "backend": "gloo"}
    try:
        environment["deepspeed"] = importlib.metadata.version("deepspeed")
    except importlib.metadata.PackageNotFoundError:
        pass
    return PlacementReport(
        tuple(cases), placements, tuple(results[n, p] for n in cases for p in placements), steps, atol, environment
    )


def _cases(optimizers: Mapping[str, Any] | Iterable[Any]) -> dict[str, PlacementCase]:
    if isinstance(optimizers, Mapping):
        items = list(optimizers.items())
    else:
        items = [(_name(c.config if isinstance(c, PlacementCase) else c), c) for c in optimizers]
    return {name: c if isinstance(c, PlacementCase) else PlacementCase(c) for name, c in items}


def _name(config: Any) -> str:
    kind = config.get("type", config) if isinstance(config, Mapping) else config
    return kind.__name__ if isinstance(kind, type) else str(kind)


def _judge(
    name: str, placement: str, got: list[tuple[str, Any]], want: list[torch.Tensor], atol: float
) -> PlacementResult:
    for kind, value in got:
        if kind != "ran":
            return PlacementResult(name, placement, kind, message=value)
    diff = 0.0
    for _, params in got:
        for a, b in zip(params, want, strict=True):
            d = (a.double() - b.double()).abs().max().item()
            diff = math.inf if math.isnan(d) else max(diff, d)
    return PlacementResult(name, placement, "equal" if diff <= atol else "differs", diff, atol=atol)


def _describe(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".strip()
    return text if len(text) <= 2000 else text[:2000] + " ..."


def _failure(exc: BaseException) -> tuple[str, str]:
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
    return ("crashed", _describe(exc) + where + "\n" + "".join(traceback.format_list(frames[-3:])))


# ----------------------------------------------------------------------------- training
def _model(case: PlacementCase, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return Net(matrices_only=False).to(getattr(torch, case.dtype))


def _batch(step: int, case: PlacementCase, rows: slice = slice(None)) -> tuple[torch.Tensor, torch.Tensor]:
    x, y = data(seed=100 + step, dtype=getattr(torch, case.dtype))
    return x[rows], y[rows]


def _build(config: Any, model: nn.Module) -> Any:
    from .._build import build_optimizer

    return build_optimizer(config, model)


def _backward(opt: Any, loss: torch.Tensor) -> None:
    backward = getattr(opt, "backward", None)  # the contract's: a precision wrapper scales the loss
    if backward is None:
        loss.backward()
    else:
        backward(loss)


def _train(
    case: PlacementCase, model: Callable[..., torch.Tensor], opt: Any, steps: range, rows: slice, micro: int = 1
) -> None:
    for step in steps:
        opt.zero_grad()
        x, y = _batch(step, case, rows)
        for part in range(micro):
            n = len(x) // micro
            piece = slice(part * n, (part + 1) * n)
            _backward(opt, nn.functional.mse_loss(model(x[piece]), y[piece]) / micro)
        opt.step()


def _full(model: nn.Module) -> list[torch.Tensor]:
    return [(p.full_tensor() if hasattr(p, "full_tensor") else p).detach().clone() for p in model.parameters()]


def _one_process(
    case: PlacementCase, steps: range, *, save: str | None = None, load: str | None = None
) -> list[torch.Tensor]:
    """The reference (``steps`` from 0), or one side of a DCP resume."""
    config = case.config if case.reference_config is None else case.reference_config
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = _model(case, seed=7 if load else 0)
        opt = _build(config, model)
        if load:
            _dcp_load(model, opt, load)
        _train(case, model, opt, steps, slice(None), case.micro_batches)
        if save:
            _dcp_save(model, opt, save)
    return _full(model)


def _dcp_save(model: nn.Module, opt: Any, path: str) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

    dcp.save({"model": get_model_state_dict(model), "optim": get_optimizer_state_dict(model, opt)}, checkpoint_id=path)


def _dcp_load(model: nn.Module, opt: Any, path: str) -> None:
    """As DCP's documentation loads: the model first, then the optimizer into
    the template ``get_optimizer_state_dict`` makes of it."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict,
        get_optimizer_state_dict,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    state = {"model": get_model_state_dict(model)}
    dcp.load(state, checkpoint_id=path)
    set_model_state_dict(model, state["model"])
    state = {"optim": get_optimizer_state_dict(model, opt)}
    dcp.load(state, checkpoint_id=path)
    set_optimizer_state_dict(model, opt, state["optim"])


# ----------------------------------------------------------------------------- on the ranks
def _fsdp(model: nn.Module, world: int) -> nn.Module:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (world,))
    for layer in (model.fc1, model.fc2):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def _ddp(rank: int, world: int, case: PlacementCase, steps: int, root: str, name: str) -> list[torch.Tensor]:
    from torch.nn.parallel import DistributedDataParallel

    model = _model(case)
    opt = _build(case.config, model)
    _train(case, DistributedDataParallel(model), opt, range(steps), _rows(rank, world))
    return _full(model)


def _fsdp2(rank: int, world: int, case: PlacementCase, steps: int, root: str, name: str) -> list[torch.Tensor]:
    model = _fsdp(_model(case), world)
    opt = _build(case.config, model)
    _train(case, model, opt, range(steps), _rows(rank, world))
    return _full(model)


def _zero1(rank: int, world: int, case: PlacementCase, steps: int, root: str, name: str) -> list[torch.Tensor]:
    from torch.nn.parallel import DistributedDataParallel

    from ..integrations.zero import zero_redundancy

    model = _model(case)
    opt = zero_redundancy(case.config, model)
    _train(case, DistributedDataParallel(model), opt, range(steps), _rows(rank, world))
    return _full(model)


def _deepspeed(stage: int) -> Callable[..., list[torch.Tensor]]:
    def run(rank: int, world: int, case: PlacementCase, steps: int, root: str, name: str) -> list[torch.Tensor]:
        from ..integrations import deepspeed as ds

        config = {
            "train_micro_batch_size_per_gpu": ROWS // world,
            "gradient_accumulation_steps": 1,
            "gradient_clipping": 0.0,
            "zero_optimization": {"stage": stage},
        }
        model = _model(case)
        engine, _, _, _ = ds.initialize(model, config, optimizer=case.config)
        try:
            for step in range(steps):
                x, y = _batch(step, case, _rows(rank, world))
                engine.backward(nn.functional.mse_loss(engine(x), y))
                engine.step()
            return _full(model)
        finally:
            engine.destroy()

    return run


def _dcp_2to1(rank: int, world: int, case: PlacementCase, steps: int, root: str, name: str) -> list[torch.Tensor]:
    model = _fsdp(_model(case), world)
    opt = _build(case.config, model)
    _train(case, model, opt, range(steps // 2), _rows(rank, world))
    _dcp_save(model, opt, str(Path(root, "2to1", name)))
    return []


def _dcp_1to2(rank: int, world: int, case: PlacementCase, steps: int, root: str, name: str) -> list[torch.Tensor]:
    deadline = time.monotonic() + 300
    while not Path(root, READY).exists():  # the one process saves while the ranks run the other placements
        if time.monotonic() > deadline:
            raise TimeoutError("the one process wrote no checkpoints for dcp-1to2 within 300 s")
        time.sleep(0.05)
    model = _fsdp(_model(case, seed=7), world)
    opt = _build(case.config, model)
    _dcp_load(model, opt, str(Path(root, "1to2", name)))
    _train(case, model, opt, range(steps // 2, steps), _rows(rank, world))
    return _full(model)


_RUNS: dict[str, Callable[..., list[torch.Tensor]]] = {
    "ddp": _ddp,
    "fsdp2": _fsdp2,
    "zero1": _zero1,
    "deepspeed-zero1": _deepspeed(1),
    "deepspeed-zero2": _deepspeed(2),
    "dcp-2to1": _dcp_2to1,
    "dcp-1to2": _dcp_1to2,
}


def _rows(rank: int, world: int) -> slice:
    n = ROWS // world
    return slice(rank * n, (rank + 1) * n)


def _deepspeed_missing() -> str | None:
    os.environ.setdefault("DS_ACCELERATOR", "cpu")  # DeepSpeed would look for CUDA first
    try:
        import deepspeed.ops
    except ImportError as exc:
        return f"DeepSpeed is not installed ({exc}); pip install 'optcore[deepspeed]'"
    # its CPU backend JIT-compiles a shared-memory all-reduce on first use (minutes); training uses gloo's
    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    return None


def _on_ranks(
    rank: int, world: int, cases: dict[str, PlacementCase], placements: tuple[str, ...], steps: int, root: str
) -> dict[tuple[str, str], tuple[str, Any]]:
    """Every (optimizer, placement) on this rank, placement by placement
    (DeepSpeed's last: it sets up state of its own)."""
    out: dict[tuple[str, str], tuple[str, Any]] = {}
    for placement in sorted(placements, key=lambda p: p.startswith("deepspeed")):
        missing = None
        if placement.startswith("deepspeed"):
            missing = _deepspeed_missing()
            os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(world))
        for name, case in cases.items():
            if missing:
                out[name, placement] = ("skipped", missing)
                continue
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    out[name, placement] = ("ran", _RUNS[placement](rank, world, case, steps, root, name))
            except Exception as exc:  # noqa: BLE001 - every failure is the cell's outcome
                out[name, placement] = _failure(exc)
    return out

"""torch.compile: the whole step traces (no C kernel, no graph break, no
recompile per step), and implementation='compiled' compiles the update once
per kind of parameter, whatever the step or a scheduled lr."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
from torch._dynamo.testing import CompileCounter

import optcore
from optcore_adafactor import Adafactor, functional

hf = pytest.importorskip("transformers.optimization")

ISSUE_CONFIG = {"type": "optcore-adafactor:Adafactor", "lr": 1e-3, "relative_step": False}


@pytest.fixture(autouse=True)
def fresh_dynamo() -> None:
    torch._dynamo.reset()
    warnings.filterwarnings("ignore", module="torch._dynamo")


def _params(shapes=((64, 64), (64,)), seed: int = 0) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(s, generator=gen).requires_grad_() for s in shapes]


def _twin(params: list[torch.Tensor]) -> list[torch.Tensor]:
    return [p.detach().clone().requires_grad_() for p in params]


def _grads(*param_lists: list[torch.Tensor], step: int) -> None:
    gen = torch.Generator().manual_seed(step)
    for ps in zip(*param_lists):
        g = torch.randn(ps[0].shape, generator=gen)
        for p in ps:
            p.grad = g.clone()


def _close(a: list[torch.Tensor], b: list[torch.Tensor], rtol: float = 1e-5) -> None:
    for x, y in zip(a, b):
        err = float((x.detach() - y.detach()).abs().max() / y.detach().abs().max().clamp(min=1e-12))
        assert err <= rtol, f"shape {tuple(x.shape)}: {err:.3g}"


@pytest.mark.parametrize("backend", ["eager", "inductor"])
@pytest.mark.parametrize("config", [{}, {"beta1": 0.9, "weight_decay": 0.1, "relative_step": True, "lr": None}])
def test_compiled_step_runs_and_matches_the_eager_step(backend: str, config: dict) -> None:
    """The issue's case aborted the process (the C kernel got FakeTensor pointers)."""
    eager, compiled = _params(), None
    compiled = _twin(eager)
    cfg = {**ISSUE_CONFIG, **config}
    opt_eager = optcore.build_optimizer(copy.deepcopy(cfg), eager)
    opt = optcore.build_optimizer(copy.deepcopy(cfg), compiled)
    step = torch.compile(opt.step, backend=backend)
    for i in range(4):
        _grads(eager, compiled, step=i)
        opt_eager.step()
        step()
    _close(compiled, eager)
    assert opt.state[compiled[0]]["step"] == 4


def test_compiled_step_has_no_graph_break_and_no_recompile_per_step() -> None:
    """Counted, against torch's own Adam on the same parameters."""
    counts = {}
    for name, make in {"adam": lambda ps: torch.optim.Adam(ps, lr=1e-3),
                       "adafactor": lambda ps: Adafactor(ps, beta1=0.9),
                       "adafactor manual lr": lambda ps: Adafactor(ps, lr=1e-3, relative_step=False)}.items():
        torch._dynamo.reset()
        params = _params()
        opt = make(params)
        _grads(params, step=0)
        explained = torch._dynamo.explain(opt.step)()
        torch._dynamo.reset()
        counter = CompileCounter()
        step = torch.compile(opt.step, backend=counter)
        for i in range(6):
            _grads(params, step=i)
            step()
        counts[name] = (explained.graph_break_count, counter.frame_count)
    adam_breaks, adam_frames = counts["adam"]
    for name in ("adafactor", "adafactor manual lr"):
        breaks, frames = counts[name]
        assert breaks <= adam_breaks and breaks == 0, counts
        # the first call turns the int step count into a tensor: one recompile, then none
        assert frames <= max(adam_frames, 2), counts


@pytest.fixture
def counter(monkeypatch: pytest.MonkeyPatch) -> CompileCounter:
    """implementation='compiled' with a counting backend (eager execution)."""
    counter = CompileCounter()
    monkeypatch.setattr(functional.CompiledUpdate, "backend", counter)
    return counter


SHAPES = [(40, 24), (7, 30), (3, 4, 5), (24,), (16,)]


@pytest.mark.parametrize("config", [{}, {"beta1": 0.9, "weight_decay": 0.01},
                                    {"lr": 1e-2, "relative_step": False, "scale_parameter": False}])
def test_compiled_implementation_matches_transformers(counter: CompileCounter, config: dict) -> None:
    ours = _params(SHAPES)
    ref = _twin(ours)
    opt, ref_opt = Adafactor(ours, implementation="compiled", **config), hf.Adafactor(ref, **config)
    for i in range(20):
        _grads(ours, ref, step=i)
        opt.step()
        ref_opt.step()
    _close(ours, ref)
    assert counter.frame_count == 3  # one graph per rank (2-D and 3-D factored, vectors), not per shape
    assert isinstance(opt.state[ours[0]]["step"], int) and opt.state[ours[0]]["step"] == 20


@pytest.mark.parametrize("tensor_lr", [True, False])
def test_scheduled_lr_does_not_recompile(counter: CompileCounter, tensor_lr: bool) -> None:
    params = _params(SHAPES)
    opt = Adafactor(params, lr=1e-2, relative_step=False, scale_parameter=False, implementation="compiled")
    if tensor_lr:  # as torch's optimizers take it (the core may keep tensor lrs)
        opt.param_groups[0]["lr"] = torch.tensor(1e-2)
    ref = _twin(params)
    ref_opt = hf.Adafactor(ref, lr=1e-2, relative_step=False, scale_parameter=False)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.9**s)
    ref_sched = torch.optim.lr_scheduler.LambdaLR(ref_opt, lambda s: 0.9**s)
    for i in range(8):
        _grads(params, ref, step=i)
        opt.step()
        ref_opt.step()
        sched.step()
        ref_sched.step()
    assert isinstance(opt.param_groups[0]["lr"], torch.Tensor) is tensor_lr
    _close(params, ref)
    assert counter.frame_count == 3  # as without a scheduler: one per rank


def test_compiled_implementation_with_inductor_matches_the_torch_path() -> None:
    ours = _params([(40, 24), (24,)])
    ref = _twin(ours)
    opt = Adafactor(ours, beta1=0.9, implementation="compiled")
    ref_opt = Adafactor(ref, beta1=0.9, implementation="torch")
    for i in range(5):
        _grads(ours, ref, step=i)
        opt.step()
        ref_opt.step()
    _close(ours, ref)
    assert len(opt._compiled) == 2


def test_groups_that_differ_only_in_numbers_share_the_graphs(counter: CompileCounter) -> None:
    """Hyper-parameters are data: a second group with other numbers (same
    structure) compiles nothing new, and many optimizers in a process do not
    run into dynamo's recompile limit."""
    a, b = _params([(40, 24), (24,)], seed=0), _params([(8, 12), (12,)], seed=1)
    opt = Adafactor([{"params": a, "weight_decay": 0.1, "eps": (1e-30, 1e-3)},
                     {"params": b, "weight_decay": 0.01, "eps": (1e-20, 1e-2), "clip_threshold": 0.5}],
                    beta1=0.9, implementation="compiled")
    for i in range(3):
        _grads(a + b, step=i)
        opt.step()
    assert counter.frame_count == 2  # the matrices' graph and the vectors' graph

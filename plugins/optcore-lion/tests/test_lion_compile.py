"""Lion under torch.compile: a traceable step (the C kernel is eager-only) with
no graph break torch's own optimizers lack, no recompiles for a scheduled tensor
lr, and the ``compiled=True`` implementation compiled once per shapes class.
Counted with dynamo's counters and a counting backend, never timed."""

from __future__ import annotations

import pytest
import torch
import torch._dynamo
from optcore_lion import Lion, functional
from torch._dynamo.testing import CompileCounter
from torch._dynamo.utils import counters

IMPLS = {"default": {}, "fused": {"fused": True}, "foreach": {"foreach": True},
         "forloop": {"foreach": False, "fused": False}}


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    counters.clear()
    yield
    torch._dynamo.reset()


def _model(dtype=torch.float32, seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.LayerNorm(16), torch.nn.Linear(16, 1)).to(dtype)


def _grads(model, seed):
    g = torch.Generator().manual_seed(seed)
    for p in model.parameters():
        p.grad = torch.randn(p.shape, generator=g).to(p.dtype)


def _compiled_steps(make, dtype=torch.float32, steps=4, between=None):
    """Eager warm-up step (creates the state), then ``steps`` compiled steps."""
    model = _model(dtype)
    opt = make(model)
    _grads(model, 0)
    opt.step()
    cnt = CompileCounter()
    step = torch.compile(lambda: opt.step(), backend=cnt)
    for i in range(steps):
        _grads(model, i + 1)
        step()
        if between:
            between(opt, i)
    return model, opt, cnt


def _graph_breaks() -> int:
    return sum(counters["graph_break"].values())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("impl", IMPLS.values(), ids=IMPLS)
def test_compiled_step_has_no_graph_break_and_matches_eager(impl, dtype):
    if impl.get("fused") and dtype != torch.float32:
        pytest.skip("fused=True takes fp32 tensors only (a ConfigError otherwise, tested elsewhere)")
    _compiled_steps(lambda m: torch.optim.AdamW(m.parameters(), foreach=False), dtype)
    torch_breaks = _graph_breaks()  # torch's own optimizer: the baseline
    counters.clear()
    model, _, cnt = _compiled_steps(lambda m: Lion(m.parameters(), lr=1e-2, weight_decay=0.1, **impl), dtype)
    assert _graph_breaks() == 0 <= torch_breaks, dict(counters["graph_break"])
    assert cnt.frame_count == 1  # one graph, compiled once
    eager = _model(dtype)
    opt = Lion(eager.parameters(), lr=1e-2, weight_decay=0.1, **impl)
    for i in range(5):
        _grads(eager, i)
        opt.step()
    for a, b in zip(model.parameters(), eager.parameters()):
        torch.testing.assert_close(a, b, atol=1e-6 if dtype == torch.float32 else 1e-2, rtol=0)


def _scheduled(make, steps=6):
    """Compiled steps under a LambdaLR schedule: (lrs seen, graphs compiled after the
    first step, graphs compiled after all of them, graph breaks)."""
    torch._dynamo.reset()
    counters.clear()
    model = _model()
    opt = make(model)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0 / (1 + step))
    _grads(model, 0)
    opt.step()  # eager: creates the state
    cnt = CompileCounter()
    step = torch.compile(lambda: opt.step(), backend=cnt)
    lrs, first = [], None
    for i in range(steps):
        _grads(model, i + 1)
        step()
        first = cnt.frame_count if first is None else first
        sched.step()
        lrs.append(float(opt.param_groups[0]["lr"]))
    return lrs, first, cnt.frame_count, _graph_breaks()


def test_tensor_lr_schedule_does_not_recompile():
    model = _model()
    assert isinstance(Lion(model.parameters(), lr=torch.tensor(1e-2)).param_groups[0]["lr"], torch.Tensor)
    lrs, first, total, breaks = _scheduled(lambda m: Lion(m.parameters(), lr=torch.tensor(1e-2), weight_decay=0.1))
    assert lrs == pytest.approx([1e-2 / (2 + i) for i in range(6)])  # the schedule drove the tensor
    assert total == first  # no recompile as the lr changes
    # torch's own optimizer with a tensor lr, same harness: Lion has no more graphs or breaks
    # (the scheduler's step wrapper is skipped by dynamo: a break both have)
    _, torch_first, torch_total, torch_breaks = _scheduled(
        lambda m: torch.optim.AdamW(m.parameters(), lr=torch.tensor(1e-2), foreach=False))
    assert torch_total == torch_first
    assert total <= torch_total and breaks <= torch_breaks
    # a float lr recompiles (it is a constant in the graph): why tensor lrs matter
    _, float_first, float_total, _ = _scheduled(lambda m: Lion(m.parameters(), lr=1e-2))
    assert float_total > float_first


def test_tensor_lr_gives_the_float_lr_result_on_every_path():
    for impl in IMPLS.values():
        runs = []
        for lr in (1e-2, torch.tensor(1e-2)):
            model = _model()
            opt = Lion(model.parameters(), lr=lr, weight_decay=0.1, **impl)
            for i in range(3):
                _grads(model, i)
                opt.step()
            runs.append([p.detach().clone() for p in model.parameters()])
        for a, b in zip(*runs):
            torch.testing.assert_close(a, b, atol=1e-7, rtol=0)


def test_compiled_implementation_compiles_once_per_shapes_class(monkeypatch):
    cnt = CompileCounter()
    monkeypatch.setattr(functional, "_compiled", torch.compile(functional._update_one, dynamic=True, fullgraph=True,
                                                               backend=cnt))
    shapes = [(64, 48), (48,), (5, 3, 2), (7,), (1,), (1, 1)]
    gen = torch.Generator().manual_seed(0)
    ours = [torch.randn(s, generator=gen, requires_grad=True) for s in shapes]
    ref = [p.detach().clone().requires_grad_() for p in ours]
    opt = Lion(ours, lr=1e-2, weight_decay=0.1, compiled=True)
    eager = Lion(ref, lr=1e-2, weight_decay=0.1, fused=False, foreach=False)
    graphs = []
    for step in range(5):
        for group in (opt.param_groups[0], eager.param_groups[0]):
            group["lr"] = 1e-2 / (step + 1)  # a float schedule: the scalars go in as a tensor
        for a, b in zip(ours, ref):
            a.grad = torch.randn(a.shape, generator=gen)
            b.grad = a.grad.clone()
        opt.step(scale=2.0 ** step)  # a changing loss scale
        eager.step(scale=2.0 ** step)
        graphs.append(cnt.frame_count)
    assert graphs == graphs[:1] * 5, graphs
    # the first step compiles a graph per shapes class (flat views of 1-, 2- and 3-D
    # tensors, and numel 1, which dynamo specialises); the lr schedule and later steps add none
    assert cnt.frame_count <= 3
    for a, b in zip(ours, ref):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=0)


def test_compiled_implementation_is_one_of_the_exclusive_switches():
    from optcore import ConfigError

    with pytest.raises(ConfigError, match="compiled=True"):
        Lion([torch.zeros(2, requires_grad=True)], compiled=True, fused=True)

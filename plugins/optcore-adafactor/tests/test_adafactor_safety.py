"""Memory safety: the C kernel checks everything it touches, and state of
another shape is a clear error naming the parameter, never a crash."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from optcore import ConfigError, StepError
from optcore_adafactor import Adafactor, _cpu_kernel


@pytest.fixture(autouse=True)
def needs_kernel() -> None:
    if _cpu_kernel.load() is None:
        pytest.skip(f"C kernel unavailable: {_cpu_kernel.unavailable_reason}")


#: beta2t, inv_scale, eps1, eps2, rho, clip_threshold, beta1, weight_decay
SCALARS = (0.5, 1.0, 1e-30, 1e-3, 1e-2, 1.0, 0.9, 0.0)


def _step(param: torch.Tensor, grad: torch.Tensor, exp_avg: torch.Tensor | None, stats: tuple[torch.Tensor, ...]) -> None:
    """One step of one parameter through the C batch, every tensor checked strictly."""
    batch = _cpu_kernel.Batch.new()
    assert batch is not None
    batch.add(param, grad, exp_avg, stats, torch.zeros(()), SCALARS, strict=True)
    batch.run()


@pytest.mark.parametrize(
    ("row", "match"),
    [
        (torch.zeros(5), r"exp_avg_sq_row has shape \(5,\), expected \(64,\)"),  # would write past its end
        (torch.zeros(64, dtype=torch.float64), "float32"),
        (torch.zeros(128)[::2], "contiguous"),
        (torch.zeros(64, device="meta"), "CPU"),
    ],
)
def test_kernel_refuses_a_row_statistic_it_was_not_made_for(row: torch.Tensor, match: str) -> None:
    grad = torch.randn(64, 32)
    with pytest.raises(ValueError, match=match):
        _step(torch.randn(64, 32), grad, None, (row, torch.zeros(32)))


def test_kernel_refuses_fake_tensors() -> None:
    """A tensor without memory (as torch.compile traces with) never reaches C."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        grad, row = torch.randn(64, 32), torch.zeros(64)
    with pytest.raises(ValueError, match="is a FakeTensor, not a plain tensor"):
        _step(torch.randn(64, 32), grad, None, (row, torch.zeros(32)))


def test_kernel_does_not_run_while_compiling(monkeypatch: pytest.MonkeyPatch) -> None:
    batch = _cpu_kernel.Batch.new()
    assert batch is not None
    batch.add(torch.zeros(3, 4), torch.zeros(3, 4), None, (torch.zeros(3), torch.zeros(4)), None, SCALARS)
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    assert _cpu_kernel.Batch.new() is None
    with pytest.raises(RuntimeError, match="torch.compile"):
        batch.run()


class _Net(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.body = nn.Linear(16, width)
        self.head = nn.Linear(width, 4)


@pytest.mark.parametrize("beta1", [None, 0.9])
def test_state_from_a_differently_shaped_model_is_a_clear_error(beta1: float | None) -> None:
    """A checkpoint of a model with other widths (torch checks only the counts)
    is refused at load, by the shapes Adafactor declares (``state_shapes``),
    and the optimizer is left fresh."""
    saved_model, model = _Net(32), _Net(48)
    saved = Adafactor(list(saved_model.named_parameters()), beta1=beta1)
    for p in saved_model.parameters():
        p.grad = torch.randn_like(p)
    saved.step()
    opt = Adafactor(list(model.named_parameters()), beta1=beta1)
    with pytest.raises(ConfigError, match=r"parameter 0 .*shape \(48, 16\).*state '(exp_avg_sq_row|exp_avg)' has shape"):
        opt.load_state_dict(saved.state_dict())
    assert not opt.state
    for p in model.parameters():
        p.grad = torch.randn_like(p)
    opt.step()


def test_state_of_another_shape_is_refused_on_every_implementation() -> None:
    """At step time, the contract's StepError (as Lion's) for state of another shape."""
    for implementation in ("c", "torch", "compiled"):
        w = torch.randn(40, 24, requires_grad=True)
        opt = Adafactor([w], implementation=implementation)
        opt.state[w].update(step=3, exp_avg_sq_row=torch.zeros(4), exp_avg_sq_col=torch.zeros(24), RMS=torch.tensor(1.0))
        w.grad = torch.randn(40, 24)
        with pytest.raises(StepError, match=r"'exp_avg_sq_row' of parameter \(#0 .* has shape \(4,\), not \(40,\)"):
            opt.step()


@pytest.mark.parametrize(
    ("which", "bad", "match"),
    [
        ("row", torch.zeros(5), r"exp_avg_sq_row has shape \(5,\), expected \(64,\)"),
        ("col", torch.zeros(64), r"exp_avg_sq_col has shape \(64,\), expected \(32,\)"),
        ("exp_avg", torch.zeros(32, 64), r"exp_avg has shape \(32, 64\)"),
        ("grad", torch.randn(64, 64)[:, :32], "contiguous"),
    ],
)
def test_whole_step_kernel_refuses_every_mismatched_tensor(which: str, bad: torch.Tensor, match: str) -> None:
    args = {"param": torch.randn(64, 32), "grad": torch.randn(64, 32), "exp_avg": torch.zeros(64, 32),
            "row": torch.zeros(64), "col": torch.zeros(32)}
    args[which] = bad
    before = args["param"].clone()
    with pytest.raises(ValueError, match=match):
        _step(args["param"], args["grad"], args["exp_avg"], (args["row"], args["col"]))
    assert torch.equal(before, args["param"])


@pytest.mark.parametrize(
    ("which", "bad", "match"),
    [("exp_avg_sq", torch.zeros(5), r"exp_avg_sq has shape \(5,\), expected \(64,\)"),
     ("exp_avg", torch.zeros(65), r"exp_avg has shape \(65,\)"),
     ("grad", torch.zeros(64, dtype=torch.float64), "float32")],
)
def test_vector_step_kernel_refuses_every_mismatched_tensor(which: str, bad: torch.Tensor, match: str) -> None:
    args = {"param": torch.randn(64), "grad": torch.randn(64), "exp_avg": torch.zeros(64), "exp_avg_sq": torch.zeros(64)}
    args[which] = bad
    before = args["param"].clone()
    with pytest.raises(ValueError, match=match):
        _step(args["param"], args["grad"], args["exp_avg"], (args["exp_avg_sq"],))
    assert torch.equal(before, args["param"])

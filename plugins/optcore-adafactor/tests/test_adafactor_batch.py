"""The batched C step (one call per optimizer step): the same numbers as the
torch ops per tensor, whatever mix of shapes, dtypes and groups it is handed,
and no pointer reaches C unless its tensor holds the memory the loops touch."""

from __future__ import annotations

import ctypes

import pytest
import torch

from optcore import ConfigError, StepError
from optcore.kernels import pointer_problem
from optcore_adafactor import Adafactor, _cpu_kernel

#: fp32 matrices (tall, wide, rows not a multiple of the 4-row blocks), vectors
#: and a scalar go to the batch; bf16, a conv kernel and a transposed weight do not
BATCHED = [(40, 24), (7, 300), (301, 5), (24,), (1,), ()]
OTHERS = [((30, 20), torch.bfloat16), ((4, 3, 5, 6), torch.float32)]


@pytest.fixture(autouse=True)
def needs_kernel() -> None:
    if _cpu_kernel.load() is None:
        pytest.skip(f"C kernel unavailable: {_cpu_kernel.unavailable_reason}")


def _params(seed: int = 0) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    params = [torch.randn(s, generator=gen) for s in BATCHED]
    params += [torch.randn(s, generator=gen).to(dtype) for s, dtype in OTHERS]
    params.append(torch.randn(20, 30, generator=gen).t())  # non-contiguous fp32
    return [p.requires_grad_() for p in params]


def _groups(params: list[torch.Tensor], implementation: str) -> list[dict]:
    """Three groups with different modes, each holding batched and other tensors."""
    return [
        {"params": params[0::3], "beta1": 0.9, "weight_decay": 0.01},
        {"params": params[1::3], "scale_parameter": False, "warmup_init": True},
        {"params": params[2::3], "lr": 1e-2, "relative_step": False, "clip_threshold": 0.5, "decay_rate": -0.5},
    ], {"implementation": implementation}


def _run(implementation: str, steps: int = 12, scale: float = 1.0) -> tuple[list[torch.Tensor], Adafactor]:
    params = _params()
    groups, kw = _groups(params, implementation)
    opt = Adafactor(groups, **kw)
    gen = torch.Generator().manual_seed(1)
    for step in range(steps):
        for i, p in enumerate(params):
            g = torch.randn(p.shape, generator=gen) * (3.0 if i % 2 else 0.05) * scale
            if g.dim() >= 2 and step % 5 == 0:
                g[..., 0, :] = 0  # an all-zero row now and then
            p.grad = g.to(p.dtype)
        opt.step(scale=scale)
    return params, opt


def _assert_close(a: torch.Tensor, b: torch.Tensor, rtol: float) -> None:
    scale = b.detach().float().abs().max().clamp(min=1e-12)
    err = float((a.detach().float() - b.detach().float()).abs().max() / scale)
    assert err <= rtol, f"shape {tuple(a.shape)}: difference {err:.3g} of the tensor's scale > {rtol}"


@pytest.mark.parametrize("shared_min", [1 << 62, 0], ids=["whole tensors per thread", "rows split over threads"])
@pytest.mark.parametrize("scale", [1.0, 1024.0])
def test_batched_step_equals_the_torch_ops_per_tensor(monkeypatch: pytest.MonkeyPatch, shared_min: int, scale: float) -> None:
    monkeypatch.setattr(_cpu_kernel, "SHARED_MIN", shared_min)
    jobs: list[int] = []
    run = _cpu_kernel.Batch.run
    monkeypatch.setattr(_cpu_kernel.Batch, "run", lambda self, out=None: (jobs.append(len(self)), run(self, out)))
    fast, fast_opt = _run("auto", scale=scale)
    assert jobs == [len(BATCHED)] * 12  # one C call per step, for the fp32 matrices and vectors only
    slow, slow_opt = _run("torch", scale=scale)
    for a, b in zip(fast, slow):
        assert a.dtype == b.dtype and a.shape == b.shape
        _assert_close(a, b, 1e-6)
        sa, sb = fast_opt.state[a], slow_opt.state[b]
        assert sa.keys() == sb.keys() and sa["step"] == sb["step"] == 12
        for key in sa:
            if isinstance(sa[key], torch.Tensor):
                _assert_close(sa[key], sb[key], 1e-5)


def test_batched_results_do_not_depend_on_thread_timing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_cpu_kernel, "SHARED_MIN", 0)
    first, _ = _run("c", steps=5)
    again, _ = _run("c", steps=5)
    assert all(torch.equal(a, b) for a, b in zip(first, again))


def test_state_loaded_as_other_dtype_is_converted_not_handed_to_c() -> None:
    """State that arrives as float64 (a checkpoint) is cast once by the state
    set-up, so the batch still takes the parameter, and the numbers agree."""
    w = torch.randn(16, 8, requires_grad=True)
    w.grad = torch.randn(16, 8)
    opt = Adafactor([w])
    opt.state[w].update(step=2, exp_avg_sq_row=torch.full((16,), 0.5, dtype=torch.float64),
                        exp_avg_sq_col=torch.full((8,), 0.5, dtype=torch.float64), RMS=1.0)
    opt.step()
    assert all(v.dtype == torch.float32 for v in opt.state[w].values() if isinstance(v, torch.Tensor))
    assert opt.state[w]["step"] == 3


@pytest.mark.parametrize("which", ["param", "grad", "exp_avg_sq_row", "exp_avg_sq"])
def test_freed_storage_is_refused_before_anything_is_stepped(which: str) -> None:
    """A tensor whose storage was freed (FSDP does resize_(0)) keeps its shape
    but has no memory: the step raises before any parameter, C or torch, moves."""
    matrix, vector = torch.randn(64, 32, requires_grad=True), torch.randn(32, requires_grad=True)
    other = torch.randn(8, 8, dtype=torch.bfloat16, requires_grad=True)  # a torch-path parameter
    opt = Adafactor([matrix, vector, other])
    for p in (matrix, vector, other):
        p.grad = torch.randn_like(p)
    opt.step()
    before = [p.detach().clone() for p in (vector, other)]
    row_before = opt.state[matrix]["exp_avg_sq_row"].clone()
    freed = {
        "param": matrix, "grad": matrix.grad, "exp_avg_sq_row": opt.state[matrix]["exp_avg_sq_row"],
        "exp_avg_sq": opt.state[vector]["exp_avg_sq"],
    }[which]
    freed.untyped_storage().resize_(0)
    freed_error = r"parameter \(#[01] of param group 0, .*has no allocated storage of its size \(freed"
    with pytest.raises(StepError, match=freed_error):
        opt.step()
    assert all(torch.equal(a, b) for a, b in zip(before, (vector, other)))
    assert all(opt.state[p]["step"] == 1 for p in (matrix, vector, other))
    if which != "exp_avg_sq_row":
        assert torch.equal(opt.state[matrix]["exp_avg_sq_row"], row_before)


def _candidates() -> list[torch.Tensor]:
    """Tensors of shape (4, 6) (or views reporting it) that C may or may not take."""
    base = torch.randn(4, 6)
    freed = torch.randn(4, 6)
    freed.untyped_storage().resize_(0)
    short = torch.randn(30)
    view = short[6:30].view(4, 6)
    short.untyped_storage().resize_(60)  # 15 floats left, the view needs 30

    class Sub(torch.Tensor):
        pass

    return [
        base, base.clone().requires_grad_(), torch.nn.Parameter(base.clone()), base.double(), base.half(),
        torch.randn(6, 4).t(), torch.randn(4, 12)[:, ::2], torch._neg_view(base), base.as_subclass(Sub),
        torch.empty(4, 6, device="meta"), freed, view, torch.randn(8, 6)[4:],
    ]


def test_pointer_check_refuses_whatever_the_core_helper_refuses() -> None:
    """_pointer is the cheap form of optcore.kernels.pointer_problem (plus the
    shape): it hands over a pointer only where the helper sees no problem."""
    for t in _candidates():
        problem = pointer_problem(t, torch.float32)
        try:
            ptr = _cpu_kernel._pointer("t", t, (4, 6))
        except ValueError as exc:
            assert problem is not None and problem in str(exc)
            continue
        if problem is not None:
            assert ptr is None, f"{problem}: yet a pointer was handed over"
        else:
            assert ptr == t.data_ptr()
    assert _cpu_kernel._pointer("t", torch.randn(4, 6), (6, 4)) is None  # the shape is part of the check
    assert _cpu_kernel._pointer("t", torch.randn(0, 6), (0, 6)) is None  # nothing to step


def test_batch_refuses_mismatched_state_strictly_and_falls_back_otherwise() -> None:
    w, g = torch.randn(8, 4), torch.randn(8, 4)
    row, col = torch.zeros(8), torch.zeros(4, dtype=torch.float64)
    scalars = (0.5, 1.0, 1e-30, 1e-3, 1e-2, 1.0, 0.0, 0.0)
    batch = _cpu_kernel.Batch.new()
    assert batch is not None
    assert not batch.add(w, g, None, (row, col), None, scalars) and len(batch) == 0
    with pytest.raises(ValueError, match=r"exp_avg_sq_col is torch.float64, not torch.float32"):
        batch.add(w, g, None, (row, col), None, scalars, strict=True)
    assert batch.add(w, g, None, (row, col.float()), None, scalars) and len(batch) == 1


def _stepped(beta1: float | None = None) -> tuple[torch.Tensor, torch.Tensor, Adafactor]:
    """A matrix, a vector, and an optimizer that has stepped both once in C."""
    matrix, vector = torch.randn(16, 8, requires_grad=True), torch.randn(8, requires_grad=True)
    opt = Adafactor([matrix, vector], beta1=beta1)
    for p in (matrix, vector):
        p.grad = torch.randn_like(p)
    opt.step()
    return matrix, vector, opt


def test_every_tensor_of_every_parameter_is_checked_every_step(monkeypatch: pytest.MonkeyPatch) -> None:
    """No step trusts what an earlier one checked: each hands every tensor of
    a batched parameter (param, grad, statistics, RMS) through the kernel's
    pointer check, and a torch-path parameter through the optimizer's check."""
    matrix, vector, opt = _stepped()
    other = torch.randn(6, 4, dtype=torch.bfloat16, requires_grad=True)
    opt.add_param_group({"params": [other]})
    other.grad = torch.randn_like(other)
    pointed: list[torch.Tensor] = []
    pointer = _cpu_kernel._pointer
    monkeypatch.setattr(_cpu_kernel, "_pointer", lambda name, t, shape: (pointed.append(t), pointer(name, t, shape))[1])
    checked: list[torch.Tensor] = []
    check = Adafactor._check
    monkeypatch.setattr(Adafactor, "_check", lambda self, group, p: (checked.append(p), check(self, group, p))[1])
    for step in range(2):
        pointed.clear()
        opt.step()
        for p in (matrix, vector):
            state = opt.state[p]
            stats = ("exp_avg_sq_row", "exp_avg_sq_col") if p.dim() == 2 else ("exp_avg_sq",)
            for t in (p, p.grad, *(state[k] for k in stats), state["RMS"]):
                assert any(q is t for q in pointed)
    assert [p is other for p in checked] == [True, True]
    assert all(opt.state[p]["step"] == s for p, s in ((matrix, 3), (vector, 3), (other, 2)))


@pytest.mark.parametrize(
    "change",
    ["replaced, wrong shape", "resized in place", "loaded from another model", "storage freed", "param reshaped"],
)
def test_state_changed_between_steps_is_checked_again(change: str) -> None:
    """Whatever happened to the state since the loops took it, the step sees
    it: a replaced or resized tensor, a checkpoint of another model, freed
    memory. The error is the one a first step gives, and nothing moves."""
    matrix, vector, opt = _stepped()
    state = opt.state[matrix]
    if change == "replaced, wrong shape":
        state["exp_avg_sq_row"] = torch.zeros(4)
        error, match = StepError, r"'exp_avg_sq_row' of parameter \(#0 .* has shape \(4,\), not \(16,\)"
    elif change == "resized in place":
        state["exp_avg_sq_col"].resize_(3)
        error, match = StepError, r"'exp_avg_sq_col' of parameter \(#0 .* has shape \(3,\), not \(8,\)"
    elif change == "loaded from another model":
        other, _, other_opt = _stepped()
        saved = other_opt.state_dict()
        saved["state"][0]["exp_avg_sq_row"] = torch.zeros(5)
        with pytest.raises(ConfigError, match=r"'exp_avg_sq_row' has shape \(5,\), expected \(16,\)"):
            opt.load_state_dict(saved)  # refused at load; put in by hand, the step still sees it
        state.update(saved["state"][0])
        error, match = StepError, r"has shape \(5,\), not \(16,\).*belongs to another model"
    elif change == "param reshaped":  # the state is untouched, but the loops would take p's new sizes
        matrix.data = torch.randn(64, 8)
        error, match = StepError, r"'exp_avg_sq_row' of parameter \(#0 .* has shape \(16,\), not \(64,\)"
    else:
        state["exp_avg_sq_row"].untyped_storage().resize_(0)
        error, match = StepError, r"parameter \(#0 of param group 0, .*has no allocated storage of its size \(freed"
    for p in (matrix, vector):
        p.grad = torch.randn_like(p)
    before = [p.detach().clone() for p in (matrix, vector)]
    with pytest.raises(error, match=match):
        opt.step()
    assert all(torch.equal(a, p) for a, p in zip(before, (matrix, vector)))


def _stepped_with_a_torch_twin() -> tuple[tuple, tuple]:
    """Two copies of :func:`_stepped` (same seed): the loops' and, as the reference, the functional update's."""
    torch.manual_seed(0)
    ours = _stepped()
    torch.manual_seed(0)
    twin = _stepped()
    for group in twin[2].param_groups:
        group["implementation"] = "torch"
    return ours, twin


def test_a_new_gradient_the_loops_cannot_take_is_checked_or_stepped_by_torch() -> None:
    """The gradient is new every step: a sparse one gets the first step's
    error, a non-contiguous one the functional update, same numbers."""
    (matrix, vector, opt), (twin, twin_vector, twin_opt) = _stepped_with_a_torch_twin()
    matrix.grad = torch.randn(16, 8).to_sparse()
    with pytest.raises(StepError, match="is sparse"):
        opt.step()
    grad = torch.randn(8, 16).t()  # non-contiguous: the torch path takes it
    matrix.grad, twin.grad = grad, grad.clone()
    vector.grad = twin_vector.grad = None
    opt.step()
    twin_opt.step()
    assert opt.state[matrix]["step"] == 2
    _assert_close(matrix, twin, 1e-6)


def test_a_gradient_that_is_the_parameter_is_stepped_by_torch_not_the_loops() -> None:
    """The loops read their tensors as ``restrict``; ``p.grad = p.detach()``
    (allowed by torch) goes to the functional update, with its numbers, and
    the batch itself refuses tensors that share memory, naming them."""
    (matrix, vector, opt), (twin, twin_vector, twin_opt) = _stepped_with_a_torch_twin()
    for _ in range(2):
        for p in (matrix, vector, twin, twin_vector):
            p.grad = p.detach()
        opt.step()
        twin_opt.step()
    _assert_close(matrix, twin, 1e-6)
    _assert_close(vector, twin_vector, 1e-6)
    w = torch.randn(6, 4)
    batch = _cpu_kernel.Batch.new()
    stats = (torch.zeros(6), torch.zeros(4))
    scalars = (0.5, 1.0, 1e-30, 1e-3, 1e-2, 1.0, 0.0, 0.0)
    assert not batch.add(w, w, None, stats, None, scalars) and len(batch) == 0
    with pytest.raises(ValueError, match="its param and grad share memory"):
        batch.add(w, w, None, stats, None, scalars, strict=True)
    buf = torch.zeros(24)  # a gradient over the row statistic's memory
    with pytest.raises(ValueError, match="its grad and exp_avg_sq_row share memory"):
        batch.add(w, buf.view(6, 4), None, (buf[:6], stats[1]), None, scalars, strict=True)
    assert batch.add(w, buf.view(6, 4), None, stats, None, scalars) and len(batch) == 1  # apart: taken


def test_switching_on_a_first_moment_after_a_step_creates_its_state() -> None:
    matrix, vector, opt = _stepped()
    opt.param_groups[0]["beta1"] = 0.9
    for p in (matrix, vector):
        p.grad = torch.randn_like(p)
    opt.step()
    assert opt.state[matrix]["exp_avg"].shape == matrix.shape and opt.state[matrix]["exp_avg"].abs().sum() > 0


def _memo(opt: Adafactor, p: torch.Tensor) -> tuple[float, float]:
    """(sum x^2 the loops wrote last step, whether they found x changed)."""
    memo = opt._memo[id(p)]
    return memo[0], memo[1]


@pytest.mark.parametrize("shared_min", [1 << 62, 0], ids=["whole", "rows split"])
def test_rms_of_x_comes_from_the_last_write_once_known(monkeypatch: pytest.MonkeyPatch, shared_min: int) -> None:
    """From the second step on, pass 1 takes sum x^2 from what pass 2 wrote
    (so it does not read x), and the check in pass 2 finds it exact."""
    monkeypatch.setattr(_cpu_kernel, "SHARED_MIN", shared_min)
    read_x: list[list[float]] = []  # per step, per job (matrix, vector): whether pass 1 read x
    run = _cpu_kernel.Batch.run

    def recorded(self: _cpu_kernel.Batch, out: object = None) -> None:
        out = (ctypes.c_double * (4 * len(self)))()
        run(self, out)
        read_x.append(list(out[3::4]))

    monkeypatch.setattr(_cpu_kernel.Batch, "run", recorded)
    matrix, vector, opt = _stepped()
    for _ in range(3):
        matrix.grad, vector.grad = torch.randn_like(matrix), torch.randn_like(vector)
        opt.step()
        written, changed = _memo(opt, matrix)
        assert changed == 0.0 and written == pytest.approx(float(matrix.detach().double().pow(2).sum()), rel=1e-6)
    assert read_x == [[1.0, 1.0]] + [[0.0, 1.0]] * 3
    assert id(vector) not in opt._memo  # vectors: one pass reads everything anyway


@pytest.mark.parametrize("shared_min", [1 << 62, 0], ids=["whole", "rows split"])
def test_without_scale_parameter_pass_1_never_reads_x_and_rms_is_still_stored(
    monkeypatch: pytest.MonkeyPatch, shared_min: int
) -> None:
    """scale_parameter=False: the step size does not depend on RMS(x), so pass 1
    reads only g, and pass 2 adds up RMS(x) of the x it reads to store it as
    Hugging Face does (the state of each step: RMS of x before it)."""
    monkeypatch.setattr(_cpu_kernel, "SHARED_MIN", shared_min)
    read_x: list[float] = []
    run = _cpu_kernel.Batch.run

    def recorded(self: _cpu_kernel.Batch, out: object = None) -> None:
        out = (ctypes.c_double * (4 * len(self)))()
        run(self, out)
        read_x.append(out[3])

    monkeypatch.setattr(_cpu_kernel.Batch, "run", recorded)
    gen = torch.Generator().manual_seed(3)
    p = torch.randn(37, 64, generator=gen).requires_grad_()
    opt = Adafactor([p], lr=1e-2, relative_step=False, scale_parameter=False, beta1=0.9, weight_decay=0.1)
    for _ in range(3):
        p.grad = torch.randn(p.shape, generator=gen)
        before = float(p.detach().double().pow(2).mean().sqrt())
        opt.step()
        assert float(opt.state[p]["RMS"]) == pytest.approx(before, rel=1e-6)
    assert read_x == [0.0] * 3 and id(p) not in opt._memo  # nothing to remember between steps


CHANGES = {
    "scaled through .data": lambda p: p.data.mul_(3.0),
    "copied over through .data": lambda p: p.data.copy_(torch.randn_like(p)),
    "signs flipped (same RMS)": lambda p: p.data.neg_(),
    "one element nudged": lambda p: p.data.view(-1)[5].add_(1e-3),
    "data replaced, same shape": lambda p: setattr(p, "data", p.data * 0.5),
}


@pytest.mark.parametrize("change", list(CHANGES))
@pytest.mark.parametrize("shared_min", [1 << 62, 0], ids=["whole", "rows split"])
@pytest.mark.parametrize("beta1, weight_decay", [(None, 0.0), (0.9, 0.1)], ids=["plain", "momentum+decay"])
def test_x_changed_between_steps_gets_the_step_its_own_rms_gives(
    monkeypatch: pytest.MonkeyPatch, change: str, shared_min: int, beta1: float | None, weight_decay: float
) -> None:
    """A change no version counter sees (``.data``) between steps: the step
    is the torch path's for the x it finds (the fix-up pass, when the check in
    pass 2 fails), and the loops read x in pass 1 until a check passes again."""
    monkeypatch.setattr(_cpu_kernel, "SHARED_MIN", shared_min)
    pairs = []
    for implementation in ("c", "torch"):
        w = torch.randn(37, 24, generator=torch.Generator().manual_seed(3)).requires_grad_()
        pairs.append((w, Adafactor([w], beta1=beta1, weight_decay=weight_decay, implementation=implementation)))
    (w, opt), (ref, ref_opt) = pairs
    gen = torch.Generator().manual_seed(4)
    for step in range(8):
        g = torch.randn(37, 24, generator=gen)
        if step in (3, 4):  # twice in a row: a failed check, then a step that reads x and finds it changed
            torch.manual_seed(step)
            CHANGES[change](w)
            torch.manual_seed(step)
            CHANGES[change](ref)
        w.grad, ref.grad = g.clone(), g.clone()
        opt.step()
        ref_opt.step()
        _assert_close(w, ref, 1e-6)
        assert opt.state[w]["RMS"] == pytest.approx(float(ref_opt.state[ref]["RMS"]), rel=1e-6)
        if step in (3, 4) and change != "signs flipped (same RMS)":
            assert _memo(opt, w)[1] == 1.0
    assert _memo(opt, w)[1] == 0.0  # unchanged since: the last write is trusted again

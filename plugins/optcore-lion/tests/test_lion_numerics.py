"""Lion's numbers: against lion-pytorch, and every implementation against the others."""

from __future__ import annotations

import pytest
import torch
from optcore_lion import Lion, _cpu_kernel

lion_pytorch = pytest.importorskip("lion_pytorch")

IMPLS = {
    "default": {},
    "foreach": {"foreach": True},
    "forloop": {"foreach": False, "fused": False},
    "fused": {"fused": True},
    "compiled": {"compiled": True},  # torch.compile (inductor): slow to compile the first time
}
SHAPES = [(64, 48), (48,), (5, 3, 2), (1,)]


def _groups(seed: int = 0, dtype: torch.dtype = torch.float32) -> list[dict]:
    """Three param groups with their own lr / weight decay."""
    gen = torch.Generator().manual_seed(seed)
    tensors = [torch.randn(s, generator=gen, dtype=dtype).requires_grad_() for s in SHAPES]
    return [
        {"params": tensors[:2]},
        {"params": [tensors[2]], "lr": 3e-3, "weight_decay": 0.5},
        {"params": [tensors[3]], "lr": 1e-4, "weight_decay": 0.0},
    ]


def _run(make, steps: int, seed: int = 0, grad_seed: int = 1, dtype=torch.float32, **step_kwargs):
    groups = _groups(seed, dtype)
    opt = make(groups)
    gen = torch.Generator().manual_seed(grad_seed)
    params = [p for g in groups for p in g["params"]]
    for _ in range(steps):
        for p in params:
            p.grad = torch.randn(p.shape, generator=gen, dtype=dtype)
        opt.step(**step_kwargs)
    return [p.detach() for p in params], opt


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("weight_decay", [0.0, 0.1])
def test_lion_matches_lion_pytorch_for_100_steps(impl, weight_decay):
    ref, _ = _run(lambda gs: lion_pytorch.Lion(gs, lr=1e-3, weight_decay=weight_decay), 100)
    ours, _ = _run(lambda gs: Lion(gs, lr=1e-3, weight_decay=weight_decay, **IMPLS[impl]), 100)
    for a, b in zip(ref, ours):
        torch.testing.assert_close(b, a, atol=1e-6, rtol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("maximize", [False, True])
def test_lion_foreach_forloop_and_kernel_agree(dtype, maximize):
    runs = {
        name: _run(lambda gs, kw=kw: Lion(gs, lr=1e-2, weight_decay=0.1, maximize=maximize, **kw), 20,
                   dtype=dtype, scale=3.0)[0]
        for name, kw in IMPLS.items()
        if not (name == "fused" and dtype == torch.float64)
    }
    for name, params in runs.items():
        for a, b in zip(runs["forloop"], params):
            torch.testing.assert_close(b, a, atol=1e-6, rtol=0, msg=f"{name} differs from forloop")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_lion_chunked_cpu_path_covers_tensors_larger_than_a_chunk(dtype):
    """The pieces (a tensor split in three, the last short; small tensors sharing a
    piece; a non-contiguous one whole; fp32 beside fp16/bf16) step as the batches do."""
    n = 2 * (1 << 18) + 123
    results = []
    for kw in (IMPLS["forloop"], IMPLS["foreach"]):
        gen = torch.Generator().manual_seed(1)
        params = [torch.linspace(-1, 1, n).to(dtype), torch.randn(7, generator=gen).to(dtype),
                  torch.randn(30, 20, generator=gen).to(dtype).t(), torch.randn(5, generator=gen)]
        params = [p.requires_grad_() for p in params]
        opt = Lion(params, lr=1e-2, weight_decay=0.1, **kw)
        gen = torch.Generator().manual_seed(0)
        for _ in range(3):
            for p in params:
                p.grad = torch.randn(p.shape, generator=gen).to(dtype=p.dtype)
            opt.step(scale=2.0)
        results.append([(p.detach().clone(), opt.state[p]["exp_avg"].clone()) for p in params])
    torch.testing.assert_close(results[0], results[1], atol=0, rtol=0)


def test_lion_kernel_is_built_once_and_cached():
    assert _cpu_kernel.load() is not None, _cpu_kernel.unavailable_reason
    assert _cpu_kernel.load() is _cpu_kernel.load()
    assert list(__import__("optcore.kernels").kernels.cache_dir().glob("lion_fp32_*.so"))


def test_lion_without_a_compiler_falls_back_to_the_eager_path(monkeypatch, tmp_path):
    from optcore import StepError

    expected, _ = _run(lambda gs: Lion(gs, lr=1e-2, **IMPLS["forloop"]), 5)
    monkeypatch.setenv("CC", str(tmp_path / "no-such-compiler"))
    monkeypatch.setenv("OPTCORE_CACHE_DIR", str(tmp_path))
    _cpu_kernel.load.cache_clear()
    try:
        assert _cpu_kernel.load() is None and "no-such-compiler" in _cpu_kernel.unavailable_reason
        got, _ = _run(lambda gs: Lion(gs, lr=1e-2), 5)  # default: kernel where it applies
        for a, b in zip(expected, got):
            torch.testing.assert_close(b, a, atol=0, rtol=0)
        with pytest.raises(StepError, match="could not be built"):
            _run(lambda gs: Lion(gs, lr=1e-2, fused=True), 1)
    finally:
        _cpu_kernel.load.cache_clear()


def test_lion_kernel_steps_bit_for_bit_whatever_the_threads_and_the_slicing():
    """Each thread takes a 16-element-aligned slice of every tensor: every size
    (0, 1, 15-17, more threads than elements, the AVX remainders) steps exactly
    as one thread steps it, and a flat tensor exactly as its pieces."""
    import ctypes

    lib = _cpu_kernel.load()
    assert lib is not None, _cpu_kernel.unavailable_reason
    gen = torch.Generator().manual_seed(0)
    sizes = [0, 1, 2, 15, 16, 17, 31, 33, 47, 63, 65, 255, 4097, 65537]
    p0, g, m0 = ([torch.randn(n, generator=gen) for n in sizes] for _ in range(3))

    def steps(ps, gs, ms, threads):
        n = len(ps)
        ptrs = [(ctypes.c_void_p * n)(*[t.data_ptr() for t in ts]) for ts in (ps, gs, ms)]
        for _ in range(3):
            lib.lion_fp32(n, *ptrs, (ctypes.c_int64 * n)(*[t.numel() for t in ps]), 1e-2, 1 - 1e-3, 0.9, 0.1, 0.99,
                          0.01, threads)  # fmt: skip
        return torch.cat(ps), torch.cat(ms)

    one = steps([t.clone() for t in p0], g, [t.clone() for t in m0], 1)
    for threads in (2, 3, 4, 40):
        many = steps([t.clone() for t in p0], g, [t.clone() for t in m0], threads)
        assert torch.equal(many[0], one[0]) and torch.equal(many[1], one[1]), threads
    flat = steps([torch.cat(p0)], [torch.cat(g)], [torch.cat(m0)], 3)
    assert torch.equal(flat[0], one[0]) and torch.equal(flat[1], one[1])

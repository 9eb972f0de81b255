"""The optional C loops: built on first use, switched off on request, and a
missing or broken compiler only means the torch path runs."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from optcore.kernels import KernelUnavailableWarning, _compile
from optcore_adafactor import Adafactor, _cpu_kernel


@pytest.fixture
def fresh_loader(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A clean load() cache before and after (it is memoised per process)."""
    _cpu_kernel.load.cache_clear()
    yield
    monkeypatch.undo()
    _cpu_kernel.load.cache_clear()


def _steps_ok() -> None:
    w = torch.randn(16, 8, requires_grad=True)
    w.grad = torch.randn(16, 8)
    before = w.detach().clone()
    Adafactor([w]).step()
    assert not torch.equal(before, w)


def test_kernel_can_be_switched_off(monkeypatch: pytest.MonkeyPatch, fresh_loader: None) -> None:
    monkeypatch.setenv("OPTCORE_ADAFACTOR_KERNEL", "0")
    assert _cpu_kernel.load() is None
    assert "OPTCORE_ADAFACTOR_KERNEL=0" in (_cpu_kernel.unavailable_reason or "")
    assert not _cpu_kernel.eligible(torch.zeros(2, 2))
    _steps_ok()


def test_broken_compiler_falls_back(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, fresh_loader: None) -> None:
    """One warning says why; the steps then run the torch path without another."""
    monkeypatch.setenv("CC", "false")  # a "compiler" that always fails
    monkeypatch.setenv("OPTCORE_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(_compile, "_warned", set())
    with pytest.warns(KernelUnavailableWarning, match="'adafactor_fp32' is unavailable.*torch path") as record:
        assert _cpu_kernel.load() is None
    assert len(record) == 1
    assert "false" in (_cpu_kernel.unavailable_reason or "")
    _cpu_kernel.load.cache_clear()  # asked again in this process: it tries again, and does not warn again
    with warnings.catch_warnings():
        warnings.simplefilter("error", KernelUnavailableWarning)
        _steps_ok()


def test_only_fp32_contiguous_cpu_matrices_are_eligible() -> None:
    if _cpu_kernel.load() is None:
        pytest.skip(f"C kernel unavailable: {_cpu_kernel.unavailable_reason}")
    assert _cpu_kernel.eligible(torch.zeros(3, 4), None)
    assert not _cpu_kernel.eligible(torch.zeros(4, 3).t())
    assert not _cpu_kernel.eligible(torch.zeros(3, 4, dtype=torch.bfloat16))
    assert not _cpu_kernel.eligible(torch.zeros(12))
    assert not _cpu_kernel.eligible(torch.zeros(2, 3, 4))


def test_kernel_results_do_not_depend_on_thread_timing() -> None:
    if _cpu_kernel.load() is None:
        pytest.skip(f"C kernel unavailable: {_cpu_kernel.unavailable_reason}")
    g = torch.randn(999, 37, generator=torch.Generator().manual_seed(0))
    results = []
    for _ in range(3):
        row = torch.ones(999)
        results.append((*_cpu_kernel.stats_(g, row, beta=0.5, a=0.1, b=1e-30), row))
    for other in results[1:]:
        assert all(torch.equal(x, y) for x, y in zip(results[0], other))

"""The optional C loops: built on first use, switched off on request, and a
missing or broken compiler only means the functional update runs."""

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
    assert _cpu_kernel.Batch.new() is None
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


SCALARS = (0.5, 1.0, 1e-30, 1e-3, 1e-2, 1.0, 0.0, 0.0)


def _takes(param: torch.Tensor) -> bool:
    """Whether the batch takes ``param`` (with fp32 state of the right shapes)."""
    batch = _cpu_kernel.Batch.new()
    assert batch is not None
    stats = (torch.zeros(param.shape[0]), torch.zeros(param.shape[1])) if param.dim() == 2 else (torch.zeros(param.shape),)
    return batch.add(param, torch.zeros_like(param), None, stats, None, SCALARS)


def test_only_fp32_contiguous_cpu_matrices_and_vectors_are_taken() -> None:
    if _cpu_kernel.load() is None:
        pytest.skip(f"C kernel unavailable: {_cpu_kernel.unavailable_reason}")
    assert _takes(torch.zeros(3, 4)) and _takes(torch.zeros(12)) and _takes(torch.zeros(()))
    assert not _takes(torch.zeros(4, 3).t())
    assert not _takes(torch.zeros(3, 4, dtype=torch.bfloat16))
    assert not _takes(torch.zeros(3, 4, dtype=torch.float64))
    batch = _cpu_kernel.Batch.new()
    assert batch is not None and not batch.add(torch.zeros(2, 3, 4), torch.zeros(2, 3, 4), None, (torch.zeros(2, 3), torch.zeros(2, 4)), None, SCALARS)

"""The one-pass CPU kernel: fp16 -> fp32 times a scale, with the inf/NaN flag."""

from __future__ import annotations

import pytest
import torch
from optcore_fp16 import _cpu_kernel

pytestmark = pytest.mark.skipif(_cpu_kernel.load() is None, reason=f"no kernel: {_cpu_kernel.unavailable_reason}")


def every_half() -> torch.Tensor:
    """All 65536 fp16 bit patterns: zeros, subnormals, normals, infs, NaNs."""
    return torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16).view(torch.float16)


@pytest.mark.parametrize("start", [0, 3])  # also an odd start and a ragged tail
def test_converts_every_half_exactly(start: int) -> None:
    src = every_half()[start:].contiguous()
    out = torch.empty(src.numel())
    assert _cpu_kernel.half_to_float_scaled_([src], [out], 1.0)  # the infs and NaNs are seen
    ref = src.float()
    nan = torch.isnan(ref)
    assert torch.equal(torch.isnan(out), nan)
    assert torch.equal(out[~nan].view(torch.int32), ref[~nan].view(torch.int32))


def test_scales_and_flags_only_non_finite_values() -> None:
    srcs = [torch.randn(n).half() for n in (1, 7, 8, 100_003)]
    dsts = [torch.empty(s.numel()) for s in srcs]
    assert not _cpu_kernel.half_to_float_scaled_(srcs, dsts, 1 / 128)
    assert all(torch.equal(d, s.float() / 128) for s, d in zip(srcs, dsts))
    for value in (float("inf"), float("-inf"), float("nan")):
        poisoned = [s.clone() for s in srcs]
        poisoned[3][100_001] = value
        assert _cpu_kernel.half_to_float_scaled_(poisoned, dsts, 1.0)


def test_eligibility() -> None:
    half, full = torch.zeros(4).half(), torch.zeros(4)
    assert _cpu_kernel.eligible([half], [full])
    assert not _cpu_kernel.eligible([None], [full])
    assert not _cpu_kernel.eligible([half.bfloat16()], [full])
    assert not _cpu_kernel.eligible([torch.zeros(4, 2).half().t()], [torch.zeros(8)])


def _bad_pair(kind: str) -> tuple[torch.Tensor, torch.Tensor]:
    src, dst = torch.ones(8).half(), torch.zeros(8)
    if kind == "short destination":
        dst = torch.zeros(4)
    elif kind == "long destination":
        dst = torch.zeros(16)
    elif kind == "bf16 source":
        src = src.bfloat16()
    elif kind == "fp64 destination":
        dst = dst.double()
    elif kind == "strided destination":
        dst = torch.zeros(16)[::2]
    elif kind == "no storage":
        dst.untyped_storage().resize_(0)
    elif kind == "meta source":
        src = torch.ones(8, dtype=torch.float16, device="meta")
    return src, dst


@pytest.mark.parametrize(
    "kind",
    ["short destination", "long destination", "bf16 source", "fp64 destination", "strided destination",
     "no storage", "meta source"],
)
def test_kernel_checks_every_pair_before_running(kind: str) -> None:
    src, dst = _bad_pair(kind)
    with pytest.raises(ValueError, match="fp16 gradient kernel: .*pair 0"):
        _cpu_kernel.half_to_float_scaled_([src], [dst], 1.0)
    assert not _cpu_kernel.eligible([src], [dst])
    if dst.untyped_storage().nbytes():
        assert torch.equal(dst, torch.zeros_like(dst))  # not written
    with pytest.raises(ValueError, match="2 sources but 1 destinations"):
        _cpu_kernel.half_to_float_scaled_([src, src], [dst], 1.0)

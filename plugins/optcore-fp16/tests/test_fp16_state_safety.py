"""A checkpoint of another model: FP16Optimizer's fp32 master state is checked
against this model's before anything is loaded (no corrupted masters)."""

from __future__ import annotations

import pytest
import torch
from fp16_helpers import HalfSGD, ShapedSGD
from optcore_fp16 import FP16Optimizer, MemoryEfficientFP16Optimizer
from torch import nn

from optcore import ConfigError


def _stepped(size: int, inner: type, wrapper: type = FP16Optimizer) -> tuple[nn.Module, FP16Optimizer]:
    model = nn.Linear(size, size).half()
    opt = wrapper(inner(model.parameters(), lr=1e-2))
    opt.backward(model(torch.randn(2, size).half()).float().sum())
    opt.step()
    return model, opt


@pytest.mark.parametrize(("inner", "what"), [(HalfSGD, "flat fp32 buffer #0"), (ShapedSGD, r"parameter \(#0")])
@pytest.mark.parametrize(("saved", "loaded"), [(32, 64), (64, 32)], ids=["smaller->larger", "larger->smaller"])
def test_master_state_of_another_model_is_refused_before_loading(inner, what, saved, loaded) -> None:
    _, old = _stepped(saved, inner)
    model, opt = _stepped(loaded, inner)
    masters = [t.detach().clone() for m in opt._masters for t in m.tensors]
    inner_state = [v.clone() for s in opt.state.values() for v in s.values()]
    with pytest.raises(ConfigError, match=rf"{what}.*another model"):
        opt.load_state_dict(old.state_dict())
    assert all(torch.equal(a, t) for a, t in zip(masters, (t for m in opt._masters for t in m.tensors)))
    assert all(torch.equal(v, w) for v, w in zip((v for s in opt.state.values() for v in s.values()), inner_state))
    opt.backward(model(torch.randn(2, loaded).half()).float().sum())
    opt.step()  # still usable


def test_memory_efficient_wrapper_passes_state_errors_of_the_inner_optimizer_through() -> None:
    class CheckingSGD(HalfSGD):
        def load_state_dict(self, sd, optimizer_overrides=None):
            for p, (pid, s) in zip(self.param_groups[0]["params"], sd["state"].items()):
                if s["momentum_buffer"].shape != p.shape:
                    raise ConfigError(f"momentum of parameter #{pid} has shape {tuple(s['momentum_buffer'].shape)}")
            super().load_state_dict(sd, optimizer_overrides)

    _, old = _stepped(32, CheckingSGD, MemoryEfficientFP16Optimizer)
    _, opt = _stepped(64, CheckingSGD, MemoryEfficientFP16Optimizer)
    with pytest.raises(ConfigError, match=r"momentum of parameter #0 has shape \(32, 32\)"):
        opt.load_state_dict(old.state_dict())

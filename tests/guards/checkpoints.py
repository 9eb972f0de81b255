"""The optimizers optcore builds, each with a saved state dict, for the crafted
checkpoint tests (test_checkpoint_refusals.py, test_fuzz_state_dict.py).

The list comes from the registry: every ``torch.optim`` class optcore builds
(with its record of test inputs from ``optcore.testing``), every optimizer of
optcore's own plugins, each precision wrapper around an inner optimizer, and
the Muon+AdamW composite. ``Case.saved()`` is a state dict after two steps;
``Case.fresh()`` another optimizer over an equal model, stepped once with
other data, so a refused load has state and parameters to leave alone.
"""

from __future__ import annotations

import copy
import math
import warnings
from dataclasses import dataclass, field
from typing import Any

import torch

import optcore
from optcore.testing import inputs_for

#: torch's classes the kit cannot drive with a plain loop: a closure (LBFGS), sparse gradients (SparseAdam)
_NOT_PLAIN = {"LBFGS", "SparseAdam"}
#: inner optimizers of the precision wrappers (the ones issue 40 names)
_WRAPPED = {"FP16Optimizer": {"type": "AdamW"}, "MemoryEfficientFP16Optimizer": {"type": "optcore-lion:Lion", "lr": 1e-3}}
_OWN_PLUGINS = ("optcore-lion", "optcore-adafactor", "optcore-adascale", "optcore-fp16")


@dataclass(frozen=True)
class Case:
    name: str
    config: dict[str, Any]
    matrices_only: bool = False
    dtype: torch.dtype = torch.float32
    backwards: int = 1  # backward passes per step (AdaScaleSGD takes two samples)
    extra: dict[str, Any] = field(default_factory=dict)

    def model(self, seed: int = 0) -> torch.nn.Module:
        torch.manual_seed(seed)
        bias = not self.matrices_only
        return torch.nn.Sequential(torch.nn.Linear(6, 8, bias=bias), torch.nn.Tanh(), torch.nn.Linear(8, 3, bias=bias)).to(
            self.dtype
        )

    def build(self, model: torch.nn.Module) -> Any:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return optcore.build_optimizer(copy.deepcopy(self.config), model)

    def train(self, opt: Any, model: torch.nn.Module, steps: int, seed: int = 0) -> None:
        gen = torch.Generator().manual_seed(seed)
        for _ in range(steps):
            opt.zero_grad()
            for _ in range(self.backwards):
                x = torch.randn(4, 6, generator=gen).to(self.dtype)
                loss = model(x).float().pow(2).mean()
                opt.backward(loss) if hasattr(opt, "backward") else loss.backward()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                opt.step()

    def saved(self) -> dict[str, Any]:
        model = self.model()
        opt = self.build(model)
        self.train(opt, model, 2)
        return copy.deepcopy(opt.state_dict())

    def fresh(self) -> tuple[Any, torch.nn.Module]:
        model = self.model()
        opt = self.build(model)
        self.train(opt, model, 1, seed=7)
        return opt, model


def cases() -> list[Case]:
    out = []
    for spec in optcore.list_optimizers(all=True):
        own = spec.source == "torch" or spec.provider in _OWN_PLUGINS
        if not own or spec.name in _NOT_PLAIN:
            continue
        try:
            target = spec.target
        except optcore.PluginLoadError:
            continue
        if getattr(target, "wraps_optimizer", False):
            inner = _WRAPPED.get(spec.name)
            if inner is not None:
                config = {"type": spec.qualified, "optimizer": inner, "precision": "fp16"}
                out.append(Case(spec.qualified, config, dtype=torch.float16))
            continue
        inputs = inputs_for(spec)
        config = {"type": spec.qualified, **inputs.config}
        backwards = 1
        if spec.name == "AdaScaleSGD":
            config.update(num_gradients_to_accumulate=2, momentum=0.9)
            backwards = 2
        out.append(Case(spec.qualified, config, matrices_only=inputs.matrices_only, backwards=backwards))
    out.append(Case("Muon+AdamW", {"type": "Muon", "lr": 0.02, "fallback": {"type": "AdamW", "lr": 3e-4}}))
    return out


def snapshot(opt: Any, model: torch.nn.Module) -> tuple[Any, list[torch.Tensor]]:
    """Everything a refused load must leave as it was: the state dict (state,
    param_groups, a wrapper's scaler and masters) and the parameters."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sd = copy.deepcopy(opt.state_dict())
    return sd, [p.detach().clone() for p in model.parameters()]


def same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor):
        return (
            isinstance(b, torch.Tensor) and a.shape == b.shape and a.dtype == b.dtype
            and torch.equal(torch.nan_to_num(a.detach()), torch.nan_to_num(b.detach()))
            and torch.equal(a.isnan(), b.isnan()) if a.is_floating_point() else
            isinstance(b, torch.Tensor) and a.shape == b.shape and torch.equal(a, b)
        )
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return isinstance(b, (list, tuple)) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a):
        return math.isnan(b)
    return bool(a == b)


def first_entry(sd: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """The saved state of the first parameter that has any (its index, its entry)."""
    for index in sd["param_groups"][0]["params"]:
        entry = sd["state"].get(index)
        if entry:
            return index, entry
    raise AssertionError("no parameter of the first group has state")


def tensor_keys(entry: dict[str, Any]) -> list[str]:
    """The entry's state tensors with a dimension (moments, factors), not step counts."""
    return [k for k, v in entry.items() if isinstance(v, torch.Tensor) and v.dim() and k != "step"]

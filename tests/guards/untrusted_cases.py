"""Crafted checkpoints and tensors that crashed the process (heap corruption in
torch's fused kernels) or got the wrong error. Run as a script, in a
subprocess of tests/guards/test_guards.py, so that a crash fails a test instead of
ending the test run: each case prints one ``CASE <name>: <outcome>`` line.

An outcome is ``refused`` (an OptcoreError, nothing loaded, and the
optimizer still steps), or what happened instead.
"""

from __future__ import annotations

import math
import sys
import warnings
from collections.abc import Callable
from typing import Any

import torch

CHECKPOINT_CASES: dict[str, Callable[[], tuple[Any, Any, Any]]] = {}
STEP_CASES: dict[str, Callable[[], Any]] = {}


def _model(n: int, dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    torch.manual_seed(n)
    return torch.nn.Linear(n, n).to(dtype)


def _stepped(config: dict[str, Any], model: torch.nn.Module) -> Any:
    import optcore

    opt = optcore.build_optimizer(config, model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(2):
            opt.zero_grad()
            x = torch.randn(3, model.in_features, dtype=model.weight.dtype)
            model(x).float().pow(2).mean().backward()
            opt.step()
    return opt


def _grads(model: torch.nn.Module) -> None:
    model.zero_grad()
    model(torch.randn(3, model.in_features, dtype=model.weight.dtype)).float().pow(2).mean().backward()


CONFIGS = {
    "AdamW": {"type": "AdamW"},
    "Adam": {"type": "Adam"},
    "SGD": {"type": "SGD", "momentum": 0.9},
    "Adagrad": {"type": "Adagrad"},
}


def checkpoint_case(name: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    def add(fn: Callable[..., Any]) -> Callable[..., Any]:
        CHECKPOINT_CASES[name] = fn
        return fn

    return add


def _relabelled(config: dict[str, Any]) -> tuple[Any, Any, Any]:
    """A small model's state, its record saying the big model's shapes."""
    import optcore

    sd = _stepped(config, _model(4)).state_dict()
    big = _model(64)
    sd["optcore"]["param_shapes"] = {0: [64, 64], 1: [64]}
    return optcore.build_optimizer(config, big), sd, big


def _broadcastable(config: dict[str, Any]) -> tuple[Any, Any, Any]:
    """No record; every moment (1, 1) or (1,): broadcastable, not the parameter's shape."""
    import optcore

    sd = _stepped(config, _model(64)).state_dict()
    del sd["optcore"]
    for entry in sd["state"].values():
        for key, value in list(entry.items()):
            if key != "step" and isinstance(value, torch.Tensor) and value.dim():
                entry[key] = torch.zeros((1,) * value.dim())
    big = _model(64)
    return optcore.build_optimizer(config, big), sd, big


for _name, _config in CONFIGS.items():
    CHECKPOINT_CASES[f"relabelled-{_name}"] = lambda c=_config: _relabelled(c)
    CHECKPOINT_CASES[f"broadcastable-{_name}"] = lambda c=_config: _broadcastable(c)


def _fp16_config(flat: bool) -> dict[str, Any]:
    return {"type": "optcore-fp16:FP16Optimizer", "optimizer": {"type": "AdamW"}, "precision": "fp16", "flat": flat}


def _fp16(n: int, flat: bool) -> tuple[Any, torch.nn.Module]:
    model = _model(n, torch.float16)
    return _stepped(_fp16_config(flat), model), model


@checkpoint_case("fp16-inner-moments-relabelled")
def _fp16_relabelled() -> tuple[Any, Any, Any]:
    """FP16Optimizer checks its masters; the inner AdamW's moments are small."""
    small, _ = _fp16(4, flat=True)
    big, model = _fp16(64, flat=True)
    sd = small.state_dict()
    sd["fp32_params"] = big.state_dict()["fp32_params"]
    sd["optcore"]["param_shapes"] = big.state_dict()["optcore"]["param_shapes"]
    return _fresh_fp16(model, flat=True), sd, model


@checkpoint_case("fp16-inner-moments-broadcastable")
def _fp16_broadcastable() -> tuple[Any, Any, Any]:
    big, model = _fp16(64, flat=False)
    sd = big.state_dict()
    del sd["optcore"]
    sd["state"][0]["exp_avg"] = torch.zeros(1, 1)
    return _fresh_fp16(model, flat=False), sd, model


def _fresh_fp16(model: torch.nn.Module, flat: bool) -> Any:
    import optcore

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return optcore.build_optimizer(_fp16_config(flat), model)


def _tampered(edit: Callable[[dict[str, Any]], None], config: dict[str, Any] | None = None) -> tuple[Any, Any, Any]:
    import optcore

    config = config or {"type": "AdamW"}
    model = _model(8)
    sd = _stepped(config, model).state_dict()
    edit(sd)
    return optcore.build_optimizer(config, model), sd, model


def _set_step(value: Any) -> Callable[[dict[str, Any]], None]:
    def edit(sd: dict[str, Any]) -> None:
        sd["state"][0]["step"] = value

    return edit


TAMPERED: dict[str, Callable[[dict[str, Any]], None]] = {
    "step-nan": _set_step(torch.tensor(math.nan)),
    "step-negative": _set_step(torch.tensor(-5.0)),
    "step-fractional": _set_step(torch.tensor(2.5)),
    "step-python-nan": _set_step(math.nan),
    "step-empty-tensor": _set_step(torch.zeros(0)),
    "step-matrix": _set_step(torch.zeros(8, 8)),
    "step-string": _set_step("2"),
    "state-a-list": lambda sd: sd.update(state=[1, 2]),
    "groups-a-dict": lambda sd: sd.update(param_groups={"params": [0, 1]}),
    "group-without-params": lambda sd: sd["param_groups"][0].pop("params"),
    "params-unhashable": lambda sd: sd["param_groups"][0].update(params=[[0], [1]]),
    "entry-not-a-mapping": lambda sd: sd["state"].update({0: 7}),
    "group-without-lr": lambda sd: sd["param_groups"][0].pop("lr"),
    "record-shapes-garbage": lambda sd: sd["optcore"].update(param_shapes={0: "big"}),
    "no-state-key": lambda sd: sd.pop("state"),
}
for _name, _edit in TAMPERED.items():
    CHECKPOINT_CASES[f"tampered-{_name}"] = lambda e=_edit: _tampered(e)


@checkpoint_case("fp16-masters-not-a-list")
def _fp16_masters() -> tuple[Any, Any, Any]:
    opt, model = _fp16(8, flat=True)
    sd = opt.state_dict()
    sd["fp32_params"] = 5
    return _fresh_fp16(model, flat=True), sd, model


def _fp16_scaler(value: Any) -> Callable[[], tuple[Any, Any, Any]]:
    def case() -> tuple[Any, Any, Any]:
        opt, model = _fp16(8, flat=True)
        sd = opt.state_dict()
        sd["loss_scaler"] = value if not isinstance(value, dict) else {**sd["loss_scaler"], **value}
        return _fresh_fp16(model, flat=True), sd, model

    return case


CHECKPOINT_CASES["fp16-scaler-nan"] = _fp16_scaler({"loss_scale": math.nan})
CHECKPOINT_CASES["fp16-scaler-text"] = _fp16_scaler({"iter": "many"})
CHECKPOINT_CASES["fp16-scaler-a-list"] = _fp16_scaler([1, 2])


def _adafactor(n: int) -> tuple[Any, torch.nn.Module]:
    model = _model(n)
    return _stepped({"type": "optcore-adafactor:Adafactor"}, model), model


@checkpoint_case("adafactor-relabelled")
def _adafactor_relabelled() -> tuple[Any, Any, Any]:
    """A small model's factored statistics under the big model's record: loaded
    silently, and failed only at step with a RuntimeError."""
    import optcore

    sd = _adafactor(4)[0].state_dict()
    sd["optcore"]["param_shapes"] = {0: [64, 64], 1: [64]}
    model = _model(64)
    return optcore.build_optimizer({"type": "optcore-adafactor:Adafactor"}, model), sd, model


@checkpoint_case("adafactor-from-adamw")
def _adafactor_from_adamw() -> tuple[Any, Any, Any]:
    """AdamW's moments under Adafactor's label: loaded silently before."""
    import optcore

    opt, model = _adafactor(8)
    sd = opt.state_dict()
    adamw = _stepped({"type": "AdamW", "no_decay": False}, _model(8)).state_dict()
    sd["state"] = adamw["state"]
    return optcore.build_optimizer({"type": "optcore-adafactor:Adafactor"}, model), sd, model


def step_case(name: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    def add(fn: Callable[..., Any]) -> Callable[..., Any]:
        STEP_CASES[name] = fn
        return fn

    return add


def _misused(config: dict[str, Any], misuse: Callable[[Any, torch.nn.Module], None]) -> Callable[[], Any]:
    def run() -> Any:
        model = _model(64)
        opt = _stepped(config, model)
        assert opt.param_groups[0].get("fused"), "the default build is fused"
        _grads(model)
        misuse(opt, model)
        return opt.step

    return run


def _replace_state(key: str, shape: tuple[int, ...], dtype: torch.dtype = torch.float32) -> Callable[[Any, Any], None]:
    def misuse(opt: Any, model: torch.nn.Module) -> None:
        opt.state[model.weight][key] = torch.zeros(shape, dtype=dtype)

    return misuse


def _smaller_data(opt: Any, model: torch.nn.Module) -> None:
    model.weight.data = torch.zeros(4, 4)


def _larger_data(opt: Any, model: torch.nn.Module) -> None:
    model.weight.data = torch.zeros(128, 128)


def _freed_storage(opt: Any, model: torch.nn.Module) -> None:
    model.weight.untyped_storage().resize_(0)


def _freed_grad(opt: Any, model: torch.nn.Module) -> None:
    model.weight.grad.untyped_storage().resize_(0)


MISUSES: dict[str, tuple[dict[str, Any], Callable[[Any, Any], None]]] = {
    "AdamW-data-smaller": (CONFIGS["AdamW"], _smaller_data),
    "AdamW-data-larger": (CONFIGS["AdamW"], _larger_data),
    "AdamW-storage-freed": (CONFIGS["AdamW"], _freed_storage),
    "AdamW-grad-storage-freed": (CONFIGS["AdamW"], _freed_grad),
    "AdamW-exp_avg-smaller": (CONFIGS["AdamW"], _replace_state("exp_avg", (4, 4))),
    "AdamW-exp_avg_sq-flat": (CONFIGS["AdamW"], _replace_state("exp_avg_sq", (64,))),
    "AdamW-exp_avg-double": (CONFIGS["AdamW"], _replace_state("exp_avg", (64, 64), torch.float64)),
    "AdamW-step-empty": (CONFIGS["AdamW"], _replace_state("step", (0,))),
    "AdamW-exp_avg-double-same-bytes": (CONFIGS["AdamW"], _replace_state("exp_avg", (32, 64), torch.float64)),
    "SGD-data-smaller": (CONFIGS["SGD"], _smaller_data),
    "SGD-storage-freed": (CONFIGS["SGD"], _freed_storage),
    "SGD-momentum-smaller": (CONFIGS["SGD"], _replace_state("momentum_buffer", (4, 4))),
    "Adagrad-sum-smaller": (CONFIGS["Adagrad"], _replace_state("sum", (8,))),
}
for _name, (_config, _misuse) in MISUSES.items():
    STEP_CASES[_name] = _misused(_config, _misuse)


@step_case("AdamW-closure-swaps-state")
def _closure_swaps() -> Callable[[], Any]:
    """The closure runs inside step: the check comes after it."""
    model = _model(64)
    opt = _stepped(CONFIGS["AdamW"], model)

    def closure() -> Any:
        _grads(model)
        opt.state[model.weight]["exp_avg"] = torch.zeros(2)
        return 0.0

    return lambda: opt.step(closure)


@step_case("AdamW-scaled-step-of-one-group")
def _groups() -> Callable[[], Any]:
    model = _model(64)
    opt = _stepped(CONFIGS["AdamW"], model)
    _grads(model)
    model.weight.data = torch.zeros(8, 8)
    return lambda: opt.step(scale=2.0, groups=[0])


def run_checkpoint_case(name: str) -> str:
    import optcore

    opt, sd, model = CHECKPOINT_CASES[name]()
    before = {k: v for k, v in opt.state_dict().items()}
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        try:
            opt.load_state_dict(sd)
        except optcore.OptcoreError as exc:
            if len(opt.state_dict()["state"]) != len(before["state"]):
                return f"refused but loaded something: {type(exc).__name__}"
            _grads(model)
            opt.step()
            return f"refused {type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
        except Exception as exc:  # the wrong kind
            return f"raised {type(exc).__name__}: {str(exc)[:200]}"
        try:
            _grads(model)
            opt.step()
        except Exception as exc:
            return f"loaded; step raised {type(exc).__name__}: {str(exc)[:200]}"
    return "loaded and stepped"


def run_step_case(name: str) -> str:
    import optcore

    step = STEP_CASES[name]()
    try:
        step()
    except optcore.OptcoreError as exc:
        return f"refused {type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
    except Exception as exc:
        return f"raised {type(exc).__name__}: {str(exc)[:200]}"
    return "stepped"


if __name__ == "__main__":
    kind, names = sys.argv[1], sys.argv[2:]
    run = run_checkpoint_case if kind == "checkpoint" else run_step_case
    for case in names or (CHECKPOINT_CASES if kind == "checkpoint" else STEP_CASES):
        print(f"CASE {case}: {run(case)}", flush=True)

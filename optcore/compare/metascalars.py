"""Values for the ``.item()`` calls of an optimizer step on the meta device.

Meta tensors have shapes and no data, so a step that reads a number back
(a norm, an overflow test) stops there. :class:`MetaScalars` answers those
reads as the step would see them with finite gradients, which is all the
state's shapes depend on for every optimizer the memory tests cover.
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

_TRUE_IF_FINITE = {"isfinite": True, "isinf": False, "isnan": False, "isposinf": False, "isneginf": False}
_COMPARE = {"gt", "lt", "ge", "le", "eq", "ne", "__gt__", "__lt__", "__ge__", "__le__", "__eq__", "__ne__",
            "greater", "less", "greater_equal", "less_equal", "equal"}  # fmt: skip
_PASS_ON = {"any", "all", "stack", "cat", "view", "reshape", "clone", "to", "squeeze", "unsqueeze", "expand",
            "logical_and", "logical_or", "bitwise_and", "bitwise_or", "__and__", "__or__", "__getitem__", "max",
            "sum", "amax", "detach"}  # fmt: skip
_SCALARS = {"item", "__bool__", "__float__", "__int__", "__index__", "tolist"}


class MetaScalars(TorchFunctionMode):
    """Answers ``.item()`` / ``bool()`` / ``float()`` of meta tensors as the
    step would see them with finite gradients: an "is finite" test is true, an
    inf/NaN test or a comparison is false, a number is 1. Booleans are traced
    from the test that made them through reductions and ``logical_not``. A copy
    off the meta device (``.cpu()``, ``.to("cpu")``) is a tensor of those values.

    A torch-function mode, not a dispatch mode: the ops themselves still run on
    torch's C++ meta kernels, so a step over a 7B model's tensors takes a second."""

    def __init__(self) -> None:
        super().__init__()
        self._truth_of: dict[int, tuple[Any, bool]] = {}  # id -> (weak reference, value): no tensor __eq__

    def _known(self, t: Tensor) -> bool | None:
        entry = self._truth_of.get(id(t))
        return entry[1] if entry is not None and entry[0]() is t else None

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        first = args[0] if args else None
        if isinstance(first, Tensor) and first.device.type == "meta":
            if name in _SCALARS:
                value = self._value(first)
                if name == "tolist":
                    return torch.full(first.shape, value).tolist()
                return {"__bool__": bool, "__float__": float, "__int__": int, "__index__": int}.get(name, _same)(value)
            target = _target_device(name, args[1:], kwargs)
            if target is not None and target.type != "meta":
                dtype = kwargs.get("dtype") or next((a for a in args[1:] if isinstance(a, torch.dtype)), first.dtype)
                return torch.full(first.shape, self._value(first), dtype=dtype, device=target)
        args = self._numbers_for_scalar_arguments(func, args)
        out = func(*args, **kwargs)
        if isinstance(out, Tensor) and out.device.type == "meta" and not out.dtype.is_floating_point:
            value = self._truth(name, args)
            if value is not None:
                self._truth_of[id(out)] = (weakref.ref(out), value)
        return out

    def _numbers_for_scalar_arguments(self, func: Any, args: tuple) -> tuple:
        """A 0-d meta tensor passed where an operator's schema takes a number
        (bitsandbytes' LAMB passes its norm so; the real tensor converts): its value."""
        schema = getattr(func, "_schema", None) or getattr(getattr(func, "default", None), "_schema", None)
        if schema is None:
            return args
        out = list(args)
        for i, (arg, declared) in enumerate(zip(args, schema.arguments)):
            if (isinstance(arg, Tensor) and arg.device.type == "meta" and arg.dim() == 0
                    and str(declared.type) in ("float", "int", "bool", "Scalar")):  # fmt: skip
                out[i] = self._value(arg)
        return tuple(out)

    def _value(self, t: Tensor) -> Any:
        known = self._known(t)
        if t.dtype == torch.bool:
            return bool(known)
        if t.dtype.is_floating_point or t.dtype.is_complex:
            return 1.0
        return 1 if known is None else int(known)

    def _truth(self, name: str, args: tuple) -> bool | None:
        if name in _TRUE_IF_FINITE:
            return _TRUE_IF_FINITE[name]
        if name in _COMPARE:
            return False
        inputs = [self._known(a) for a in tree_leaves(args) if isinstance(a, Tensor) and not a.dtype.is_floating_point]
        if name in ("logical_not", "__invert__", "bitwise_not") and inputs:
            return None if inputs[0] is None else not inputs[0]
        if name in _PASS_ON and inputs and all(v is not None for v in inputs):
            return all(inputs) if name in ("all", "logical_and", "bitwise_and", "__and__") else any(inputs)
        return None


class ItemsInKernels(TorchDispatchMode):
    """The fallback under :class:`MetaScalars` for ``.item()`` calls made inside
    torch's C++ kernels (boolean-mask indexing of a 0-d tensor), which no
    torch-function mode sees: answered at the aten level, with the same values."""

    def __init__(self, scalars: MetaScalars) -> None:
        super().__init__()
        self.scalars = scalars

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: Any = None) -> Any:
        if func is torch.ops.aten._local_scalar_dense.default and args[0].device.type == "meta":
            return self.scalars._value(args[0])
        return func(*args, **(kwargs or {}))


def _same(value: Any) -> Any:
    return value


def _target_device(name: str, rest: tuple, kwargs: Mapping[str, Any]) -> torch.device | None:
    """Where ``cpu()`` / ``to(...)`` / ``numpy()`` would copy a tensor to, if anywhere."""
    if name in ("cpu", "numpy"):
        return torch.device("cpu")
    if name != "to":
        return None
    for a in (*rest, kwargs.get("device")):
        if isinstance(a, (str, torch.device)):
            return torch.device(a)
        if isinstance(a, Tensor):
            return a.device
    return None

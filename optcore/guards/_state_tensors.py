"""What the tensors of a state dict must be as a whole before it loads: finite,
and no two of them (nor one with itself) sharing memory.

torch's ``load_state_dict`` keeps a state tensor that already has the
parameter's dtype and device as it is, so a NaN moment or two moments that are
views of one buffer reach the next step unchanged: the parameters then go
non-finite, or one update writes into another's statistics, without a word.
These checks read every state tensor once (one synchronisation per device),
which a load can afford and a step could not.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator, Mapping
from typing import Any

import torch
from torch import Tensor

from ..kernels import overlap_problem

#: (where the tensor is, for a message: "parameter 3 (param group 0, position 3, shape (8, 6))", its key, the value)
Found = tuple[str, str, Any]


def non_finite(entries: list[Found]) -> Found | None:
    """The first state value holding a NaN or an infinity: a floating or complex
    tensor (its local shard, for a DTensor) or a plain number. A tensor subclass
    without ``isfinite`` (a quantised state) is not judged."""
    checks: dict[torch.device, list[tuple[Tensor, Found]]] = {}
    for found in entries:
        value = found[2]
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if not math.isfinite(value):
                return found
        elif isinstance(value, Tensor) and (value.is_floating_point() or value.is_complex()):
            local = value.to_local() if hasattr(value, "to_local") else value
            if local.is_meta or not local.numel():
                continue
            try:
                flag = torch.isfinite(local.detach()).all()
            except (NotImplementedError, RuntimeError, TypeError):  # a quantised subclass (torchao's 8-bit states)
                continue
            checks.setdefault(flag.device, []).append((flag, found))
    for pairs in checks.values():
        finite = torch.stack([flag for flag, _ in pairs]).cpu().tolist()
        for ok, (_, found) in zip(finite, pairs):
            if not ok:
                return found
    return None


def sharing_problem(entries: list[Found]) -> tuple[Found, str] | None:
    """A state tensor that overlaps itself (expanded: a stride of 0 over a
    dimension longer than 1) or shares memory with another state tensor, with
    the other's place; 0-dim tensors (step counts) are left out, as some
    optimizers keep one count for many parameters."""
    by_device: dict[Any, dict[str, Tensor]] = {}
    where: dict[str, Found] = {}
    for found in _tensors(entries):
        tensor = found[2]
        if any(stride == 0 and size > 1 for size, stride in zip(tensor.shape, tensor.stride())):
            return found, "it is an expanded view (a stride of 0), so its elements share memory"
        name = f"#{len(where)}"
        where[name] = found
        by_device.setdefault(tensor.device, {})[name] = tensor
    for named in by_device.values():
        problem = overlap_problem(named)
        if problem is not None:
            first, second = (where[n] for n in re.findall(r"#\d+", problem)[:2])
            return first, f"it shares memory with state {second[1]!r} of {second[0]}"
    return None


def _tensors(entries: list[Found]) -> Iterator[Found]:
    for found in entries:
        value = found[2]
        if isinstance(value, Tensor) and value.dim() and value.numel() and type(value) in (Tensor, torch.nn.Parameter):
            if not value.is_meta:
                yield found


def state_values(located: list[tuple[str, Mapping[str, Any]]]) -> list[Found]:
    """``(where, key, value)`` of every value in these ``(where, entry)`` pairs."""
    return [(where, str(key), value) for where, entry in located for key, value in entry.items()]

"""What a config costs in memory: the optimizer's state bytes, and the
process's peak resident memory around a run.

:func:`optimizer_state_bytes` is the one definition of "optimizer state" for
both ``optcore compare`` (measured after training) and ``optcore memory``
(predicted on the meta device), so the two cannot disagree by construction.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import torch
from torch import Tensor


def _storage_id(t: Tensor) -> int:
    """One id per storage, also for meta tensors (whose data pointers are all 0)."""
    return int(t.untyped_storage()._cdata)


def optimizer_state_bytes(optimizer: Any, params: Iterable[Tensor]) -> dict[str, Any]:
    """Bytes the optimizer holds besides the model and its gradients: every
    tensor reachable from the optimizer (its ``state``, and attributes such as
    AdaScale's gradient statistics), through wrappers to the innermost
    optimizer, each storage once. A precision wrapper's master copies (the
    inner optimizer's parameters that are not the model's) and their gradients
    are part of it, and also reported alone as ``master_bytes``."""
    params = list(params)
    # a DTensor's bytes are its local shard's (see _tensors), so the model's are too
    model = {_storage_id(t) for p in params for x in (p, p.grad) if x is not None for t in _tensors(x)}
    chain = [optimizer]
    inner = getattr(optimizer, "optimizer", None)
    while isinstance(inner, torch.optim.Optimizer) and all(inner is not o for o in chain):
        chain.append(inner)
        inner = getattr(inner, "optimizer", None)
    masters = None
    seen: set[int] = set(model)
    if len(chain) > 1:
        copies = [p for g in chain[-1].param_groups for p in g["params"] if _storage_id(p) not in model]
        masters = _count((t for p in copies for t in (p, p.grad) if t is not None), seen)
    state = sum(_count(_tensors(vars(o)), seen) for o in chain)
    # an object kept in a parameter's state (GaLore's projector) holds its tensors in its attributes
    state += sum(_count(_tensors(dict(getattr(o, "state", {})), objects=True), seen) for o in chain)
    n = sum(p.numel() for p in params)
    total = state + (masters or 0)
    return {"state_bytes": total, "master_bytes": masters, "state_bytes_per_param": total / n if n else None}


def _count(tensors: Iterator[Tensor], seen: set[int]) -> int:
    """Bytes of the storages of ``tensors`` not in ``seen`` (added to it)."""
    total = 0
    for t in tensors:
        key = _storage_id(t)
        if key not in seen:
            seen.add(key)
            total += t.untyped_storage().nbytes()
    return total


def _tensors(obj: Any, depth: int = 0, objects: bool = False) -> Iterator[Tensor]:
    """Tensors in ``obj`` and its mappings, lists and tuples (not in other objects:
    a module or a hook a wrapper holds is not optimizer state), and with
    ``objects`` in the attributes of plain objects too (what a state holds)."""
    if isinstance(obj, Tensor) and hasattr(type(obj), "__tensor_flatten__") and depth < 8:
        # a wrapper subclass (torchao's 8-bit and 4-bit states): its inner tensors hold the bytes,
        # not the logical fp32 size the wrapper reports
        names, _ = obj.__tensor_flatten__()
        for name in names:
            inner = getattr(obj, name)
            if isinstance(inner, Tensor):  # a DTensor also names its device mesh, which is no state
                yield from _tensors(inner, depth + 1, objects)
    elif isinstance(obj, Tensor):
        yield obj
    elif depth < 8 and isinstance(obj, Mapping):
        for value in obj.values():
            yield from _tensors(value, depth + 1, objects)
    elif depth < 8 and isinstance(obj, (list, tuple)):
        for value in obj:
            yield from _tensors(value, depth + 1, objects)
    elif objects and depth < 8 and hasattr(obj, "__dict__") and not callable(obj) and not isinstance(obj, type):
        yield from _tensors(vars(obj), depth + 1, objects)


# ----------------------------------------------------------- process memory
def rss_now() -> int | None:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def reset_peak_rss() -> bool:
    """Reset the kernel's high-water mark (VmHWM) to the current RSS (Linux >= 4.0),
    so that the peak read later belongs to this config alone."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def peak_rss() -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    try:
        import resource

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return int(peak) if sys.platform == "darwin" else int(peak) * 1024
    except (ImportError, OSError):
        return None


def memory_start(device: torch.device) -> dict[str, Any]:
    mark = {"reset": reset_peak_rss(), "before": rss_now()}
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    return mark


def memory_finish(mark: dict[str, Any], device: torch.device) -> dict[str, Any]:
    peak, before = peak_rss(), mark["before"]
    out = {
        "peak_rss": peak,
        "rss_before": before,
        "peak_rss_delta": peak - before if peak is not None and before is not None else None,
        "peak_rss_since": "optimizer build (VmHWM reset)" if mark["reset"] else "process start",
        "peak_device_bytes": None,
    }
    if device.type == "cuda":
        out["peak_device_bytes"] = int(torch.cuda.max_memory_allocated(device))
    return out

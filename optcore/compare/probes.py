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
    """Bytes the optimizer holds besides the model: every tensor in its
    ``state`` (each storage once; a state entry that *is* a parameter is not
    counted), plus, for a precision wrapper, the master copies it steps (the
    inner optimizer's parameters that are not the model's) and their gradients.
    ``state_bytes`` is the total, ``master_bytes`` the copies' share."""
    params = list(params)
    model = {_storage_id(p) for p in params}
    seen: set[int] = set()

    def count(tensors: Iterator[Tensor]) -> int:
        total = 0
        for t in tensors:
            key = _storage_id(t)
            if key not in model and key not in seen:
                seen.add(key)
                total += t.untyped_storage().nbytes()
        return total

    optimizers, masters = [optimizer], None
    inner = getattr(optimizer, "optimizer", None)
    while isinstance(inner, torch.optim.Optimizer) and inner is not optimizers[-1]:
        optimizers.append(inner)
        inner = getattr(inner, "optimizer", None)
    state = sum(count(_tensors(dict(o.state))) for o in optimizers)
    if len(optimizers) > 1:
        copies = [p for g in optimizers[-1].param_groups for p in g["params"] if _storage_id(p) not in model]
        masters = count(t for p in copies for t in (p, p.grad) if t is not None)
    n = sum(p.numel() for p in params)
    total = state + (masters or 0)
    return {"state_bytes": total, "master_bytes": masters, "state_bytes_per_param": total / n if n else None}


def _tensors(obj: Any) -> Iterator[Tensor]:
    if isinstance(obj, Tensor):
        yield obj
    elif isinstance(obj, Mapping):
        for value in obj.values():
            yield from _tensors(value)
    elif isinstance(obj, (list, tuple)):
        for value in obj:
            yield from _tensors(value)


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

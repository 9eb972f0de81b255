"""The transient peak of an optimizer step: the most bytes of tensors the step
allocates and holds at once (foreach lists, a fused kernel's workspace, an
out-of-place update beside the state it replaces), apart from the resident
state that outlives it.

Counted from tensor storages, not from the process's resident memory: a
dispatch mode sees every storage an op makes, and a weak reference says when it
is freed; a plugin's C kernel adds the scratch it declares
(:func:`optcore.kernels.run_kernel`) while it runs. The same count runs on the meta device (``optcore memory``'s
prediction: meta storages have sizes and no data) and on real tensors (its
``--check``), so the two compare storage for storage, whatever else the machine
is doing.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from .. import kernels


class LiveStorages(TorchDispatchMode):
    """Tracks the storages the ops under it allocate while they are alive;
    ``peak`` is the most bytes alive at once, ``live_bytes()`` those still alive.
    A storage an op shares with one of its inputs (an in-place op, a view) is
    not new and not counted."""

    def __init__(self) -> None:
        super().__init__()
        self._live: dict[int, tuple[StorageWeakRef, int]] = {}
        self.peak = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        inputs = {_key(t) for t in tree_leaves((args, kwargs)) if isinstance(t, Tensor)}
        for t in tree_leaves(out):
            if isinstance(t, Tensor):
                storage = t.untyped_storage()
                key = storage._cdata
                if key not in inputs and key not in self._live:
                    self._live[key] = (StorageWeakRef(storage), storage.nbytes())
        self._live = {k: v for k, v in self._live.items() if not v[0].expired()}
        self.peak = max(self.peak, self.live_bytes())
        return out

    def __enter__(self) -> LiveStorages:
        self._counting = kernels.counting_scratch(self._kernel_scratch)
        self._counting.__enter__()
        return super().__enter__()

    def __exit__(self, *exc: Any) -> None:
        try:
            super().__exit__(*exc)
        finally:
            self._counting.__exit__(*exc)

    def _kernel_scratch(self, nbytes: int) -> None:
        """A plugin's C kernel holds ``nbytes`` of its own (``malloc``) memory
        while it runs, beside what is alive (see :func:`optcore.kernels.run_kernel`)."""
        self.peak = max(self.peak, self.live_bytes() + nbytes)

    def live_bytes(self) -> int:
        return sum(n for ref, n in self._live.values() if not ref.expired())


def _key(t: Tensor) -> int:
    try:
        return int(t.untyped_storage()._cdata)
    except (RuntimeError, NotImplementedError):  # a tensor subclass without one storage
        return id(t)


class FusedKernels:
    """Within ``FusedKernels(True)`` the meta device counts as a device with
    torch's fused optimizer kernels (as the CPU and CUDA are), so a prediction on
    the meta device steps the implementation a real build picks (fused where the
    class has one): a fused kernel updates in place, the single-tensor and
    foreach paths allocate temporaries, and the transient peak is the
    difference. torch ships meta kernels for fused Adam/AdamW; fused SGD and
    Adagrad, which only write into their inputs, get a no-op one here.
    ``FusedKernels(False)``: no device has them, as for FSDP2's DTensor shards."""

    _registered: Any = None

    def __init__(self, available: bool = True) -> None:
        self.available = available

    def __enter__(self) -> FusedKernels:
        import torch.optim.optimizer as optim_base
        import torch.utils._foreach_utils as foreach_utils

        _register_meta_kernels()
        self._saved = [(m, m._get_fused_kernels_supported_devices) for m in (optim_base, foreach_utils)]
        devices = self._saved[1][1]
        chosen = (lambda: [*devices(), "meta"]) if self.available else list
        for module, _ in self._saved:
            module._get_fused_kernels_supported_devices = chosen  # type: ignore[attr-defined]
        return self

    def __exit__(self, *exc: Any) -> None:
        for module, original in self._saved:
            module._get_fused_kernels_supported_devices = original  # type: ignore[attr-defined]


def _register_meta_kernels() -> None:
    import torch

    if FusedKernels._registered is not None:
        return
    library = torch.library.Library("aten", "IMPL")  # noqa: TOR901 - kept alive on the class
    for op in ("_fused_sgd_", "_fused_sgd_.tensor_lr", "_fused_adagrad_", "_fused_adagrad_.tensor_lr"):
        try:
            library.impl(op, _writes_in_place_only, "Meta")
        except RuntimeError:  # already has one (a later torch), or no such overload
            pass
    FusedKernels._registered = library


def _writes_in_place_only(*args: Any, **kwargs: Any) -> None:
    return None

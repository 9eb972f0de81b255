"""AdaScaleSGD over FSDP2's DTensor shards: where the per-worker norms come from.

AdaScale's variance estimate needs ``|g_i|^2`` of every worker's whole
gradient before the workers' gradients are averaged. Under DDP a tensor hook
on each parameter sees it. Under FSDP2 (``fully_shard``) the optimizer holds
the sharded ``DTensor`` parameters, which autograd never reaches: the forward
runs on unsharded parameters that FSDP2 swaps into the modules (the same
``nn.Parameter`` objects every iteration), autograd writes their gradients,
and FSDP2 reduce-scatters those into the shards' ``.grad``.

:class:`UnshardedWatch` finds, during the forward passes until it has found
them all, the unsharded parameter that stands in for each sharded one, with
two process-wide module hooks (public ``torch.nn`` API): before a module's
forward (before FSDP2's own pre-forward hook unshards) it notes which
``(module, name)`` holds each sharded parameter of the optimizer; after a
module's forward (before FSDP2's post-forward hook reshards) the parameter
under that name is the unsharded one, and the optimizer's gradient hook is
registered on it. Then the module hooks are removed.

The squared norms of the averaged gradient are read from the local shards
of ``.grad`` and all-reduced with the per-worker sums (:func:`local`), so a
step costs one collective, as under DDP.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn


_DTENSOR: list[Any] = []  # torch's DTensor class (None without distributed support), looked up on first use


def is_sharded(t: Any) -> bool:
    if not _DTENSOR:
        try:
            from torch.distributed.tensor import DTensor
        except ImportError:  # torch without distributed support
            DTensor = None  # type: ignore[assignment,misc]
        _DTENSOR.append(DTensor)
    return _DTENSOR[0] is not None and isinstance(t, _DTENSOR[0])


def copies(t: Any) -> int:
    """How many ranks hold each element of ``t``'s local data: the sizes of the
    mesh dimensions that replicate it (HSDP's replicate dimension), 1 for a
    plain tensor. A sum of local data over every rank counts each element this often."""
    if not is_sharded(t):
        return 1
    n = 1
    for dim, place in enumerate(t.placements):
        if place.is_replicate():
            n *= t.device_mesh.size(dim)
    return n


def local(t: Tensor) -> Tensor:
    """The rank's own part of ``t`` (a DTensor's local shard, else ``t``)."""
    return t.to_local() if type(t) is not Tensor and is_sharded(t) else t


class UnshardedWatch:
    """Registers ``hook_for(index)`` on the unsharded stand-in of each sharded
    parameter (``index``: its param group) as the forward passes reveal them."""

    def __init__(self, params: list[tuple[int, Tensor]], hook_for: Callable[[int], Callable[[Tensor], None]]) -> None:
        self.waiting: dict[int, int] = {id(p): index for index, p in params}
        self.params = {id(p): p for _, p in params}
        self.hook_for = hook_for
        self.held: dict[tuple[int, str], int] = {}  # (id(module), name) -> id(sharded param)
        self.walked: set[int] = set()
        self.handles: list[Any] = []  # the gradient hooks, removed with the optimizer's
        self._module_hooks = [
            nn.modules.module.register_module_forward_pre_hook(self._before),
            nn.modules.module.register_module_forward_hook(self._after),
        ]

    @property
    def complete(self) -> bool:
        return not self.waiting

    def unwatched(self) -> list[Tensor]:
        """The sharded parameters with a gradient whose unsharded stand-in was
        never found (no forward ran through them while the watch was on)."""
        return [self.params[i] for i in self.waiting if self.params[i].grad is not None]

    def _before(self, module: nn.Module, args: Any) -> None:
        if not self.waiting or id(module) in self.walked:
            return
        for m in module.modules():
            self.walked.add(id(m))
            for name, t in m.named_parameters(recurse=False):
                if id(t) in self.waiting:
                    self.held[(id(m), name)] = id(t)

    def _after(self, module: nn.Module, args: Any, output: Any) -> None:
        if not self.waiting:
            return
        for name, t in module.named_parameters(recurse=False):
            sharded = self.held.get((id(module), name))
            if sharded is None or sharded == id(t) or sharded not in self.waiting or is_sharded(t):
                continue
            index = self.waiting.pop(sharded)
            if t.requires_grad:
                self.handles.append(t.register_hook(self.hook_for(index)))
        if not self.waiting:
            self.remove_module_hooks()

    def remove_module_hooks(self) -> None:
        for handle in self._module_hooks:
            handle.remove()
        self._module_hooks = []

    def remove(self) -> None:
        self.remove_module_hooks()
        for handle in self.handles:
            handle.remove()
        self.handles = []

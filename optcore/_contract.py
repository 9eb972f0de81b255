"""The optimizer contract: what every optimizer optcore hands out can do.

Two roads lead here. Optimizers written for optcore subclass :class:`Optimizer`
and implement ``step(closure, scale, groups)`` natively. Classes from
``torch.optim`` and third-party packages are *adapted*: :func:`adapt` makes a
subclass that mixes :class:`ContractMixin` in front of the original class, so
``isinstance(opt, torch.optim.AdamW)`` still holds, the original ``step`` runs
unchanged, and the adapter costs one Python call per step.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, ClassVar

import torch
from torch import Tensor

from ._checkpoint import check_state_dict
from ._errors import ConfigError

GroupSelector = Sequence[int | str] | int | str | None

#: Keys of a param group that are bookkeeping, not hyper-parameters.
_NON_HPARAM_KEYS = frozenset({"params", "param_names", "name", "lr_scale"})


def _params_with_grad(groups: Iterable[Mapping[str, Any]]) -> list[Tensor]:
    return [p for g in groups for p in g["params"] if p.grad is not None]


def by_device_and_dtype(tensors: Iterable[Tensor]) -> dict[tuple[torch.device, torch.dtype], list[Tensor]]:
    """Tensors bucketed by (device, dtype): the unit of torch's ``_foreach_`` ops."""
    buckets: dict[tuple[torch.device, torch.dtype], list[Tensor]] = {}
    for t in tensors:
        buckets.setdefault((t.device, t.dtype), []).append(t)
    return buckets


def _accumulation_dtype(dtype: torch.dtype) -> torch.dtype | None:
    """fp32, or the grads' own precision when it is higher (fp64); None for
    non-floating grads (complex), whose norm torch computes in their precision."""
    return torch.promote_types(dtype, torch.float32) if dtype.is_floating_point else None


def total_grad_norm(grads: Sequence[Tensor]) -> Tensor:
    """The 2-norm of all ``grads`` together, one fused call per bucket.

    Accumulated in at least fp32 (an fp16 grad whose norm exceeds 65504 is not
    an overflow) and in the grads' own precision when higher: fp64 grads get an
    fp64 norm, as ``torch.nn.utils.get_total_norm`` gives."""
    if not grads:
        return torch.zeros(())
    norms = []
    for (_, dtype), bucket in by_device_and_dtype(grads).items():
        acc = _accumulation_dtype(dtype)
        per_tensor = torch._foreach_norm(bucket, 2.0) if acc is None else torch._foreach_norm(bucket, 2.0, dtype=acc)
        norms.append(torch.linalg.vector_norm(torch.stack(per_tensor), 2.0))
    first = norms[0].device
    dtype = functools.reduce(torch.promote_types, (n.dtype for n in norms))
    return torch.linalg.vector_norm(torch.stack([n.to(first, dtype) for n in norms]), 2.0)


class ContractMixin:
    """The members API.md promises, on top of ``torch.optim.Optimizer``.

    Capability flags are class attributes that subclasses (or :func:`adapt`)
    set to what is *true* of them; wrappers such as the FP16 optimizers read
    them to pick a strategy.
    """

    #: step works on fp16/bf16 params, computing in fp32 and keeping fp32 state.
    supports_memory_efficient_fp16: ClassVar[bool] = False
    #: ``step(scale=s)`` folds ``1/s`` into the update: no separate unscale pass.
    supports_step_with_scale: bool = False
    #: works on one flat contiguous parameter (pointwise update).
    supports_flat_params: ClassVar[bool] = False
    #: ``step(groups=...)`` steps only the selected groups.
    supports_groups: ClassVar[bool] = True
    #: Why a flat parameter does not work, for wrappers to show (empty when it does).
    flat_params_unsupported_reason: ClassVar[str] = ""

    param_groups: list[dict[str, Any]]
    defaults: dict[str, Any]
    state: Any

    # ------------------------------------------------------------------ config
    @property
    def optimizer_config(self) -> dict[str, Any]:
        """The effective hyper-parameters: the defaults, with the first group's
        current values on top (so a scheduler-set ``lr`` is what is reported)."""
        config = dict(self.defaults)
        if self.param_groups:
            for key, value in self.param_groups[0].items():
                if key not in _NON_HPARAM_KEYS:
                    config[key] = value
            config["lr"] = self.get_lr()
        return config

    def get_lr(self) -> float | Tensor:
        """The base learning rate: the first group's ``lr`` divided by its
        ``lr_scale`` (1 unless layer-wise scaling is configured), so that
        ``set_lr(get_lr())`` changes nothing. A tensor ``lr`` (the
        torch.compile + LR-scheduler recipe) comes back as a tensor (a copy)."""
        group = self.param_groups[0]
        lr, scale = group["lr"], group.get("lr_scale", 1.0)
        if isinstance(lr, Tensor):
            return lr.detach().clone() if scale == 1.0 else lr.detach() / scale
        return float(lr) / float(scale)

    def get_lrs(self) -> list[float | Tensor]:
        """The learning rate of every group, as stored (``lr_scale`` applied;
        tensors stay tensors)."""
        return [g["lr"] if isinstance(g["lr"], Tensor) else float(g["lr"]) for g in self.param_groups]

    def set_lr(self, lr: float | Tensor | Sequence[float | Tensor]) -> None:
        """Set the learning rate: one number (or 0-dim tensor) sets every group
        to ``lr * group['lr_scale']`` (keeping layer-wise ratios); a sequence
        gives each group its own value. A group whose ``lr`` is a tensor keeps
        that tensor and is filled in place (compiled steps see no new value)."""
        if isinstance(lr, (int, float)) or (isinstance(lr, Tensor) and lr.ndim == 0):
            values = [lr * g.get("lr_scale", 1.0) if g.get("lr_scale", 1.0) != 1.0 else lr for g in self.param_groups]
        else:
            values = list(lr)
            if len(values) != len(self.param_groups):
                raise ConfigError(
                    f"set_lr got {len(values)} learning rates for {len(self.param_groups)} param groups; "
                    "pass one number, or one per group."
                )
        for group, value in zip(self.param_groups, values):
            if isinstance(group["lr"], Tensor):
                group["lr"].fill_(value.detach() if isinstance(value, Tensor) else value)
            else:
                group["lr"] = float(value)

    # --------------------------------------------------------------- gradients
    def backward(self, loss: Tensor) -> None:
        """``loss.backward()``; precision wrappers scale the loss here."""
        loss.backward()

    def multiply_grads(self, c: float | Tensor) -> None:
        """Multiply every gradient by ``c`` in place (one fused call per
        device and dtype)."""
        if not isinstance(c, Tensor) and c == 1.0:
            return
        for (device, _), grads in by_device_and_dtype(
            p.grad for p in _params_with_grad(self.param_groups)
        ).items():
            factor = c.to(device) if isinstance(c, Tensor) else c
            torch._foreach_mul_(grads, factor)

    def clip_grad_norm(
        self,
        max_norm: float,
        aggregate_norm_fn: Callable[[Tensor], Tensor] | None = None,
    ) -> Tensor:
        """Return the total 2-norm of all gradients and, if ``max_norm > 0``,
        scale them so it is at most ``max_norm``.

        ``aggregate_norm_fn`` combines per-shard norms (model parallelism) before
        clipping. A non-finite norm is returned without touching the gradients,
        so the caller (or a loss scaler) can skip the step.
        """
        grads = [p.grad for p in _params_with_grad(self.param_groups)]
        if not grads:
            return torch.zeros(())
        total = total_grad_norm(grads)
        if aggregate_norm_fn is not None:
            total = aggregate_norm_fn(total)
        if max_norm > 0 and bool(torch.isfinite(total)):
            coef = (max_norm / (total + 1e-6)).clamp(max=1.0)
            self.multiply_grads(coef)
        return total

    # -------------------------------------------------------------------- step
    def _select_groups(self, groups: GroupSelector) -> list[dict[str, Any]]:
        """The param groups named by ``groups``: indices, or the ``name`` given
        to a group in the config; ``None`` selects all."""
        if groups is None:
            return list(self.param_groups)
        if isinstance(groups, (int, str)):
            groups = [groups]
        selected: list[dict[str, Any]] = []
        names = [g.get("name") for g in self.param_groups]
        for key in groups:
            if isinstance(key, int) and not isinstance(key, bool):
                if not -len(self.param_groups) <= key < len(self.param_groups):
                    raise ConfigError(
                        f"step(groups=...) names group index {key}, but there are "
                        f"{len(self.param_groups)} param groups."
                    )
                group = self.param_groups[key]
            elif isinstance(key, str) and key in names:
                group = self.param_groups[names.index(key)]
            else:
                known = [n for n in names if n is not None]
                raise ConfigError(
                    f"step(groups=...) names unknown group {key!r}; groups are selected by "
                    f"index (0..{len(self.param_groups) - 1}) or by name ({known or 'none named'})."
                )
            if all(group is not g for g in selected):
                selected.append(group)
        return selected

    #: Classes whose ``step`` must call the closure itself (LBFGS re-evaluates it).
    _passes_closure: ClassVar[bool] = False
    #: The adapted class's own ``step``, without torch's profiling wrapper (set by
    #: :func:`optcore._adapt.adapt`; a plain attribute so torch.compile traces it).
    _original_step: ClassVar[Callable[..., Any] | None] = None

    def step(  # type: ignore[override]
        self,
        closure: Callable[[], float] | None = None,
        scale: float = 1.0,
        groups: GroupSelector = None,
    ) -> float | None:
        """One update with gradients divided by ``scale``, restricted to ``groups``.

        The adapted class's own ``step`` does the work. The closure is evaluated
        first (so ``scale`` applies to the gradients it produced); ``scale`` is
        folded into torch's fused kernels through their ``grad_scale`` input where
        they have one, and applied as one multiply over the gradients otherwise.
        A plain ``step()`` is the class's own step and nothing else (one call, so
        torch.compile sees the graph breaks torch's optimizer has, and no more).
        """
        original = self._original_step
        if scale == 1.0 and groups is None and original is not None and (closure is None or self._passes_closure):
            return original(self, closure)
        return self._contract_step(closure, scale, groups)

    def _contract_step(self, closure: Callable[[], float] | None, scale: float, groups: GroupSelector) -> float | None:
        if self._passes_closure:
            if scale != 1.0 or groups is not None:
                raise ConfigError(
                    f"{type(self).__name__} re-evaluates the closure inside step, so it cannot take "
                    "scale= or groups=; unscale the loss in the closure instead."
                )
            return self._base_step(closure)
        if groups is not None:
            self._check_groups_supported()
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if groups is None:
            self._scaled_step(scale)
            return loss
        saved_groups = self.param_groups
        self.param_groups = self._select_groups(groups)
        try:
            self._scaled_step(scale)
        finally:
            self.param_groups = saved_groups
        return loss

    def _check_groups_supported(self) -> None:
        if self.supports_groups and param_groups_assignable(type(self)):
            return
        if not param_groups_assignable(type(self)):
            why = (
                "its param_groups is a read-only property (it wraps another optimizer or derives its groups), "
                "so optcore cannot restrict a step to some of them"
            )
        else:
            why = "its update may couple param groups (or optcore cannot vouch that it does not)"
        raise ConfigError(
            f"{type(self).__name__} does not support step(groups=...): {why}. Step all groups, or use an "
            "optimizer whose supports_groups is True."
        )

    def _scaled_step(self, scale: float) -> None:
        if scale != 1.0 and not self._folds_scale():
            self.multiply_grads(1.0 / scale)
            scale = 1.0
        if scale != 1.0:
            self._step_with_grad_scale(scale)
        else:
            self._base_step(None)

    def _base_step(self, closure: Callable[[], float] | None) -> float | None:
        """The adapted class's own ``step``, without torch's profiling wrapper
        (our class already carries one; running the step hooks twice would be a bug)."""
        original = self._original_step
        if original is None:  # a ContractMixin subclass not made by adapt()
            return super().step(closure)  # type: ignore[misc]
        return original(self, closure)

    # Adapted classes whose fused kernels take ``grad_scale`` override these.
    def _folds_scale(self) -> bool:
        return False

    def _step_with_grad_scale(self, scale: float) -> None:
        raise NotImplementedError

    # --------------------------------------------------------------- checkpoint
    def __getstate__(self) -> dict[str, Any]:
        """Keep every attribute on copy/pickle (torch keeps only ``defaults``,
        ``state`` and ``param_groups``, which breaks classes that store more,
        e.g. LBFGS's ``_params`` or lion-pytorch's ``decoupled_wd``). A ``step``
        patched onto the instance by an LR scheduler stays behind: it is bound
        to this object, and a copy has no scheduler."""
        state = self.__dict__.copy()
        state.pop("step", None)
        return state

    def state_dict(self) -> dict[str, Any]:  # type: ignore[override]
        """torch's state dict, plus ``"optcore": {"name", "provider", "version",
        "param_shapes"}`` when built by optcore: who saved it (so loading it into
        another optimizer is an error) and the shape of every parameter with state
        (so loading it over other parameters is an error, not a crash)."""
        state_dict = super().state_dict()  # type: ignore[misc]
        spec = getattr(self, "optcore_spec", None)
        if spec is None or not isinstance(state_dict, dict) or not isinstance(state_dict.get("param_groups"), list):
            return state_dict
        shapes: dict[int, list[int]] = {}
        for saved, group in zip(state_dict["param_groups"], self.param_groups):
            for index, param in zip(saved.get("params", ()), group["params"]):
                if index in state_dict.get("state", {}):
                    shapes[index] = list(param.shape)
        state_dict["optcore"] = {
            "name": spec.name, "provider": spec.provider, "version": _version_text(spec.version), "param_shapes": shapes,
        }
        return state_dict

    def load_state_dict(  # type: ignore[override]
        self,
        state_dict: Mapping[str, Any],
        optimizer_overrides: Mapping[str, Any] | None = None,
    ) -> None:
        """Load ``state_dict``, then replace hyper-parameters of every loaded
        group with ``optimizer_overrides`` (for example a new ``lr`` on resume).

        Checked first, so a wrong checkpoint changes nothing: state saved by
        another optimizer, or for parameters of other shapes, is a
        :class:`ConfigError`; another version of the same optimizer loads with a
        warning. A plain torch state dict (no ``"optcore"`` entry) loads as in torch.
        """
        state_dict = check_state_dict(self, state_dict)
        super().load_state_dict(state_dict)  # type: ignore[misc]
        if optimizer_overrides:
            known = set(self.defaults) | {k for g in self.param_groups for k in g} - {"params"}
            unknown = sorted(set(optimizer_overrides) - known)
            if unknown:
                raise ConfigError(
                    f"optimizer_overrides has unknown hyper-parameter(s) {unknown}; "
                    f"this optimizer has {sorted(known - {'param_names'})}.",
                    problems=[(k, "unknown hyper-parameter") for k in unknown],
                    accepted=sorted(known),
                )
            for group in self.param_groups:
                for key, value in optimizer_overrides.items():
                    if key == "lr" and group.get("lr_scale", 1.0) != 1.0:
                        value = value * group["lr_scale"]
                    if isinstance(group.get(key), Tensor) and not isinstance(value, Tensor):
                        group[key].fill_(value)
                    else:
                        group[key] = value
            self.defaults.update({k: v for k, v in optimizer_overrides.items() if k in self.defaults})

    # -------------------------------------------------------------- distributed
    def _averageable_state(self, param: Tensor) -> Iterator[Tensor]:
        """State tensors of ``param`` for which a mean across ranks is meaningful:
        by default the floating tensors of the parameter's shape (moments)."""
        for value in self.state.get(param, {}).values():
            if isinstance(value, Tensor) and value.is_floating_point() and value.shape == param.shape:
                yield value

    @torch.no_grad()
    def average_params(self, group: Any = None) -> None:
        """All-reduce-average parameters (and per-parameter moments) over the
        ``torch.distributed`` ranks of ``group``; a no-op when not initialised.

        Tensors travel in one flat buffer per device and dtype, so the cost is a
        handful of collectives, not one per parameter.
        """
        dist = torch.distributed
        if not (dist.is_available() and dist.is_initialized()):
            return
        world = dist.get_world_size(group)
        if world == 1:
            return
        tensors: list[Tensor] = []
        for g in self.param_groups:
            for p in g["params"]:
                tensors.append(p.data)
                tensors.extend(self._averageable_state(p))
        _check_ranks_agree(tensors, group)
        for bucket in by_device_and_dtype(tensors).values():
            flat = torch.cat([t.reshape(-1) for t in bucket])
            dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=group)
            flat.div_(world)
            offset = 0
            for t in bucket:
                n = t.numel()
                t.copy_(flat[offset : offset + n].view_as(t))
                offset += n


def _signature(tensors: Sequence[Tensor]) -> list[int]:
    """(count, elements, checksum of every dtype and shape) of what a rank averages."""
    import zlib

    layout = ";".join(f"{t.dtype}{tuple(t.shape)}" for t in tensors).encode()
    return [len(tensors), sum(t.numel() for t in tensors), zlib.crc32(layout)]


def _check_ranks_agree(tensors: Sequence[Tensor], group: Any) -> None:
    """Raise the same :class:`ConfigError` on every rank unless all ranks average
    the same tensors: a flat all-reduce over buffers of different sizes aborts
    the process (gloo: SIGABRT) instead of failing. One all-gather of three
    integers per call."""
    dist = torch.distributed
    device = tensors[0].device if tensors else torch.device("cpu")
    if dist.get_backend(group) == "nccl" and device.type != "cuda":
        device = torch.device("cuda", torch.cuda.current_device())
    mine = torch.tensor(_signature(tensors), dtype=torch.int64, device=device)
    gathered = [torch.empty_like(mine) for _ in range(dist.get_world_size(group))]
    dist.all_gather(gathered, mine, group=group)
    signatures = [t.tolist() for t in gathered]
    if any(sig != signatures[0] for sig in signatures):
        lines = [f"  rank {r}: {n} tensors, {e} elements, layout {c:08x}" for r, (n, e, c) in enumerate(signatures)]
        raise ConfigError(
            "average_params: the ranks do not hold the same parameters and optimizer state, so there is "
            "nothing consistent to average:\n" + "\n".join(lines) + "\n"
            "Optimizer state appears on the first step: call average_params on every rank after the same "
            "number of steps, with the same model and optimizer config.",
            problems=[("average_params", "ranks disagree")],
        )


def _version_text(version: Any) -> str | None:
    """A plain ``str`` (torch's ``TorchVersion`` would not load with ``weights_only=True``)."""
    return None if version is None else str.__str__(version)


def param_groups_assignable(cls: type) -> bool:
    """False where ``param_groups`` is a read-only property (wrappers such as
    Lookahead or ScheduleFreeWrapper expose their inner optimizer's groups)."""
    import inspect

    attr = inspect.getattr_static(cls, "param_groups", None)
    return not (isinstance(attr, property) and attr.fset is None)


class Optimizer(ContractMixin, torch.optim.Optimizer):
    """Base class for optimizers written for optcore.

    Subclasses implement ``step(closure=None, scale=1.0, groups=None)``
    natively (use :meth:`_select_groups` and fold ``1/scale`` into the update),
    set the capability flags that are true of them, and may attach a pydantic
    ``config_schema``.
    """

    config_schema: ClassVar[Any] = None

    def step(  # type: ignore[override]
        self,
        closure: Callable[[], float] | None = None,
        scale: float = 1.0,
        groups: GroupSelector = None,
    ) -> float | None:
        raise NotImplementedError(f"{type(self).__name__} must implement step(closure, scale, groups)")


def grad_scale_tensor(scale: float | Tensor, like: Tensor) -> Tensor:
    """``scale`` as a float32 scalar tensor on ``like``'s device (what fused kernels take)."""
    if isinstance(scale, Tensor):
        return scale.to(device=like.device, dtype=torch.float32)
    return torch.tensor(float(scale), dtype=torch.float32, device=like.device)


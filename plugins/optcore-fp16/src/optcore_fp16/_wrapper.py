"""What both precision wrappers share: loss scaling, one lazy gradient factor,
overflow detection, and the ``torch.optim.Optimizer`` surface.

The model's gradients are never rewritten before the step. Everything that
would rescale them — the loss scale, ``multiply_grads``, gradient clipping,
``step(scale=...)`` — is folded into one number and applied once: inside a
pass over the gradients that happens anyway (FP16Optimizer's copy to fp32), or
handed to the inner optimizer as ``step(scale=...)`` so that one which
``supports_step_with_scale`` unscales inside its own pass. Overflow is checked
in ``step`` itself (or taken from ``clip_grad_norm`` when the caller clipped),
never left to the caller.
"""

from __future__ import annotations

import math
import warnings
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping, MutableMapping, Sequence
from typing import Any, ClassVar

import torch
from torch import Tensor

from optcore import ConfigError, StepError
from optcore.guards import overlaps_itself
from optcore.plugin import (
    ContractMixin,
    GroupSelector,
    Optimizer,
    by_device_and_dtype,
    check_step_state,
    prepare_step,
    total_grad_norm,
)

from .loss_scaler import DynamicLossScaler
from .schemas import LossScalerConfig

_HALF = {"fp16": torch.float16, "bf16": torch.bfloat16}

#: Keys the wrappers add to the inner optimizer's state dict.
WRAPPER_KEY = "fp16_wrapper"
SCALER_KEY = "loss_scaler"


class ParamGroupView(MutableMapping[str, Any]):
    """A param group as the user sees it: ``params`` are the model's parameters,
    every other key reads and writes the inner optimizer's group.

    So ``torch.optim.lr_scheduler`` (which writes ``group["lr"]``) and
    ``set_lr`` drive the optimizer that steps the fp32 master copy, while
    ``group["params"]`` still lists the tensors the model trains.
    """

    __slots__ = ("_params", "inner")

    def __init__(self, inner: dict[str, Any], params: list[Tensor]) -> None:
        self.inner = inner
        self._params = params

    def __getitem__(self, key: str) -> Any:
        return self._params if key == "params" else self.inner[key]

    def __setitem__(self, key: str, value: Any) -> None:
        if key == "params":
            raise TypeError("the params of a wrapped param group are fixed; use add_param_group for new parameters")
        self.inner[key] = value

    def __delitem__(self, key: str) -> None:
        if key == "params":
            raise TypeError("the params of a wrapped param group cannot be deleted")
        del self.inner[key]

    def __iter__(self) -> Iterator[str]:
        yield "params"
        yield from (k for k in self.inner if k != "params")

    def __len__(self) -> int:
        return len(self.inner) + ("params" not in self.inner)

    def copy(self) -> dict[str, Any]:
        return dict(self.items())

    def __repr__(self) -> str:
        return f"ParamGroupView({ {k: v for k, v in self.items() if k != 'params'} }, {len(self._params)} params)"


def refuse_sharded(name: str, optimizer: torch.optim.Optimizer) -> None:
    """A :class:`~optcore.ConfigError` for ``DTensor`` parameters (FSDP2's
    ``fully_shard``) in a wrapper that keeps fp32 master copies: its copies to
    and from the masters are whole-tensor ``_foreach`` ops that have no
    ``DTensor`` rule, and a flat master buffer over each rank's local shard
    would be plain tensors that DCP cannot reshard. FSDP2 has mixed precision
    of its own, and MemoryEfficientFP16Optimizer steps the local shards."""
    params = [p for g in optimizer.param_groups for p in g["params"]]
    sharded = [p for p in params if hasattr(p, "placements") and hasattr(p, "device_mesh")]
    if not sharded:
        return
    raise ConfigError(
        f"{name} cannot wrap an optimizer over FSDP2's sharded parameters ({len(sharded)} are DTensor shards): "
        "its fp32 master copies are made and written back by whole-tensor ops (torch's _foreach ops have no "
        "DTensor rule), and a flat master buffer over each rank's shard would be plain tensors that "
        "torch.distributed.checkpoint cannot reshard. Under FSDP2 keep the parameters in fp32 and let FSDP2 "
        "cast them: fully_shard(module, mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16, "
        "reduce_dtype=torch.float32)) with the plain optimizer (no 'precision' in its config); or use "
        "MemoryEfficientFP16Optimizer (memory_efficient=true), which steps each rank's shard, with an "
        f"optimizer that computes in fp32 itself (Lion, Adafactor); or keep {name} and train under DDP.",
        problems=[("precision", "precision wrapper over DTensor parameters")],
        target=name,
    )


def is_contract(optimizer: Any) -> bool:
    return isinstance(optimizer, ContractMixin)


def non_finite(tensors: Sequence[Tensor], unscale: float = 1.0) -> bool:
    """Whether any of ``tensors`` holds an inf or a NaN: one fused pass per
    device and dtype (torch's AMP kernel), which also multiplies them by
    ``unscale`` in the same pass. One host sync. Only reading, a gradient whose
    elements share memory (``p.grad = g.expand(...)``, which the kernel cannot
    write) is checked through a copy."""
    if unscale == 1.0:
        tensors = [t.contiguous() if not t.is_contiguous() and overlaps_itself(t) else t for t in tensors]
    meshes = {t.device_mesh: t.device_mesh for t in tensors if _is_dtensor(t)}  # equal meshes vote once
    if meshes:  # FSDP2's shards: each rank checks (and unscales) its local shard, and the ranks vote
        tensors = [t.to_local() if _is_dtensor(t) else t for t in tensors]
    found = []
    for (device, _), bucket in by_device_and_dtype(tensors).items():
        flag = torch.zeros(1, dtype=torch.float32, device=device)
        factor = torch.full((1,), unscale, dtype=torch.float32, device=device)
        torch._amp_foreach_non_finite_check_and_unscale_(bucket, flag, factor)
        found.append(flag.to(found[0].device) if found else flag)
    if meshes:
        mesh = next(iter(meshes.values()))
        total = torch.stack(found).sum().reshape(1) if found else torch.zeros(1, device=mesh.device_type)
        for each in meshes.values():  # one rank's overflow skips the step on every rank of every mesh dimension
            for group in each.get_all_groups():
                torch.distributed.all_reduce(total, group=group)
        return bool(total.item() > 0)
    return bool(torch.stack(found).sum() > 0) if found else False


def check_inner_state(wrapper: Any, params: list[Tensor]) -> None:
    """State of ``params`` that the inner optimizer's step cannot use is a
    StepError before the wrapper changes anything: a native inner optimizer
    judges its own in its step's preamble, a torch one does not."""
    if not isinstance(wrapper.optimizer, Optimizer) and not torch.compiler.is_compiling():
        check_step_state(wrapper.optimizer, params, owner=type(wrapper).__name__)


def _is_dtensor(t: Tensor) -> bool:
    return hasattr(t, "placements") and hasattr(t, "device_mesh")


def constructor_state(optimizer: torch.optim.Optimizer) -> bool:
    """Whether the optimizer's state is what its constructor made before any step
    (torch's Adagrad fills ``sum`` and ``step = 0`` in ``__init__``): every
    entry has a ``step`` of zero. Such state may move to the fp32 copy."""
    return all("step" in entry and float(entry["step"]) == 0 for entry in optimizer.state.values())


class PrecisionWrapper(ContractMixin, torch.optim.Optimizer):
    """Base of :class:`FP16Optimizer` and :class:`MemoryEfficientFP16Optimizer`.

    Subclasses set ``self.param_groups`` and implement :meth:`_step_inner`.
    """

    wraps_optimizer: ClassVar[bool] = True
    #: step(scale=s) only changes the one factor handed to the inner step.
    supports_step_with_scale: bool = True
    supports_flat_params: ClassVar[bool] = False
    supports_memory_efficient_fp16: ClassVar[bool] = False
    #: for optcore.testing: fp16 and bf16 parameters (precision='fp16' / 'bf16'), and fp32/fp64
    #: ones, which the wrappers accept with a warning and must still step by the contract
    conformance_inputs: ClassVar[dict[str, Any]] = {"dtypes": ("float32", "float64", "bfloat16", "float16")}
    #: steps FSDP2's DTensor parameters on each rank's local shard (no copies of its own)
    steps_local_shards: ClassVar[bool] = False

    @classmethod
    def param_dtype_for(cls, hparams: Mapping[str, Any]) -> torch.dtype:
        """The dtype the model's parameters must have for this wrapper (``optcore.plan`` asks)."""
        return torch.bfloat16 if hparams.get("precision") == "bf16" else torch.float16

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        loss_scaler: LossScalerConfig | DynamicLossScaler | Mapping[str, Any] | None,
        precision: str,
    ) -> None:
        name = type(self).__name__
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise ConfigError(
                f"{name} wraps a torch.optim.Optimizer built on the model's parameters; got "
                f"{type(optimizer).__name__}. Build it first, e.g. "
                "optcore.build_optimizer({'type': 'AdamW'}, model).",
                target=name,
            )
        if isinstance(optimizer, PrecisionWrapper):
            raise ConfigError(
                f"{name} cannot wrap another precision wrapper ({type(optimizer).__name__}).", target=name
            )
        if not self.steps_local_shards:
            refuse_sharded(name, optimizer)
        if len(optimizer.state) > 0 and not constructor_state(optimizer):
            raise ConfigError(
                f"{name} needs a fresh {type(optimizer).__name__} (empty state): its state would belong to the "
                "model's half-precision tensors. Wrap the optimizer before the first step, and restore a "
                "checkpoint through the wrapper's load_state_dict.",
                target=name,
            )
        self.optimizer = optimizer
        self.precision = precision
        self._check_param_dtypes()
        if precision == "bf16":
            if loss_scaler is not None:
                raise ConfigError(
                    f"{name}: precision='bf16' takes no loss_scaler (bf16 has fp32's exponent range, so gradients "
                    "do not underflow); drop loss_scaler, or use precision='fp16'.",
                    problems=[("loss_scaler", "not used with bf16")],
                    target=name,
                )
            self.scaler: DynamicLossScaler | None = None
        elif isinstance(loss_scaler, DynamicLossScaler):
            self.scaler = loss_scaler
        else:
            self.scaler = DynamicLossScaler.from_config(loss_scaler)  # type: ignore[arg-type]
        if self.scaler is not None:
            self.scaler.limit_to(self._narrowest_grad_dtype())
        self._init_torch_bookkeeping()
        self.last_step_skipped = False
        self._warned_unscaled = False
        self._reset_cycle()

    # ------------------------------------------------------ torch.optim surface
    def _init_torch_bookkeeping(self) -> None:
        """What ``torch.optim.Optimizer.__init__`` sets up, without its
        ``add_param_group`` (the groups come from the inner optimizer)."""
        self._optimizer_step_pre_hooks: dict[int, Callable[..., Any]] = OrderedDict()
        self._optimizer_step_post_hooks: dict[int, Callable[..., Any]] = OrderedDict()
        self._optimizer_state_dict_pre_hooks = OrderedDict()
        self._optimizer_state_dict_post_hooks = OrderedDict()
        self._optimizer_load_state_dict_pre_hooks = OrderedDict()
        self._optimizer_load_state_dict_post_hooks = OrderedDict()
        self._patch_step_function()

    @property  # type: ignore[override]
    def defaults(self) -> dict[str, Any]:
        return self.optimizer.defaults

    @property  # type: ignore[override]
    def state(self) -> Any:
        """The inner optimizer's state (keyed by the tensors it steps)."""
        return self.optimizer.state

    def get_lr(self) -> Any:
        """The inner optimizer's, which may know the step size it applied where
        the group has no lr (relative-step Adafactor)."""
        return self.optimizer.get_lr() if is_contract(self.optimizer) else super().get_lr()

    def get_lrs(self) -> list[Any]:
        return self.optimizer.get_lrs() if is_contract(self.optimizer) else super().get_lrs()

    @property  # type: ignore[override]
    def supports_groups(self) -> bool:
        return bool(getattr(self.optimizer, "supports_groups", False))

    @property  # type: ignore[override]
    def sharding(self) -> str:
        """The inner optimizer's: the wrapper casts and scales element by element."""
        return str(getattr(self.optimizer, "sharding", "unknown"))

    def __getstate__(self) -> dict[str, Any]:
        return dict(self.__dict__)

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._patch_step_function()

    def __repr__(self) -> str:
        scale = f", loss_scale={self.scaler.loss_scale:g}" if self.scaler is not None else ""
        return (
            f"{type(self).__name__}(precision={self.precision}{self._repr_extra()}{scale}) wrapping {self.optimizer!r}"
        )

    def _repr_extra(self) -> str:
        return ""

    # ---------------------------------------------------------------- reports
    @property
    def loss_scale(self) -> float | None:
        """The current loss scale (``None`` for bf16, which needs none)."""
        return None if self.scaler is None else self.scaler.loss_scale

    @property
    def skipped_steps(self) -> int:
        """Steps skipped because the gradients overflowed."""
        return 0 if self.scaler is None else self.scaler.skipped_steps

    # -------------------------------------------------------------- gradients
    def _reset_cycle(self) -> None:
        """Forget everything about the current gradients (after zero_grad or a step)."""
        self._grads_scale: float | None = None  # the loss scale the grads carry
        self._multiply_factor = 1.0  # multiply_grads and clipping, folded
        self._overflow: bool | None = None  # known result of a check over all groups
        self._stepped = False

    def _model_grads(self, groups: Sequence[Mapping[str, Any]] | None = None) -> list[Tensor]:
        groups = self.param_groups if groups is None else groups
        return [p.grad for g in groups for p in g["params"] if p.grad is not None]

    def backward(self, loss: Tensor) -> None:
        """``backward`` of the loss times the current loss scale."""
        if self._stepped:  # the grads of the last step were consumed by a partial step
            self._reset_cycle()
        if self.scaler is None:
            loss.backward()
            self._grads_scale = 1.0
        else:
            self._grads_scale = self.scaler.loss_scale
            self.scaler.scale(loss).backward()

    def multiply_grads(self, c: float | Tensor) -> None:
        """Multiply the gradients by ``c``: folded into the step's one factor."""
        self._multiply_factor *= float(c)

    def clip_grad_norm(
        self,
        max_norm: float,
        aggregate_norm_fn: Callable[[Tensor], Tensor] | None = None,
    ) -> Tensor:
        """The true (unscaled) total gradient norm; clipping to ``max_norm``
        (if > 0) is folded into the step's factor. A non-finite norm marks the
        step as overflowed, so :meth:`step` skips it without a second check."""
        grads = self._model_grads()
        if not grads:
            return torch.zeros(())
        total = total_grad_norm(grads) * (self._multiply_factor / self._current_grads_scale())
        if aggregate_norm_fn is not None:
            total = aggregate_norm_fn(total)
        finite = bool(torch.isfinite(total))
        if self.scaler is not None:
            self._overflow = not finite
        if max_norm > 0 and finite:
            self._multiply_factor *= min(1.0, max_norm / (float(total) + 1e-6))
        return total

    def _current_grads_scale(self) -> float:
        if self._grads_scale is not None:
            return self._grads_scale
        if self.scaler is not None and not self._warned_unscaled:
            warnings.warn(
                f"{type(self).__name__}: gradients were not produced by optimizer.backward(loss), so the loss "
                "was not scaled and fp16 gradients may underflow; call optimizer.backward(loss) instead of "
                "loss.backward(). The step treats these gradients as unscaled.",
                stacklevel=3,
            )
            self._warned_unscaled = True
        return 1.0

    # ------------------------------------------------------------------- step
    @torch.no_grad()
    def step(  # type: ignore[override]
        self,
        closure: Callable[[], float] | None = None,
        scale: float = 1.0,
        groups: GroupSelector = None,
    ) -> float | None:
        """Skip the step if the gradients overflowed (parameters and optimizer
        state untouched, loss scale lowered); otherwise step the inner optimizer
        with every pending factor folded into its ``scale``. The contract's
        preamble runs first; traced by torch.compile it leaves the gradients'
        checks to the inner optimizer (it cannot trace FP16Optimizer's group
        views, which a check of every parameter reads)."""
        prepared = prepare_step(self, closure, scale, groups, check_grads=not torch.compiler.is_compiling())
        if prepared.skip:
            return prepared.loss
        indices = prepared.indices
        inner_scale = self._current_grads_scale() * prepared.scale / self._multiply_factor
        if self.scaler is None:
            overflow = not self._step_inner(indices, inner_scale, check=False)
        elif self._overflow:  # clip_grad_norm already saw a non-finite norm
            overflow = True
        else:  # check here unless clip_grad_norm already found the grads finite
            overflow = not self._step_inner(indices, inner_scale, check=self._overflow is None)
        self.last_step_skipped = overflow
        if self.scaler is not None:
            self.scaler.update(overflow)  # raises MinimumLossScaleError (a FloatingPointError) at the minimum
        if groups is None:
            self._reset_cycle()
        else:
            self._stepped = True
        return prepared.loss

    def _step_inner(self, indices: list[int] | None, scale: float, check: bool) -> bool:
        """Step the inner optimizer on the groups ``indices`` (None: all), with
        gradients divided by ``scale``; with ``check``, first look for inf/NaN
        and return False without stepping if there is any."""
        raise NotImplementedError

    def _call_inner_step(self, indices: list[int] | None, scale: float, grads: Callable[[], list[Tensor]]) -> None:
        """``inner.step(scale=..., groups=...)`` for a contract optimizer; a plain
        torch optimizer gets its gradients unscaled by one fused multiply first."""
        if is_contract(self.optimizer):
            self.optimizer.step(scale=scale, groups=indices)
            return
        if indices is not None and len(indices) != len(self.param_groups):
            raise StepError(
                f"{type(self).__name__}: step(groups=...) needs an optcore optimizer; {type(self.optimizer).__name__} "
                "steps all groups. Build it with optcore.build_optimizer."
            )
        if scale != 1.0:
            for bucket in by_device_and_dtype(grads()).values():
                torch._foreach_mul_(bucket, 1.0 / scale)
        self.optimizer.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear the model's gradients and forget the pending factors."""
        grads = []
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                if set_to_none:
                    p.grad = None
                else:
                    p.grad.detach_().requires_grad_(False)
                    grads.append(p.grad)
        for bucket in by_device_and_dtype(grads).values():
            torch._foreach_zero_(bucket)
        self._reset_cycle()

    # ------------------------------------------------------------- checkpoint
    def state_dict(self) -> dict[str, Any]:  # type: ignore[override]
        """The inner optimizer's state dict plus the loss scaler's state and the
        wrapper's layout, all loadable with ``torch.load(weights_only=True)``."""
        sd = dict(self.optimizer.state_dict())
        sd[WRAPPER_KEY] = {"type": type(self).__name__, "precision": self.precision, **self._layout()}
        if self.scaler is not None:
            sd[SCALER_KEY] = self.scaler.state_dict()
            sd["loss_scale"] = self.scaler.loss_scale  # where fairseq keeps it
        return sd

    def load_state_dict(  # type: ignore[override]
        self,
        state_dict: Mapping[str, Any],
        optimizer_overrides: Mapping[str, Any] | None = None,
    ) -> None:
        """Load a state dict from :meth:`state_dict` (or a bare inner-optimizer
        one); ``optimizer_overrides`` replaces hyper-parameters of the loaded groups."""
        if not isinstance(state_dict, Mapping):
            raise ConfigError(f"{type(self).__name__}.load_state_dict takes a state_dict (a mapping), got "
                              f"{type(state_dict).__name__}.", target=type(self).__name__)
        sd = dict(state_dict)
        info = sd.pop(WRAPPER_KEY, None) or {}
        scaler_state = sd.pop(SCALER_KEY, None)
        fairseq_scale = sd.pop("loss_scale", None)
        extras = self._pop_extras(sd)
        if not isinstance(info, Mapping):
            raise ConfigError(
                f"{type(self).__name__} cannot load this state: its {WRAPPER_KEY!r} entry is a "
                f"{type(info).__name__}, not the wrapper's layout. The checkpoint is damaged or was edited; load it as "
                "it was saved.", problems=[(WRAPPER_KEY, "not a mapping")], target=type(self).__name__,
            )
        if scaler_state is None and fairseq_scale is not None and not _positive_finite(fairseq_scale):
            raise ConfigError(
                f"{type(self).__name__} cannot load this state: its loss_scale is {repr(fairseq_scale)[:40]}, not a "
                "finite number > 0 (every step would overflow or be skipped). The checkpoint is damaged or was "
                "edited; load it as it was saved.", problems=[("loss_scale", "not a finite number > 0")],
                target=type(self).__name__,
            )
        self._check_layout(info)
        self._check_extras(extras)  # before anything is loaded: a failed load changes nothing
        if self.scaler is not None and scaler_state is not None:
            self.scaler.parse_state(scaler_state)
        try:
            if is_contract(self.optimizer):
                self.optimizer.load_state_dict(sd, optimizer_overrides)
            else:
                self.optimizer.load_state_dict(sd)
                for group in self.optimizer.param_groups:
                    group.update(optimizer_overrides or {})
        except ConfigError as exc:
            if not any(field == "param_groups" for field, _ in exc.problems):
                raise
            raise ConfigError(  # the groups differ: the wrapper knows which layout would fit
                f"{type(self).__name__} cannot load this optimizer state: {exc.message} {self._layout_hint()}",
                exc.problems, target=type(self).__name__,
            ) from exc
        except (ValueError, KeyError, TypeError, IndexError, AttributeError) as exc:
            said = repr(f"{type(exc).__name__}: {exc}"[:300])[1:-1]  # its text may quote the checkpoint's: escaped
            raise ConfigError(
                f"{type(self).__name__} cannot load this optimizer state: {said}. {self._layout_hint()}",
                target=type(self).__name__,
            ) from exc
        if self.scaler is not None:
            if scaler_state is not None:
                self.scaler.load_state_dict(scaler_state)
            elif fairseq_scale is not None:
                self.scaler.loss_scale = float(fairseq_scale)
        self._load_extras(extras, sd)
        self._reset_cycle()

    def _layout(self) -> dict[str, Any]:
        return {}

    def _layout_hint(self) -> str:
        return "Load a checkpoint of the same model and optimizer."

    def _check_layout(self, info: Mapping[str, Any]) -> None:
        pass

    def _pop_extras(self, sd: dict[str, Any]) -> Any:
        return None

    def _check_extras(self, extras: Any) -> None:
        pass

    def _load_extras(self, extras: Any, sd: Mapping[str, Any]) -> None:
        pass

    # ---------------------------------------------------------------- helpers
    def _narrowest_grad_dtype(self) -> torch.dtype:
        """The trainable parameters' dtype with the smallest range: the loss scale must fit in it."""
        dtypes = {p.dtype for g in self.optimizer.param_groups for p in g["params"] if p.requires_grad}
        floating = [d for d in dtypes if d.is_floating_point] or [torch.float16]
        return min(floating, key=lambda d: torch.finfo(d).max)

    def _check_param_dtypes(self) -> None:
        """Reject a model converted to the other half type; warn about one that
        was not converted at all (it trains, but gains nothing)."""
        want = _HALF[self.precision]
        other = _HALF["bf16" if self.precision == "fp16" else "fp16"]
        dtypes = {p.dtype for g in self.optimizer.param_groups for p in g["params"] if p.requires_grad}
        name = type(self).__name__
        if other in dtypes:
            raise ConfigError(
                f"{name}: precision={self.precision!r}, but some parameters are {other}; convert the model with "
                f"model.to({want}) or set precision={'bf16' if other == torch.bfloat16 else 'fp16'!r}.",
                problems=[("precision", f"parameters are {other}")],
                target=name,
            )
        if want not in dtypes:
            warnings.warn(
                f"{name}: precision={self.precision!r}, but no trainable parameter is {want} (found "
                f"{sorted(map(str, dtypes))}). Convert the model first (model.to({want})) to save memory and "
                "time; as it is, training runs in the parameters' own precision, with the wrapper's overhead.",
                stacklevel=3,
            )


def _positive_finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0

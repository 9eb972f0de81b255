"""FP16Optimizer: an fp32 master copy of half-precision parameters.

The model computes in fp16 (or bf16); the inner optimizer steps an fp32 copy of
the parameters, so small updates are not lost to rounding. Per step:

1. ``backward(loss)`` — gradients of ``loss * loss_scale`` (fp16 only);
2. ``step()`` — copy the fp16 gradients into the fp32 master gradients (one
   fused copy) and look for inf/NaN in the cheapest pass that applies, with
   ``loss_scale / (clip and multiply factors)`` handed to the inner step as
   ``scale`` (or divided out in the check's pass); skip the step on inf/NaN;
   else step the inner optimizer and copy the fp32 parameters back to the model.

The master copy is flat — one contiguous buffer per param group and device —
when the inner optimizer ``supports_flat_params`` (pointwise updates), so the
copies and the update are a few large kernels; per-tensor otherwise.

The fp32 copy is what steps, but the model's weights stay the user's: a weight
changed since the wrapper last wrote it (``model.load_state_dict(...)`` after
the build, an in-place edit under ``torch.no_grad()``, ``p.data = ...``) is
taken into the fp32 copy before the next step, instead of being overwritten
by it. The change is seen through the parameter's version counter and memory
address; an in-place edit through ``p.data`` bumps no counter, so it stays
invisible (make it under ``torch.no_grad()`` instead), and so does any edit
while ``opt.step`` runs compiled (traced code reads neither).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from torch import Tensor

from optcore import ConfigError
from optcore.plugin import in_dcp_get, validate_hparams

from ._wrapper import WRAPPER_KEY, ParamGroupView, PrecisionWrapper, check_inner_state, is_contract, non_finite
from .loss_scaler import DynamicLossScaler
from .schemas import FP16OptimizerConfig, LossScalerConfig

MASTER_KEY = "fp32_params"


@dataclass
class _Masters:
    """The fp32 copy of one param group's trainable parameters."""

    params: list[Tensor]  # the model's trainable parameters of the group
    tensors: list[Tensor] = field(default_factory=list)  # what the inner optimizer steps
    views: list[Tensor] = field(default_factory=list)  # per model parameter: its fp32 value
    grad_views: list[Tensor] = field(default_factory=list)  # per model parameter: its fp32 grad (flat only)
    spans: list[tuple[int, int, int]] = field(default_factory=list)  # per model parameter: (buffer, start, end)
    #: per model parameter: (version counter, address) when the wrapper last wrote it or took it in;
    #: None after a step traced by torch.compile, which can read neither
    seen: list[tuple[int, int]] | None = field(default_factory=list)

    def mark(self) -> None:
        """The model's parameters and the fp32 copy agree now."""
        self.seen = None if torch.compiler.is_compiling() else [(p._version, p.data_ptr()) for p in self.params]

    @torch.no_grad()
    def take_edits(self) -> None:
        """Weights changed since :meth:`mark` to another value than the copy's
        rounding become the fp32 copy's value (not seen under torch.compile,
        nor right after a compiled step)."""
        if self.seen is None or torch.compiler.is_compiling():
            self.mark()
            return
        now = [(p._version, p.data_ptr()) for p in self.params]
        changed = [(p, v) for p, v, seen, current in zip(self.params, self.views, self.seen, now) if current != seen]
        for p, v in changed:
            if p.shape != v.shape:
                raise ConfigError(
                    f"A parameter of shape {tuple(v.shape)} was replaced by one of shape {tuple(p.shape)} after "
                    "FP16Optimizer was built; build the optimizer again for the new model."
                )
        # A write of the value the copy already rounds to (a checkpoint loading the
        # model after the optimizer, as DCP's set_state_dict does) is not an edit:
        # the fp32 copy keeps the bits the half-precision weight cannot hold.
        edited = [(p, v) for p, v in changed if not torch.equal(p.detach(), v.to(p.dtype))]
        if edited:
            torch._foreach_copy_([v for _, v in edited], [p.detach() for p, _ in edited])
        self.mark()

    def __getstate__(self) -> dict[str, Any]:
        """With the masters' gradients, which a pickled tensor leaves out (a
        flat buffer's grad is what ``grad_views`` are views of)."""
        return {**self.__dict__, "_grads": [t.grad for t in self.tensors]}

    def __setstate__(self, state: dict[str, Any]) -> None:
        grads = state.pop("_grads", None) or []
        self.__dict__.update(state)
        for t, g in zip(self.tensors, grads):
            t.grad = g
        self.mark()  # new tensors, new addresses: the copy and the model agree as saved


def _flat_masters(params: list[Tensor]) -> _Masters:
    """One contiguous fp32 buffer (and grad buffer) per device. Master tensors
    do not require grad: autograd never sees them, and their views stay plain
    tensors (which deep-copy and pickle)."""
    masters = _Masters(params)
    by_device: dict[torch.device, list[int]] = {}
    for i, p in enumerate(params):
        by_device.setdefault(p.device, []).append(i)
    views: list[Tensor | None] = [None] * len(params)
    grad_views: list[Tensor | None] = [None] * len(params)
    spans: list[tuple[int, int, int]] = [(0, 0, 0)] * len(params)
    for buffer, (device, idx) in enumerate(by_device.items()):
        total = sum(params[i].numel() for i in idx)
        flat = torch.empty(total, dtype=torch.float32, device=device)
        flat.grad = torch.zeros_like(flat)
        offset = 0
        for i in idx:
            n = params[i].numel()
            views[i] = flat[offset : offset + n].view_as(params[i])
            grad_views[i] = flat.grad[offset : offset + n].view_as(params[i])
            spans[i] = (buffer, offset, offset + n)
            offset += n
        masters.tensors.append(flat)
    masters.views = [v for v in views if v is not None]
    masters.grad_views = [v for v in grad_views if v is not None]
    masters.spans = spans
    with torch.no_grad():
        torch._foreach_copy_(masters.views, [p.detach() for p in params])
    return masters


def _is_flat(value: Any, buffer: Tensor) -> bool:
    """Whether a state entry has one element per element of the flat buffer."""
    return isinstance(value, Tensor) and value.dim() == 1 and value.numel() == buffer.numel() and value.numel() > 1


def _per_tensor_masters(params: list[Tensor]) -> _Masters:
    tensors = [p.detach().to(torch.float32, copy=True) for p in params]
    return _Masters(params, tensors, list(tensors))


class FP16Optimizer(PrecisionWrapper):
    """Mixed-precision training with an fp32 master copy of the parameters.

    Args:
        optimizer: an optimizer freshly built on the model's fp16/bf16
            parameters (its ``param_groups`` are re-pointed to the fp32 copy;
            state its constructor made, as torch's Adagrad's, is made again there).
        loss_scaler: options of the :class:`DynamicLossScaler` (fp16 only), or one.
        precision: ``"fp16"`` (dynamic loss scaling) or ``"bf16"`` (none needed).
        flat: one flat fp32 buffer per param group and device. Default: when
            the optimizer ``supports_flat_params``; asking for it when it does
            not is a ConfigError.

    A parameter without a gradient is left alone, as torch optimizers do: with a
    flat copy (which has no "missing" entries) its slices of the master and of
    the optimizer's per-element state are put back after the step.
    """

    config_schema: ClassVar[type[FP16OptimizerConfig]] = FP16OptimizerConfig

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        loss_scaler: LossScalerConfig | DynamicLossScaler | Mapping[str, Any] | None = None,
        precision: str = "fp16",
        flat: bool | None = None,
    ) -> None:
        given_scaler = loss_scaler if isinstance(loss_scaler, DynamicLossScaler) else None
        opts = validate_hparams(
            self.config_schema,
            {"loss_scaler": None if given_scaler else loss_scaler, "precision": precision, "flat": flat},
            "FP16Optimizer",
        )
        super().__init__(optimizer, given_scaler or opts["loss_scaler"], opts["precision"])
        self.flat = self._choose_flat(opts["flat"])
        self._masters: list[_Masters] = []
        self.param_groups = []
        for group in optimizer.param_groups:
            self._attach(group)

    def _choose_flat(self, flat: bool | None) -> bool:
        supported = bool(getattr(self.optimizer, "supports_flat_params", False))
        if flat and not supported:
            name = type(self.optimizer).__name__
            reason = getattr(self.optimizer, "flat_params_unsupported_reason", None) or (
                f"{name} does not declare supports_flat_params (its update may depend on each parameter's shape)."
            )
            raise ConfigError(
                f"FP16Optimizer: flat=True, but {name} cannot step one flat parameter. {reason} "
                "Drop flat (a per-tensor fp32 copy is then used).",
                problems=[("flat", f"{name} does not support flat params")],
                target="FP16Optimizer",
            )
        return supported if flat is None else flat

    def _attach(self, inner_group: dict[str, Any]) -> None:
        """Make the fp32 copy of ``inner_group``'s parameters and re-point the
        group to it; the wrapper's view of the group keeps the model's tensors."""
        model_params = list(inner_group["params"])
        trainable = [p for p in model_params if p.requires_grad]
        masters = (_flat_masters if self.flat else _per_tensor_masters)(trainable) if trainable else _Masters([])
        self._move_state(trainable, inner_group, masters)
        inner_group["params"] = masters.tensors
        masters.mark()
        self._masters.append(masters)
        self.param_groups.append(ParamGroupView(inner_group, model_params))

    def _move_state(self, params: list[Tensor], inner_group: dict[str, Any], masters: _Masters) -> None:
        """The state the inner optimizer's constructor made for the model's
        parameters (see :func:`constructor_state`; torch's Adagrad's ``sum``),
        made again over the fp32 copy by the same constructor with the group's
        values: a cast would keep the half-precision rounding of its initial
        value (0.1 is 0.1001 in bf16)."""
        state = self.optimizer.state
        if not any(p in state for p in params):
            return
        for p in params:
            state.pop(p, None)
        cls = type(self.optimizer)
        values = {k: inner_group[k] for k in self.optimizer.defaults if k in inner_group}
        try:
            fresh = cls([{"params": masters.tensors}], **values)
        except Exception as exc:  # any constructor's refusal
            raise ConfigError(
                f"{type(self).__name__}: {cls.__name__}'s constructor made state for the model's half-precision "
                f"parameters, and making it again over the fp32 copy failed ({type(exc).__name__}: {exc}). "
                "Use an optimizer that creates its state on the first step, or precision=None.",
                target=type(self).__name__,
            ) from exc
        state.update(fresh.state)

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Add model parameters: their fp32 copy joins the inner optimizer as a new group."""
        group = dict(param_group)
        params = group["params"]
        group["params"] = [params] if isinstance(params, Tensor) else list(params)
        model_params = group["params"]
        self.optimizer.add_param_group(group)
        inner_group = self.optimizer.param_groups[-1]
        inner_group["params"] = model_params
        self._attach(inner_group)

    def _repr_extra(self) -> str:
        return f", flat={self.flat}"

    # ------------------------------------------------------------------- step
    def _step_inner(self, indices: list[int] | None, scale: float, check: bool) -> bool:
        selected = self._masters if indices is None else [self._masters[i] for i in indices]
        check_inner_state(self, [t for m in selected for t in m.tensors])
        for m in selected:
            m.take_edits()
        found, scale = self._torch_copy(selected, scale, check)
        if check and found:
            return False
        grads = [t.grad for m in selected for t in m.tensors if t.grad is not None]
        held = [kept for m in selected for kept in self._hold_gradless(m)] if self.flat else []
        self._call_inner_step(indices, scale, lambda: grads)
        for dst, saved in held:
            dst.copy_(saved)
        for m in selected:
            if all(p.grad is not None for p in m.params):
                if m.params:
                    torch._foreach_copy_(m.params, m.views)
                continue
            # a parameter without a gradient is left as it is (an fp64 one would be
            # rounded to its fp32 master copy otherwise)
            stepped = [(p, v) for p, v in zip(m.params, m.views) if p.grad is not None]
            if stepped:
                torch._foreach_copy_([p for p, _ in stepped], [v for _, v in stepped])
        for m in selected:
            m.mark()
        return True

    def _torch_copy(self, selected: list[_Masters], scale: float, check: bool) -> tuple[bool, float]:
        """The fp16 grads into the fp32 master grads with torch ops: a fused copy,
        plus the check in the cheapest pass that applies. Returns (inf/NaN seen, the scale left for the inner step)."""
        folds = self._inner_folds_scale()
        if check and folds and not self.flat and non_finite(self._model_grads_of(selected)):
            return True, scale  # per-tensor: the fp16 grads are half the bytes of the fp32 copies
        for m in selected:
            self._grads_to_master(m)
        if not check or (folds and not self.flat):
            return False, scale
        grads = [t.grad for m in selected for t in m.tensors if t.grad is not None]
        if folds:
            # read-only: an fp32 sum of fp16-born values cannot overflow, so it is
            # finite exactly when every element is; the inner step unscales
            return not bool(torch.isfinite(torch.stack([g.sum() for g in grads]).sum())), scale
        # the inner step would unscale in a pass of its own: unscale in the check's pass
        return non_finite(grads, unscale=1.0 / scale), 1.0

    def _inner_folds_scale(self) -> bool:
        return is_contract(self.optimizer) and bool(getattr(self.optimizer, "supports_step_with_scale", False))

    @staticmethod
    def _model_grads_of(masters: list[_Masters]) -> list[Tensor]:
        return [p.grad for m in masters for p in m.params if p.grad is not None]

    def _grads_to_master(self, m: _Masters) -> None:
        """fp16 grads -> fp32 master grads, one fused copy. A parameter without a
        gradient gets a zero slot (flat) or no master gradient (per-tensor)."""
        src = [p.grad for p in m.params]
        if self.flat and all(g is not None for g in src):
            torch._foreach_copy_(m.grad_views, src)
            return
        dst = []
        for i, grad in enumerate(src):
            if grad is not None:
                if self.flat:
                    dst.append(m.grad_views[i])
                else:
                    master = m.tensors[i]
                    if master.grad is None:
                        master.grad = torch.empty_like(master)
                    dst.append(master.grad)
            elif self.flat:
                m.grad_views[i].zero_()
            else:
                m.tensors[i].grad = None
        if dst:
            torch._foreach_copy_(dst, [g for g in src if g is not None])

    def _hold_gradless(self, m: _Masters) -> list[tuple[Tensor, Tensor]]:
        """(slice, copy) of the master and per-element state of every parameter
        without a gradient, to restore after the step (usually none)."""
        held = []
        for i, p in enumerate(m.params):
            if p.grad is not None:
                continue
            buffer, start, end = m.spans[i]
            flat = m.tensors[buffer]
            targets = [flat] + [
                v
                for v in self.optimizer.state.get(flat, {}).values()
                if isinstance(v, Tensor) and v.shape == flat.shape and v.is_floating_point()
            ]
            held += [(t[start:end], t[start:end].clone()) for t in targets]
        return held

    # -------------------------------------------------------------- distributed
    @torch.no_grad()
    def average_params(self, group: Any = None) -> None:
        """Average the fp32 master copy (and the inner state) over ranks, then
        refresh the model's parameters from it."""
        for m in self._masters:
            m.take_edits()
        if hasattr(self.optimizer, "average_params"):
            self.optimizer.average_params(group)
        for m in self._masters:
            if m.params:
                torch._foreach_copy_(m.params, m.views)
            m.mark()

    # ------------------------------------------------------------- checkpoint
    def state_dict(self) -> dict[str, Any]:  # type: ignore[override]
        """Also holds the fp32 master parameters, so a resumed run continues the
        exact trajectory instead of restarting from the rounded fp16 weights.
        For torch.distributed.checkpoint, which files state by parameter name,
        a flat copy's state and masters are given per model parameter."""
        sd = super().state_dict()
        sd[MASTER_KEY] = [list(m.tensors) for m in self._masters]
        if self.flat and in_dcp_get():
            sd = self._per_parameter(sd)
        return sd

    def load_state_dict(  # type: ignore[override]
        self, state_dict: Mapping[str, Any], optimizer_overrides: Mapping[str, Any] | None = None
    ) -> None:
        info = state_dict.get(WRAPPER_KEY) if isinstance(state_dict, Mapping) else None
        if self.flat and isinstance(info, Mapping) and info.get("per_parameter"):
            state_dict = self._flat_again(state_dict)
        super().load_state_dict(state_dict, optimizer_overrides)

    def _per_parameter(self, sd: dict[str, Any]) -> dict[str, Any]:
        """``sd`` with one state entry (slices of the flat state) and one fp32
        master per model parameter, numbered as the wrapper's param groups."""
        state: dict[int, Any] = {}
        groups, masters, index = [], [], 0
        for saved, view, m in zip(sd["param_groups"], self.param_groups, self._masters):
            trainable = {id(p): j for j, p in enumerate(m.params)}
            ids = []
            for p in view["params"]:
                ids.append(index)
                j = trainable.get(id(p))
                if j is not None:
                    b, start, end = m.spans[j]
                    flat_state = sd["state"].get(saved["params"][b], {})
                    state[index] = {
                        k: v[start:end].view(p.shape) if _is_flat(v, m.tensors[b]) else v for k, v in flat_state.items()
                    }
                index += 1
            groups.append({**saved, "params": ids})
            masters.append(list(m.views))
        return {**sd, "state": state, "param_groups": groups, MASTER_KEY: masters,
                WRAPPER_KEY: {**sd[WRAPPER_KEY], "per_parameter": True}}

    def _flat_again(self, sd: Mapping[str, Any]) -> dict[str, Any]:
        """The inverse of :meth:`_per_parameter`: each flat buffer's state and
        master from its parameters' entries, in the buffer's order."""
        state: dict[int, Any] = {}
        groups, masters, index = [], [], 0
        per_param_masters = sd.get(MASTER_KEY)
        for g, (saved, view, m) in enumerate(zip(sd["param_groups"], self.param_groups, self._masters)):
            position = {id(p): k for k, p in enumerate(view["params"])}
            buffers, flat_masters = [], []
            for b in range(len(m.tensors)):
                members = [j for j, span in enumerate(m.spans) if span[0] == b]
                entries = [sd["state"].get(saved["params"][position[id(m.params[j])]]) for j in members]
                if all(e is not None for e in entries) and entries:
                    state[index] = {
                        k: torch.cat([e[k].reshape(-1) for e in entries])
                        if isinstance(v, Tensor) and v.shape == m.params[members[0]].shape else v
                        for k, v in entries[0].items()
                    }
                if per_param_masters is not None:
                    flat_masters.append(torch.cat([per_param_masters[g][j].reshape(-1) for j in members]))
                buffers.append(index)
                index += 1
            groups.append({**saved, "params": buffers})
            masters.append(flat_masters)
        out = {**sd, "state": state, "param_groups": groups}
        if per_param_masters is not None:
            out[MASTER_KEY] = masters
        return out

    def _layout(self) -> dict[str, Any]:
        return {"flat": self.flat}

    def _layout_hint(self) -> str:
        if self.flat:
            return (
                "With flat=True the inner optimizer steps one fp32 tensor per param group and device; "
                "a checkpoint of an unwrapped optimizer (one state entry per parameter) loads into "
                "FP16Optimizer(..., flat=False)."
            )
        return "Load a checkpoint of the same model and optimizer."

    def _check_layout(self, info: Mapping[str, Any]) -> None:
        saved = info.get("flat")
        if saved is not None and bool(saved) != self.flat:
            raise ConfigError(
                f"This checkpoint was saved by an FP16Optimizer with flat={bool(saved)}, but this one has "
                f"flat={self.flat}: the inner optimizer's state is laid out differently. Build the wrapper "
                f"with flat={bool(saved)}.",
                problems=[("flat", "differs from the checkpoint")],
                target="FP16Optimizer",
            )

    def _pop_extras(self, sd: dict[str, Any]) -> Any:
        return sd.pop(MASTER_KEY, None)

    def _check_extras(self, extras: Any) -> None:
        """The checkpoint's fp32 master parameters must match this model's, tensor
        by tensor: a ConfigError naming the first that does not."""
        if extras is None:
            return
        if not isinstance(extras, (list, tuple)) or not all(isinstance(s, (list, tuple)) for s in extras):
            raise ConfigError(
                f"FP16Optimizer cannot load this state: its {MASTER_KEY!r} is not a list of tensors per param group. "
                "The checkpoint is damaged or was edited; load the one that was saved.",
                problems=[(MASTER_KEY, "not a list of lists")], target="FP16Optimizer",
            )
        if len(extras) != len(self._masters):
            raise ConfigError(
                f"FP16Optimizer cannot load this state: it has fp32 parameters for {len(extras)} param groups, this "
                f"optimizer has {len(self._masters)}. Load a checkpoint of the same model and configuration.",
                problems=[(MASTER_KEY, "number of param groups differs")], target="FP16Optimizer",
            )
        for index, (saved, m) in enumerate(zip(extras, self._masters)):
            names = self.param_groups[index].get("param_names")
            for j in range(max(len(saved), len(m.tensors))):
                have = m.tensors[j] if j < len(m.tensors) else None
                got = saved[j] if j < len(saved) else None
                if have is not None and isinstance(got, Tensor) and got.shape == have.shape:
                    continue
                if self.flat:
                    what = (f"the flat fp32 buffer #{j} of param group {index} (the group's parameters: "
                            f"{[tuple(p.shape) for p in m.params]})")
                else:
                    name = f"{names[j]!r} " if names and j < len(names) else ""
                    what = f"the fp32 copy of parameter {name}(#{j} of param group {index})"
                raise ConfigError(
                    f"FP16Optimizer cannot load this state: {what} has shape "
                    f"{None if have is None else tuple(have.shape)} here but "
                    f"{tuple(got.shape) if isinstance(got, Tensor) else 'none'} in the checkpoint. It is a checkpoint of "
                    "another model; load it into the model it was saved from.",
                    problems=[(MASTER_KEY, f"group {index} tensor {j}: shape differs")], target="FP16Optimizer",
                )

    @torch.no_grad()
    def _load_extras(self, extras: Any, sd: Mapping[str, Any]) -> None:
        """Restore the fp32 masters (or rebuild them from the model's weights for
        a checkpoint without them), then make the model match them."""
        # torch's load_state_dict replaced the inner group dicts: follow them
        for view, inner_group in zip(self.param_groups, self.optimizer.param_groups):
            view.inner = inner_group
        for i, m in enumerate(self._masters):
            if not m.params:
                continue
            if extras is not None:
                saved = extras[i]
                torch._foreach_copy_(m.tensors, [s.to(t.device) for s, t in zip(saved, m.tensors)])
                torch._foreach_copy_(m.params, m.views)
            else:
                torch._foreach_copy_(m.views, [p.detach() for p in m.params])
            m.mark()

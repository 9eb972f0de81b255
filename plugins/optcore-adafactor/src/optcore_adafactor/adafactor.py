"""Adafactor: Adaptive Learning Rates with Sublinear Memory Cost.

Shazeer & Stern (2018), https://arxiv.org/abs/1804.04235, Algorithms 4 and 5,
with the choices of fairseq and Hugging Face (``transformers.optimization.
Adafactor``): row/column *means*, ``eps`` added to the squared gradient,
clipping before the optional first moment, decoupled weight decay scaled by the
step size. One difference on purpose: the computed step size is kept in the
parameter's state, never written back into ``group["lr"]`` (fairseq does, which
compounds with LR schedulers).

For a weight X of shape (n, m) with gradient G, at step t (per parameter):

    rho_t   = min(1e-2, 1/sqrt(t))        (min(1e-6 t, 1/sqrt(t)) with warmup_init;
                                           the group's lr when relative_step=False)
    alpha_t = max(eps2, RMS(X_{t-1})) rho_t   (rho_t when scale_parameter=False)
    beta2t  = 1 - t^decay_rate
    R_t = beta2t R + (1 - beta2t) mean_j (G² + eps1)          # n numbers
    C_t = beta2t C + (1 - beta2t) mean_i (G² + eps1)          # m numbers
    U   = G / sqrt(R_t C_t / mean(R_t))                       # vectors: V_t instead
    Û   = U / max(1, RMS(U) / clip_threshold)
    M_t = beta1 M + (1 - beta1) alpha_t Û                     # only with beta1
    X_t = X - weight_decay alpha_t X - (M_t or alpha_t Û)

State per n x m weight: n + m numbers (plus n*m for M with beta1).
"""

from __future__ import annotations

import math
import weakref
from array import array
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, ClassVar

import torch
from torch import Tensor

from optcore import ConfigError
from optcore.plugin import Optimizer, validate_hparams

from . import _cpu_kernel
from ._config import AdafactorConfig
from ._kernels import Workspace, apply_factored_, apply_full_, factored_second_moment_, full_second_moment_
from ._traceable import CompiledUpdates, factored_update_, full_update_, pack_scalars

_LOW_PRECISION = (torch.float16, torch.bfloat16)
#: where each state tensor's pointer sits in what :meth:`_cpu_kernel.Batch.add` returns
_POINTER_SLOT = {"exp_avg": 0, "exp_avg_sq_row": 1, "exp_avg_sq": 1, "exp_avg_sq_col": 2, "RMS": 3}


def relative_step_size(step: int, warmup_init: bool) -> float:
    """rho_t of the paper: min(1e-2, 1/sqrt(t)), or min(1e-6 t, 1/sqrt(t)) with warm-up."""
    return min(1e-6 * step if warmup_init else 1e-2, 1.0 / math.sqrt(step))


def _store_rms(pairs: list[tuple[Tensor, Tensor]]) -> None:
    """RMS(X_{t-1}) into the state of parameters whose step size does not use it
    (``scale_parameter=False``), as Hugging Face's Adafactor stores it, so
    checkpoints match: one fused norm per device and dtype, no host read."""
    for low in (True, False):  # fp16/bf16 accumulated in fp32
        chosen = [(r, p) for r, p in pairs if (p.dtype in _LOW_PRECISION) == low]
        if chosen:
            params = [p for _, p in chosen]
            norms = torch._foreach_norm(params, 2, dtype=torch.float32 if low else None)
            roots = [math.sqrt(max(1, p.numel())) for p in params]
            torch._foreach_copy_([r for r, _ in chosen], torch._foreach_div(list(norms), roots))


def _rms(x: Tensor) -> float:
    """Root mean square, accumulated in at least fp32 (``dot`` is the fastest
    reduction over a contiguous fp32 tensor on CPU)."""
    if x.dtype in _LOW_PRECISION or not x.is_contiguous():
        return float(torch.linalg.vector_norm(x, dtype=torch.float32)) / math.sqrt(x.numel())
    flat = x.view(-1)
    return math.sqrt(float(torch.dot(flat, flat)) / x.numel())


def _placed(value: Tensor, p: Tensor, dtype: torch.dtype) -> bool:
    """Whether state ``value`` already has ``dtype`` and ``p``'s device (checked
    before ``.to()``, which costs microseconds per tensor even when it returns
    ``value`` itself)."""
    return value.dtype == dtype and ((value.is_cpu and p.is_cpu) or value.device == p.device)


class Adafactor(Optimizer):
    """Adafactor with fairseq / Hugging Face semantics and sublinear memory.

    Args:
        params: parameters or param-group dicts.
        lr: external learning rate; only with ``relative_step=False``.
        eps: ``(eps1, eps2)``: regulariser of the squared gradient, least parameter scale.
        clip_threshold: the update's RMS is capped at this value.
        decay_rate: ``c`` in ``beta2_t = 1 - t^c``.
        beta1: first-moment coefficient, or None for no first moment.
        weight_decay: decoupled weight decay, scaled by the step size.
        scale_parameter: multiply the step size by ``max(eps2, RMS(param))``.
        relative_step: compute the step size from the step count instead of ``lr``.
        warmup_init: warm the relative step size up linearly.
        implementation: ``"auto"``, ``"c"``, ``"torch"`` or ``"compiled"`` (see
            :class:`AdafactorConfig`); under ``torch.compile(opt.step)`` the
            traceable torch ops run whatever is chosen.

    An external LR scheduler needs ``relative_step=False, scale_parameter=False``
    and an ``lr``. In relative-step mode ``group["lr"]`` stays ``None``, and
    :meth:`get_lr` reports the step size last applied to the first parameter.

    The per-parameter state has exactly Hugging Face's keys (``step``,
    ``exp_avg`` with beta1, ``exp_avg_sq_row`` and ``exp_avg_sq_col`` or
    ``exp_avg_sq``, ``RMS``), so checkpoints move both ways.
    """

    config_schema: ClassVar[type[AdafactorConfig]] = AdafactorConfig
    supports_memory_efficient_fp16: ClassVar[bool] = True
    supports_step_with_scale: bool = True
    supports_flat_params: ClassVar[bool] = False
    supports_groups: ClassVar[bool] = True
    #: row and column statistics, RMS terms and update clipping are over each whole tensor
    sharding: ClassVar[str] = "factored"
    #: What a wrapper that flattens parameters should tell the user.
    flat_params_unsupported_reason: ClassVar[str] = (
        "Adafactor factors the second moment of each weight matrix into row and column "
        "statistics, so it needs every parameter in its own shape; flattened, it would fall back "
        "to a full (Adam-sized) second moment with different step sizes. Per-tensor fp32 copies "
        "work, and so does memory_efficient=True (fp16/bf16 parameters stepped in place with fp32 "
        "math and fp32 state)."
    )
    #: torch.amp.GradScaler hands over grad_scale/found_inf instead of unscaling.
    _step_supports_amp_scaling: ClassVar[bool] = True
    #: For optcore.testing: the shared checks include set_lr and LR schedulers,
    #: which need the manual-lr mode (relative-step mode is checked by the plugin's tests),
    #: in every parameter dtype it steps.
    conformance_inputs: ClassVar[dict[str, Any]] = {
        "config": {"lr": 1e-2, "relative_step": False, "scale_parameter": False},
        "dtypes": ("float32", "float64", "bfloat16"),
    }

    @property
    def lr_schedule(self) -> str:
        """The contract's capability LR schedulers read: ``"none"`` while a group
        computes its own step size (relative-step mode), else ``"any"``."""
        return "none" if any(g.get("relative_step") for g in self.param_groups) else "any"

    def __init__(
        self,
        params: Iterable[Tensor] | Iterable[dict[str, Any]],
        lr: float | None = None,
        eps: tuple[float, float] = (1e-30, 1e-3),
        clip_threshold: float = 1.0,
        decay_rate: float = -0.8,
        beta1: float | None = None,
        weight_decay: float = 0.0,
        scale_parameter: bool = True,
        relative_step: bool = True,
        warmup_init: bool = False,
        implementation: str = "auto",
    ) -> None:
        defaults = validate_hparams(
            self.config_schema,
            dict(
                lr=lr,
                eps=eps,
                clip_threshold=clip_threshold,
                decay_rate=decay_rate,
                beta1=beta1,
                weight_decay=weight_decay,
                scale_parameter=scale_parameter,
                relative_step=relative_step,
                warmup_init=warmup_init,
                implementation=implementation,
            ),
            "Adafactor",
        )
        self._workspace = Workspace()
        self._compiled = CompiledUpdates()
        #: param -> the state the C loops took last step (see _known_state)
        self._known: dict[Tensor, tuple] = {}
        super().__init__(params, defaults)

    def __getstate__(self) -> dict[str, Any]:
        """Without the caches: the record of what the C loops took last step
        (weak references and raw pointers, which mean nothing in another
        process), compiled updates and scratch buffers; each is rebuilt on use."""
        state = super().__getstate__()
        for cache in ("_known", "_compiled", "_workspace"):
            state.pop(cache, None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        self._known, self._compiled, self._workspace = {}, CompiledUpdates(), Workspace()

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Add a group, validating its own hyper-parameters like the defaults."""
        fields = {k: param_group.get(k, self.defaults[k]) for k in self.config_schema.model_fields}
        param_group.update(validate_hparams(self.config_schema, fields, "Adafactor"))
        if param_group["implementation"] == "c" and _cpu_kernel.load() is None:
            raise ConfigError(
                f"Adafactor implementation='c' needs the C loops, which could not be built: "
                f"{_cpu_kernel.unavailable_reason}. Install a C compiler (or set CC), or choose "
                "implementation='torch' or 'compiled'.",
                problems=[("implementation", "the C kernel is unavailable")],
                target="Adafactor",
            )
        super().add_param_group(param_group)

    # ------------------------------------------------------------ learning rate
    def applied_step_size(self, p: Tensor) -> float | None:
        """alpha_t of ``p``'s last step: ``max(eps2, RMS) rho_t`` (``rho_t``
        without scale_parameter), from the state (``step``, ``RMS``), so it
        costs nothing per step and survives a checkpoint; ``None`` before the
        first step. In manual-lr mode ``rho_t`` is the group's current lr."""
        state = self.state.get(p, {})
        group = next(g for g in self.param_groups if any(q is p for q in g["params"]))
        if not state.get("step"):
            return None
        if group["relative_step"]:
            rho = relative_step_size(int(state["step"]), group["warmup_init"]) * float(group.get("lr_scale", 1.0))
        else:
            rho = float(group["lr"])
        if not group["scale_parameter"]:
            return rho
        return max(group["eps"][1], float(state.get("RMS", 0.0))) * rho

    def _group_step_size(self, group: dict[str, Any]) -> float:
        """The step size the group's first stepped parameter last got
        (``lr_scale`` applied), else ``rho_1``: what a trainer should log."""
        if not group["relative_step"]:
            lr = group["lr"]
            return float(lr.item() if isinstance(lr, Tensor) else lr)
        for p in group["params"]:
            size = self.applied_step_size(p)
            if size is not None:
                return size
        return relative_step_size(1, group["warmup_init"]) * float(group.get("lr_scale", 1.0))

    def get_lr(self) -> float:
        """The first group's ``lr``; in relative-step mode the step size last
        applied to its first parameter (``rho_t`` of step 1 before any step),
        divided by the group's ``lr_scale`` like the base learning rate."""
        group = self.param_groups[0]
        if not group["relative_step"]:
            return super().get_lr()
        return self._group_step_size(group) / (float(group.get("lr_scale", 1.0)) or 1.0)

    def get_lrs(self) -> list[float]:
        """Every group's learning rate as applied (``lr_scale`` included): the
        group's ``lr``, or in relative-step mode its last step size."""
        return [self._group_step_size(g) for g in self.param_groups]

    def set_lr(self, lr: float | Sequence[float]) -> None:
        """Set the external learning rate (manual-lr mode only: in relative-step
        mode there is nothing to set, and silently ignoring it would hide a bug)."""
        if any(g["relative_step"] for g in self.param_groups):
            raise ConfigError(
                "Adafactor computes its own step size (relative_step=True), so set_lr would be "
                "ignored. To drive it with an LR scheduler, build it with relative_step=False, "
                "scale_parameter=False and an lr.",
                problems=[("relative_step", "must be False to set the learning rate")],
                target="Adafactor",
            )
        super().set_lr(lr)

    @property
    def optimizer_config(self) -> dict[str, Any]:
        """The effective hyper-parameters; in relative-step mode ``lr`` is the step
        size applied last (:meth:`get_lr`), for logging (rebuilding from it needs
        ``lr`` dropped, as the config schema says)."""
        return super().optimizer_config

    # --------------------------------------------------------------------- step
    @torch.no_grad()
    def step(  # type: ignore[override]
        self,
        closure: Callable[[], float] | None = None,
        scale: float = 1.0,
        groups: Any = None,
    ) -> float | None:
        """One Adafactor update of the selected groups, with gradients divided by ``scale``."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        found_inf = getattr(self, "found_inf", None)  # set by torch.amp.GradScaler
        if found_inf is not None and bool(found_inf):
            return loss
        grad_scale = getattr(self, "grad_scale", None)
        scale = float(scale) * (float(grad_scale) if grad_scale is not None else 1.0)
        if not (math.isfinite(scale) and scale > 0):
            raise ConfigError(f"step(scale={scale}) must be a finite positive number (the loss scale).")
        work = [(g, p) for g in self._select_groups(groups) for p in g["params"] if p.grad is not None]
        traced = torch.compiler.is_compiling()  # C loops and host reads cannot be traced
        batch = None if traced else _cpu_kernel.Batch.new()
        # state the C loops took last step and nobody replaced since needs no check and no set-up again
        known = [
            self._known_state(group, p) if batch is not None and group["implementation"] in ("auto", "c") else None
            for group, p in work
        ]
        shapes = [None if ptrs else self._check(group, p) for (group, p), ptrs in zip(work, known)]
        for (group, p), state_shapes in zip(work, shapes):  # after every check: an error leaves nothing half-updated
            if state_shapes is not None:
                self._init_state(group, p, state_shapes)
        _store_rms([(self.state[p]["RMS"], p) for group, p in work if not group["scale_parameter"]])
        rest, batched, scalars_of = [], [], {}
        for (group, p), ptrs in zip(work, known):  # fp32 CPU matrices and vectors: all in one C call
            state = self.state[p]
            if (
                batch is not None and group["implementation"] in ("auto", "c")
                and self._add_job(batch, group, p, state, scale, ptrs, scalars_of)
            ):
                batched.append(state)
            else:
                rest.append((group, p))
        if batch is not None:
            batch.run()  # raises before writing anything if it cannot run
        for state in batched:
            state["step"] += 1
        for group, p in rest:
            if traced or group["implementation"] == "compiled":
                self._update_traceable(group, p, 1.0 / scale, compiled=not traced)
            else:
                self._update(group, p, 1.0 / scale)
        return loss

    @staticmethod
    def _state_shapes(group: dict[str, Any], p: Tensor) -> dict[str, torch.Size]:
        """Factored statistics for two or more dims, the full second moment
        otherwise, and the first moment only with beta1."""
        if p.dim() >= 2:
            shapes = {"exp_avg_sq_row": p.shape[:-1], "exp_avg_sq_col": p.shape[:-2] + p.shape[-1:]}
        else:
            shapes = {"exp_avg_sq": p.shape}
        if group["beta1"] is not None:
            shapes["exp_avg"] = p.shape
        return shapes

    #: read by optcore when a state_dict loads: the state tensors of a parameter and their shapes
    state_shapes = _state_shapes

    @staticmethod
    def _param_name(group: dict[str, Any], p: Tensor) -> str:
        """The parameter's name where the group has names, else its place."""
        index = next(i for i, q in enumerate(group["params"]) if q is p)
        names = group.get("param_names")
        if names and index < len(names):
            return repr(names[index])
        return f"#{index} of param group {group.get('name', '')!r}".replace(" ''", "")

    def _check(self, group: dict[str, Any], p: Tensor) -> dict[str, torch.Size]:
        """Reject what Adafactor cannot step, saying what to do instead; returns
        the shapes of its state (:meth:`_state_shapes`)."""
        grad = p.grad
        if grad.layout is not torch.strided:  # COO, CSR, CSC, BSR, BSC
            raise RuntimeError(
                "Adafactor does not support sparse gradients; use torch.optim.SparseAdam for "
                "sparse embeddings (e.g. in its own param group), or dense gradients."
            )
        if p.is_complex() or not p.is_floating_point():
            raise RuntimeError(
                f"Adafactor needs real floating-point parameters, got {p.dtype} of shape "
                f"{tuple(p.shape)}; view a complex parameter as real (torch.view_as_real) first."
            )
        if grad.shape != p.shape:
            raise RuntimeError(
                f"Adafactor: the gradient of parameter {self._param_name(group, p)} has shape "
                f"{tuple(grad.shape)}, the parameter {tuple(p.shape)}."
            )
        shapes = self._state_shapes(group, p)
        state = self.state.get(p)
        for key, shape in shapes.items() if state else ():
            value = state.get(key)
            if value is not None and (not isinstance(value, Tensor) or value.shape != shape):
                found = tuple(value.shape) if isinstance(value, Tensor) else type(value).__name__
                raise RuntimeError(
                    f"Adafactor state {key!r} of parameter {self._param_name(group, p)} has shape "
                    f"{found}, expected {tuple(shape)} for a parameter of shape {tuple(p.shape)}: the "
                    "loaded state_dict belongs to another model or parameter order. Load the "
                    "checkpoint into the model it was saved from, or start this optimizer fresh."
                )
        return shapes

    def _init_state(self, group: dict[str, Any], p: Tensor, shapes: dict[str, torch.Size]) -> None:
        """Create missing state (zeros, fp32 for fp16/bf16 params) and move
        loaded state to the parameter's device. ``RMS`` becomes a 0-dim tensor
        (Hugging Face starts it as the int 0)."""
        state = self.state[p]
        step = state.setdefault("step", 0)
        if isinstance(step, Tensor) and not torch.compiler.is_compiling():
            state["step"] = int(step.item())  # left by a traced step: eager steps count in Python
        dtype = torch.float32 if p.dtype in _LOW_PRECISION else p.dtype
        for key, shape in shapes.items():
            value = state.get(key)
            if value is None:
                state[key] = torch.zeros(shape, device=p.device, dtype=dtype)
            elif not _placed(value, p, dtype):
                state[key] = value.to(device=p.device, dtype=dtype)
        rms = state.get("RMS")
        if not isinstance(rms, Tensor):
            state["RMS"] = torch.tensor(float(rms or 0.0), device=p.device, dtype=dtype)
        elif not _placed(rms, p, dtype):
            state["RMS"] = rms.to(device=p.device, dtype=dtype)

    def _rho(self, group: dict[str, Any], t: int) -> float | Tensor:
        """rho_t: the relative step size (times the core's layer-wise lr_scale),
        or the group's lr (a tensor lr stays a tensor)."""
        if group["relative_step"]:
            return relative_step_size(t, group["warmup_init"]) * float(group.get("lr_scale", 1.0))
        return group["lr"] if isinstance(group["lr"], Tensor) else float(group["lr"])

    def _update(self, group: dict[str, Any], p: Tensor, inv_scale: float) -> None:
        """One step of Algorithm 4 (matrices) or 5 (vectors) for parameter ``p``,
        eagerly: C loops or chunked torch ops."""
        state = self.state[p]
        state["step"] += 1
        t = state["step"]
        beta2t = 1.0 - math.pow(t, group["decay_rate"])
        eps1, eps2 = group["eps"]
        beta1 = group["beta1"]
        exp_avg = state["exp_avg"] if beta1 is not None else None
        use_c = group["implementation"] != "torch"
        # Second moment, and the direction U = G / sqrt(V) with its RMS.
        if p.dim() >= 2:
            r, c, rms_u = factored_second_moment_(
                p.grad, state["exp_avg_sq_row"], state["exp_avg_sq_col"],
                beta2t=beta2t, eps1=eps1, inv_scale=inv_scale, workspace=self._workspace, use_c=use_c,
            )
        else:
            u, rms_u = full_second_moment_(p.grad, state["exp_avg_sq"], beta2t=beta2t, eps1=eps1, inv_scale=inv_scale)
        # Step size: relative (rho_t) or the group's lr, times the parameter scale.
        rho = float(self._rho(group, t))
        if group["scale_parameter"]:
            rms_x = _rms(p)
            state["RMS"].fill_(rms_x)
            step_size = max(eps2, rms_x) * rho
        else:
            step_size = rho
        # Update clipping: U / max(1, RMS(U) / d); 1/scale is folded in here too.
        lr = step_size / max(1.0, rms_u / group["clip_threshold"]) * inv_scale
        decay = group["weight_decay"] * step_size
        if p.dim() >= 2:
            apply_factored_(p, p.grad, r, c, exp_avg, lr=lr, beta1=beta1, decay=decay, workspace=self._workspace, use_c=use_c)
        else:
            apply_full_(p, u, exp_avg, lr=lr, beta1=beta1, decay=decay)

    def _add_job(
        self, batch: _cpu_kernel.Batch, group: dict[str, Any], p: Tensor, state: dict[str, Any], scale: float,
        known: tuple[int, ...] | None, scalars_of: dict[tuple[int, int], tuple[float, ...]],
    ) -> bool:
        """Add the same step of ``p`` to the C batch (Algorithm 4 or 5 in two
        passes over memory, no torch op in between), if the loops take it: an
        fp32 contiguous CPU matrix or vector, and its state likewise. ``known``:
        the state's pointers from :meth:`_known_state`, or ``None`` to check it;
        ``scalars_of``: this step's job scalars by (group, step count)."""
        t = state["step"] + 1
        beta1 = group["beta1"]
        scalars = scalars_of.get((id(group), t))  # the parameters of a group mostly share their step count
        if scalars is None:
            eps1, eps2 = group["eps"]
            scalars = scalars_of[id(group), t] = (
                1.0 - math.pow(t, group["decay_rate"]), 1.0 / scale, eps1, eps2, float(self._rho(group, t)),
                group["clip_threshold"], beta1 or 0.0, group["weight_decay"],
            )
        if known is not None:
            shape = p.shape
            x, g = _cpu_kernel.pointer("param", p, shape), _cpu_kernel.pointer("grad", p.grad, shape)
            if x is not None and g is not None:
                batch.add_known((shape[0], shape[1]) if len(shape) == 2 else (p.numel(), 0), x, g, known, scalars)
                return True
            self._init_state(group, p, self._check(group, p))  # a new gradient C cannot take: say why, or fall back
        keys = self._state_keys(group, p)
        if keys is None:
            return False
        stats = tuple(state[k] for k in keys if k.startswith("exp_avg_sq"))
        exp_avg = state["exp_avg"] if beta1 is not None else None
        rms = state["RMS"] if group["scale_parameter"] else None
        # RMS(X) as the loops last wrote X, checked as they next read it (see _cpu_kernel.SOURCE): new state, new memo
        memo = array("d", (math.nan, 0.0)) if rms is not None and len(stats) == 2 else None
        ptrs = batch.add(p, p.grad, exp_avg, stats, rms, scalars, memo=0 if memo is None else memo.buffer_info()[0])
        if ptrs is None:
            self._known.pop(p, None)
            return False
        self._known[p] = (
            (beta1 is None, group["scale_parameter"], p.shape),  # p.shape: the sizes the loops trust
            tuple((key, weakref.ref(state[key]), state[key].shape, ptrs[_POINTER_SLOT[key]]) for key in keys),
            ptrs,
            memo,  # alive as long as its address is in ptrs
        )
        return True

    @staticmethod
    def _state_keys(group: dict[str, Any], p: Tensor) -> tuple[str, ...] | None:
        """The state tensors the C loops read and write for ``p``, in
        :meth:`Batch.add`'s pointer order; ``None`` where they take no such ``p``."""
        if p.dim() == 2:
            keys: tuple[str, ...] = ("exp_avg_sq_row", "exp_avg_sq_col")
        elif p.dim() <= 1:
            keys = ("exp_avg_sq",)
        else:
            return None
        if group["beta1"] is not None:
            keys = ("exp_avg", *keys)
        return (*keys, "RMS") if group["scale_parameter"] else keys

    def _known_state(self, group: dict[str, Any], p: Tensor) -> tuple[int, ...] | None:
        """The C pointers of ``p``'s state if it is the very state the loops
        took last step: the same tensor objects (held weakly), same shapes,
        same memory (freed storage reads as pointer 0), in a group of the same
        kind. Then :meth:`_check` and :meth:`_init_state` have nothing new to
        look at, and skipping them is a third of the step's Python time on
        the bench's 10M parameters. ``None``: check everything."""
        entry = self._known.get(p)
        if entry is None:
            return None
        kind, tensors, ptrs, _ = entry
        state = self.state.get(p)
        if (
            state is None or kind != (group["beta1"] is None, group["scale_parameter"], p.shape)
            or type(state.get("step")) is not int
        ):
            return None
        for key, ref, shape, ptr in tensors:
            t = state.get(key)
            if t is None or ref() is not t or t.shape != shape or t.data_ptr() != ptr:
                return None
        return ptrs

    def _update_traceable(self, group: dict[str, Any], p: Tensor, inv_scale: float, *, compiled: bool) -> None:
        """The same step as whole-tensor torch ops with no host reads: traced
        as it stands under torch.compile(opt.step), or run through the update
        compiled once per (device, dtype, dims) with implementation='compiled'.

        Traced, ``step`` becomes a 0-dim tensor (as torch's own optimizers keep
        it): a Python int would be baked into the graph and recompile it every
        step. Hugging Face's Adafactor steps from a tensor ``step`` as well."""
        state = self.state[p]
        rms = state["RMS"]
        if compiled:  # step-dependent numbers on the host, handed over as data
            state["step"] = t = int(state["step"]) + 1
            scalars = pack_scalars(group, 1.0 - math.pow(t, group["decay_rate"]), self._rho(group, t), inv_scale, rms)
            fn = self._compiled.get(p.device, p.dtype, p.dim())
        else:
            step = state["step"]
            if not isinstance(step, Tensor):
                step = state["step"] = torch.tensor(float(step), dtype=torch.float32, device=p.device)
            step.add_(1)
            t = step.to(rms.dtype)
            beta2t = 1.0 - t.pow(group["decay_rate"])
            if group["relative_step"]:
                rho = torch.minimum(t * 1e-6 if group["warmup_init"] else torch.full_like(t, 1e-2), t.rsqrt())
                rho = rho * float(group.get("lr_scale", 1.0))
            else:
                rho = group["lr"]
            scalars = pack_scalars(group, beta2t, rho, inv_scale, rms)
            fn = factored_update_ if p.dim() >= 2 else full_update_
        stats = (state["exp_avg_sq_row"], state["exp_avg_sq_col"]) if p.dim() >= 2 else (state["exp_avg_sq"],)
        exp_avg = state["exp_avg"] if group["beta1"] is not None else None
        fn(p, p.grad, *stats, exp_avg, rms, scalars, decay=group["weight_decay"] != 0, scale_parameter=group["scale_parameter"])

    # --------------------------------------------------------------- checkpoint
    def load_state_dict(  # type: ignore[override]
        self,
        state_dict: Mapping[str, Any],
        optimizer_overrides: Mapping[str, Any] | None = None,
    ) -> None:
        """Load a state dict, with ``optimizer_overrides`` validated like a config
        first; the state of fp16/bf16 parameters stays fp32 (torch casts floating
        state to the parameter's dtype on load, which would flush small
        second-moment statistics to zero in fp16)."""
        if optimizer_overrides:
            for saved in state_dict["param_groups"]:
                merged = {**self.defaults, **saved, **optimizer_overrides}
                validate_hparams(self.config_schema, {k: merged[k] for k in self.config_schema.model_fields}, "Adafactor")
        super().load_state_dict(state_dict, optimizer_overrides)
        for group in self.param_groups:  # a checkpoint of Hugging Face's lacks our switches
            for key, value in self.defaults.items():
                group.setdefault(key, value)
        saved_ids = [i for g in state_dict["param_groups"] for i in g["params"]]
        params = [p for g in self.param_groups for p in g["params"]]
        for pid, p in zip(saved_ids, params):
            if p.dtype not in _LOW_PRECISION:
                continue
            for key, value in state_dict["state"].get(pid, {}).items():
                if isinstance(value, Tensor) and value.is_floating_point():
                    self.state[p][key] = value.to(device=p.device, dtype=torch.float32, copy=True)

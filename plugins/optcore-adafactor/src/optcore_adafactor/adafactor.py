"""Adafactor as a ``torch.optim.Optimizer``, in torch's order: validate the
hyper-parameters, gather each parameter's tensors, call the update.

The update is :func:`.functional.adafactor_update` (Shazeer & Stern 2018
with fairseq's and Hugging Face's choices; the algorithm is written down
there). Where the C kernel builds, the fp32 CPU matrices and vectors of a
step go to it instead, all in one call (:mod:`._cpu_kernel`, the same step
in two passes over memory); :meth:`Adafactor._route` is the one place that
chooses. One difference from fairseq on purpose: the step size is kept in
the parameter's state, never written back into ``group["lr"]`` (fairseq's
compounds with LR schedulers).
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, ClassVar

import torch
from torch import Tensor

from optcore import ConfigError, StepError
from optcore.plugin import Optimizer, prepare_step, validate_hparams

from . import _cpu_kernel, _sharded
from ._config import AdafactorConfig
from .functional import LOW_PRECISION, CompiledUpdate, adafactor_update, relative_step_size, state_shapes


def _complex_error(p: Tensor) -> ConfigError:
    return ConfigError(
        f"Adafactor needs real floating-point parameters, got {p.dtype} of shape {tuple(p.shape)}; "
        "view a complex parameter as real (torch.view_as_real) first.",
        problems=[("params", f"{p.dtype} parameter")], target="Adafactor",
    )


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
            functional update is traced whatever is chosen.

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
    #: under FSDP2 those statistics are reduced over the mesh, batched per step (see ._sharded)
    reduces_sharded_statistics: ClassVar[bool] = True
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
        "dtypes": ("float32", "float64", "bfloat16"), "step_errors": True,
    }

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
        hparams = dict(lr=lr, eps=eps, clip_threshold=clip_threshold, decay_rate=decay_rate, beta1=beta1,
                       weight_decay=weight_decay, scale_parameter=scale_parameter, relative_step=relative_step,
                       warmup_init=warmup_init, implementation=implementation)
        defaults = validate_hparams(self.config_schema, hparams, "Adafactor")
        self._compiled = CompiledUpdate()
        #: id(param) -> the C loops' two doubles about it (sum X² they wrote last, whether X had
        #: changed since): the loops check the first against the X they read, so it needs no key of its own
        self._memo: dict[int, array] = {}
        super().__init__(params, defaults)

    def __getstate__(self) -> dict[str, Any]:
        """Without the caches (the C loops' memo of what they wrote, compiled
        updates): each is rebuilt on use."""
        state = super().__getstate__()
        for cache in ("_memo", "_compiled"):
            state.pop(cache, None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        self._memo, self._compiled = {}, CompiledUpdate()

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Add a group, validating its own hyper-parameters like the defaults;
        complex parameters are refused here (as Lion does)."""
        fields = {k: param_group.get(k, self.defaults[k]) for k in self.config_schema.model_fields}
        param_group.update(validate_hparams(self.config_schema, fields, "Adafactor"))
        params = param_group["params"]
        for p in [params] if isinstance(params, Tensor) else params:
            if isinstance(p, Tensor) and p.is_complex():
                raise _complex_error(p)
        if param_group["implementation"] == "c" and _cpu_kernel.load() is None:
            raise ConfigError(
                f"Adafactor implementation='c' needs the C loops, which could not be built: "
                f"{_cpu_kernel.unavailable_reason}. Install a C compiler (or set CC), or choose "
                "implementation='torch' or 'compiled'.",
                problems=[("implementation", "the C kernel is unavailable")],
                target="Adafactor",
            )
        super().add_param_group(param_group)

    # --------------------------------------------------------------------- step
    @torch.no_grad()
    def step(  # type: ignore[override]
        self,
        closure: Callable[[], float] | None = None,
        scale: float = 1.0,
        groups: Any = None,
    ) -> float | None:
        """One Adafactor update of the selected groups, with gradients divided by ``scale``."""
        prepared = prepare_step(self, closure, scale, groups)  # the contract's checks: nothing changed yet
        if prepared.skip:
            return prepared.loss
        scale = prepared.scale
        work = [(group, p) for _, group in prepared.groups for p in group["params"] if p.grad is not None]
        sharded = [(group, p) for group, p in work if _sharded.is_sharded(p)]
        if sharded:  # FSDP2's DTensor shards: statistics reduced over the mesh (see _sharded)
            work = [(group, p) for group, p in work if not _sharded.is_sharded(p)]
            for group, p in sharded:
                self._check(group, p)
                _sharded.reduce_group(p, lambda: self._where(group, p))
        batch = None if torch.compiler.is_compiling() else _cpu_kernel.Batch.new()
        native, functional = self._route(work, batch, scale)
        if batch is not None:
            batch.run()  # raises before writing anything if it cannot run
        for _, _, state in native:
            state["step"] += 1
        for group, p in functional:
            self._update(group, p, 1.0 / scale)
        if sharded:
            for group, p in sharded:
                _sharded.init_state(self, group, p)
            _sharded.step(self, sharded, 1.0 / scale)
        return prepared.loss

    def _route(
        self, work: list[tuple[dict[str, Any], Tensor]], batch: _cpu_kernel.Batch | None, scale: float
    ) -> tuple[list[tuple[dict[str, Any], Tensor, dict[str, Any]]], list[tuple[dict[str, Any], Tensor]]]:
        """Check every parameter and its state, then set up what is missing, and
        choose each one's backend: the C batch for what its checks accept
        (``implementation`` 'auto' or 'c'), the functional update for the rest.
        Nothing is changed before every check has passed."""
        c_groups = ("auto", "c") if batch is not None else ()
        native: list[tuple[dict[str, Any], Tensor, dict[str, Any]]] = []
        unsettled = []
        scalars: dict[tuple[int, int], tuple[float, ...]] = {}
        for group, p in work:  # a job the kernel's own checks of every tensor accept needs no other check
            state = self._add_job(batch, group, p, scale, scalars) if group["implementation"] in c_groups else None
            if state is not None:
                native.append((group, p, state))
            else:
                self._check(group, p)
                unsettled.append((group, p))
        functional = []
        for group, p in unsettled:
            self._init_state(group, p)
            state = self._add_job(batch, group, p, scale, scalars) if group["implementation"] in c_groups else None
            if state is not None:
                native.append((group, p, state))
            else:
                functional.append((group, p))
        return native, functional

    def _check(self, group: dict[str, Any], p: Tensor) -> None:
        """Adafactor's own checks, after the contract's (dense gradients, state
        tensors of the shapes :meth:`state_shapes` gives): a real floating-point
        parameter, a gradient of its shape, and tensors under the statistics'
        keys. Each refusal is a StepError saying what to do instead."""
        if p.is_complex() or not p.is_floating_point():
            raise StepError(
                f"Adafactor cannot step {self._where(group, p)}: it is {p.dtype} now; Adafactor "
                "needs real floating-point parameters (view a complex one as real with torch.view_as_real).",
                param=self._where(group, p),
            )
        if p.grad.shape != p.shape:
            raise StepError(
                f"Adafactor cannot step: the gradient of {self._where(group, p)} has shape "
                f"{tuple(p.grad.shape)}; give each parameter a gradient of its own shape.",
                param=self._where(group, p),
            )
        state = self.state.get(p)
        for key in state_shapes(p, group["beta1"]) if state else ():
            value = state.get(key)
            if value is not None and not isinstance(value, Tensor):
                raise StepError(
                    f"Adafactor cannot step: the state {key!r} of {self._where(group, p)} is a "
                    f"{type(value).__name__}, not a tensor; the optimizer state was edited or belongs to another "
                    "optimizer. Load a checkpoint of this optimizer (or start it fresh).",
                    param=self._where(group, p),
                )

    def _init_state(self, group: dict[str, Any], p: Tensor) -> None:
        """Create missing state (zeros, fp32 for fp16/bf16 params) and move
        loaded state to the parameter's device. ``RMS`` becomes a 0-dim tensor
        (Hugging Face starts it as the int 0)."""
        state = self.state[p]
        step = state.setdefault("step", 0)
        if isinstance(step, Tensor) and not torch.compiler.is_compiling():
            state["step"] = int(step.item())  # left by a traced step: eager steps count in Python
        dtype = torch.float32 if p.dtype in LOW_PRECISION else p.dtype
        for key, shape in state_shapes(p, group["beta1"]).items():
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

    def _add_job(
        self, batch: _cpu_kernel.Batch, group: dict[str, Any], p: Tensor, scale: float,
        scalars_of: dict[tuple[int, int], tuple[float, ...]],
    ) -> dict[str, Any] | None:
        """Add the step of ``p`` to the C batch if the loops take it: a plain
        contiguous fp32 CPU matrix or vector, its gradient and state of the
        exact shapes, every tensor checked by :meth:`_cpu_kernel.Batch.add`.
        Returns ``p``'s state if it was added."""
        state = self.state.get(p)
        if not state or type(state.get("step")) is not int:
            return None
        shape = tuple(p.shape)
        matrix = len(shape) == 2
        stats = (state.get("exp_avg_sq_row"), state.get("exp_avg_sq_col")) if matrix else (state.get("exp_avg_sq"),)
        beta1 = group["beta1"]
        exp_avg = None if beta1 is None else state.get("exp_avg")
        if stats[0] is None or stats[-1] is None or (beta1 is not None and exp_avg is None):
            return None
        rms = state.get("RMS")
        if not isinstance(rms, Tensor):  # Hugging Face's fresh state holds the int 0: _init_state makes it a tensor
            return None
        t = state["step"] + 1
        scalars = scalars_of.get((id(group), t))  # the parameters of a group mostly share their step count
        if scalars is None:
            eps1, eps2 = group["eps"]
            rho = group["lr"] if not group["relative_step"] else (
                relative_step_size(t, group["warmup_init"]) * group.get("lr_scale", 1.0))
            scalars = scalars_of[id(group), t] = (
                1.0 - math.pow(t, group["decay_rate"]), 1.0 / scale, eps1, eps2, float(rho),
                group["clip_threshold"], beta1 or 0.0, group["weight_decay"],
            )
        # RMS(X) as the loops last wrote X, checked as they next read it (see _cpu_kernel.SOURCE)
        memo = None
        if group["scale_parameter"] and matrix:
            memo = self._memo.get(id(p))
            if memo is None:
                memo = self._memo[id(p)] = array("d", (math.nan, 0.0))
        try:
            added = batch.add(p, p.grad, exp_avg, stats, rms, scalars, memo=0 if memo is None else memo.buffer_info()[0],
                              shape=shape, scale=group["scale_parameter"])
        except ValueError as exc:  # a tensor whose storage no longer holds it: no path may read it
            raise StepError(f"Adafactor cannot step {self._where(group, p)}: {exc}",
                            param=self._where(group, p)) from exc
        return state if added else None

    def _update(self, group: dict[str, Any], p: Tensor, inv_scale: float) -> None:
        """The functional update of ``p``: eager, through ``torch.compile``
        (implementation='compiled'), or traced as part of a compiled ``step``.

        Traced, ``step`` becomes a 0-dim tensor (as torch's own optimizers keep
        it): a Python int would be baked into the graph and recompile it every
        step. Hugging Face's Adafactor steps from a tensor ``step`` as well."""
        state = self.state[p]
        tensors = (
            p, p.grad, state.get("exp_avg_sq_row"), state.get("exp_avg_sq_col"), state.get("exp_avg_sq"),
            state["exp_avg"] if group["beta1"] is not None else None, state["RMS"],
        )
        eps1, eps2 = group["eps"]
        hparams = dict(
            lr=group["lr"], eps1=eps1, eps2=eps2, clip_threshold=group["clip_threshold"],
            decay_rate=group["decay_rate"], beta1=group["beta1"], weight_decay=group["weight_decay"],
            scale_parameter=group["scale_parameter"], relative_step=group["relative_step"],
            warmup_init=group["warmup_init"], lr_scale=group.get("lr_scale", 1.0), inv_scale=inv_scale,
        )
        if torch.compiler.is_compiling():
            if not isinstance(state["step"], Tensor):
                state["step"] = torch.tensor(float(state["step"]), dtype=torch.float32, device=p.device)
            state["step"].add_(1)
            adafactor_update(*tensors, step=state["step"].to(state["RMS"].dtype), **hparams)
            return
        state["step"] += 1
        update = self._compiled if group["implementation"] == "compiled" else adafactor_update
        update(*tensors, step=state["step"], **hparams)

    #: read by optcore when a state_dict loads (and by every step): the state a stepped parameter keeps
    @staticmethod
    def state_shapes(group: dict[str, Any], p: Tensor) -> dict[str, Any]:
        """Factored statistics for two or more dims, the full second moment
        otherwise, the first moment only with beta1, and the step count and
        RMS of the parameter (numbers or 0-dim tensors)."""
        return {**state_shapes(p, group["beta1"]), "step": (), "RMS": ()}

    def _where(self, group: dict[str, Any], p: Tensor) -> str:
        """How an error names ``p``, as the contract's preamble does: by name
        where the group has names, and by its place and shape."""
        index = next(k for k, g in enumerate(self.param_groups) if g is group)
        i = next(k for k, q in enumerate(group["params"]) if q is p)
        names = group.get("param_names")
        name = f"{names[i]!r} " if names and i < len(names) else ""
        return f"parameter {name}(#{i} of param group {index}, shape {tuple(p.shape)})"

    # --------------------------------------------------------------- checkpoint
    def load_state_dict(  # type: ignore[override]
        self,
        state_dict: Mapping[str, Any],
        optimizer_overrides: Mapping[str, Any] | None = None,
    ) -> None:
        """Load a state dict (the contract validates each group with
        ``optimizer_overrides`` like a config, and judges the state by
        :meth:`state_shapes`, before anything loads); the state of fp16/bf16
        parameters stays fp32 (torch casts floating state to the parameter's
        dtype on load, which would flush small second-moment statistics to zero in fp16)."""
        super().load_state_dict(state_dict, optimizer_overrides)
        for group in self.param_groups:  # a checkpoint of Hugging Face's lacks our switches
            for key, value in self.defaults.items():
                group.setdefault(key, value)
        saved_ids = [i for g in state_dict["param_groups"] for i in g["params"]]
        params = [p for g in self.param_groups for p in g["params"]]
        for pid, p in zip(saved_ids, params):
            if p.dtype not in LOW_PRECISION:
                continue
            for key, value in state_dict["state"].get(pid, {}).items():
                if isinstance(value, Tensor) and value.is_floating_point():
                    self.state[p][key] = value.to(device=p.device, dtype=torch.float32, copy=True)

    # ------------------------------------------------------------ learning rate
    @property
    def lr_schedule(self) -> str:
        """The contract's capability LR schedulers read: ``"none"`` while a group
        computes its own step size (relative-step mode), else ``"any"``."""
        return "none" if any(g.get("relative_step") for g in self.param_groups) else "any"

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

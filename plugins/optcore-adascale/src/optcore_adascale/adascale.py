r"""AdaScale SGD (Johnson, Agrawal, Gu, Guestrin, ICML 2020).

A batch ``S`` times larger than the one the learning rate was tuned for
averages ``S`` gradient samples, which helps only as far as the samples
disagree. AdaScale measures that disagreement and multiplies the learning
rate by the gain ratio ``r`` (between 1 and ``S``)::

    c = num_gradients_to_accumulate, N = world size, n = c * N samples per step
    g_i      the gradient of one worker's accumulation step (seen by a hook, before DDP averages)
    g        = mean_i g_i                      (the .grad after the c-th backward)
    local    = sum_i |g_i|^2                   (all-reduced: ONE tensor of n_groups numbers)
    total    = |g|^2
    var      = S / (n - 1) * (local / n - total)      trace of the gradient covariance, at scale S
    sqr      = total - var / S                         squared norm of the true gradient
    var_avg  = EWMA(max(var, 1e-6)),  sqr_avg = EWMA(max(sqr, 0))       (debiased, per param group)
    r        = (var_avg + sqr_avg) / (var_avg / S + sqr_avg)
    SGD step (torch.optim.SGD's momentum, dampening, nesterov, weight decay) with lr * r
    progress += r                               scale-invariant iterations, for schedules

Design: a tensor hook on each parameter records ``|g_i|^2`` when autograd
produces the gradient, which is before ``AccumulateGrad`` adds it to ``.grad``
and before DDP's reducer (a post-accumulate hook) averages it across ranks; so
the same hook sees every accumulation step under ``no_sync`` and every worker's
own gradient. The first hook of a backward pass queues one engine callback that
counts the pass; after the ``c``-th it sums and all-reduces the recorded norms
(eagerly, outside ``step()``). ``|g|^2`` is read in ``step()``, fused with the
momentum update, unless ``gain()`` asks for the coming step's gain first (then
``gain()`` reads it, as fairscale does at the end of the last backward).
"""

from __future__ import annotations

import math
import reprlib
import warnings
import weakref
from dataclasses import dataclass
from collections.abc import Callable, Iterable, Mapping
from typing import Any, ClassVar

import torch
import torch.distributed as dist
from torch import Tensor
from torch.autograd import Variable

from optcore import ConfigError, StepError
from optcore.plugin import GroupSelector, Optimizer, prepare_step, validate_hparams

from ._config import AdaScaleSGDConfig
from . import _sharded
from ._errors import AccumulationError

_F64 = torch.float64
#: attributes that a pickle or deep copy carries besides torch's defaults, state and groups.
_PICKLED = ("world_size", "_fsdp", "num_gradients_to_accumulate", "is_scaled_loss", "debias_ewma",
            "_smoothing", "_scale", "_progress", "_avg", "_device")
#: AdaScale's own hyper-parameters: global, so they live on the optimizer, not in param groups.
_GLOBAL_HPARAMS = ("num_gradients_to_accumulate", "scale", "smoothing", "is_scaled_loss", "debias_ewma")
_ESTIMATES = ("grad_sqr_avg", "grad_var_avg")


def _finite_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _squared_norm(t: Tensor) -> Tensor:
    """``|t|^2`` as a 0-d tensor, accumulated in fp32 or the tensor's own
    precision if higher (fp64). Dense fp32/fp64 use BLAS ``dot`` (on CPU faster
    than torch's norm reduction, which barely uses a second thread). A DTensor
    (an FSDP2 shard) gives its local shard's: the caller sums over ranks."""
    t = _sharded.local(t)
    if t.dtype in (torch.float32, torch.float64) and t.is_contiguous():
        flat = t.view(-1)
        return torch.dot(flat, flat)
    return torch.linalg.vector_norm(t, dtype=torch.promote_types(t.dtype, torch.float32)).square()


def _apply(params: list[Tensor], directions: list[Tensor], gain: float | Tensor, factor: float) -> None:
    """``p += factor * gain * direction``; a tensor gain (under torch.compile) stays on device."""
    if isinstance(gain, Tensor):
        torch._foreach_add_(params, torch._foreach_mul(directions, gain * factor))
    elif len(params) == 1:
        params[0].add_(directions[0], alpha=factor * gain)
    else:
        torch._foreach_add_(params, directions, alpha=factor * gain)


def _sum64(parts: list[Tensor], device: torch.device) -> Tensor:
    """The sum of 0-d tensors in float64 (0 if none)."""
    if not parts:
        return torch.zeros((), dtype=_F64, device=device)
    return torch.stack(parts).to(device, _F64).sum()


def _chunks(params: list[Tensor]) -> list[list[Tensor]]:
    """One tensor at a time on CPU (cache-friendly, as torch's CPU default);
    one multi-tensor batch on accelerators and under torch.compile."""
    if params[0].device.type == "cpu" and not torch.compiler.is_compiling():
        return [[p] for p in params]
    return [params]


def _world_size() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def _check_samples(world_size: int, num_gradients_to_accumulate: int) -> None:
    if world_size * num_gradients_to_accumulate < 2:
        raise ConfigError(
            "AdaScaleSGD needs at least two gradient samples per step: it estimates the gradient "
            "variance from how the per-worker (and per-accumulation-step) gradients differ from their "
            "mean, and with one worker and num_gradients_to_accumulate=1 there is a single sample "
            "(the estimate divides by n - 1 = 0). Build the optimizer after "
            "torch.distributed.init_process_group on >= 2 workers, or set "
            "num_gradients_to_accumulate >= 2 and accumulate that many backward passes per step, "
            "or use plain SGD.",
            problems=[("num_gradients_to_accumulate", f"world size {world_size} x {num_gradients_to_accumulate} < 2")],
            target="AdaScaleSGD",
        )


@dataclass
class _Accumulation:
    """Where the running accumulation stands (transient, never saved). A separate
    object, not optimizer attributes: torch.compile keeps assignments to this
    object's fields, but drops plain attribute assignments on an optimizer."""

    backwards: int = 0  # backward passes counted since the last step
    queued: bool = False  # a count callback is queued for the running backward pass
    local: Tensor | None = None  # the all-reduced per-group sum of |g_i|^2, after the c-th pass
    total: Tensor | None = None  # per-group |.grad|^2 from the hooks, after the c-th pass (one process)
    settled: int = 0  # how many params' |.grad|^2 that is
    provisional: tuple[dict[str, Tensor], Tensor] | None = None  # (estimates before, |g|^2) once gain() measured


class AdaScaleSGD(Optimizer):
    """SGD whose learning rate is scaled by AdaScale's gain ratio (see the module docstring).

    Build it after ``torch.distributed.init_process_group`` (the world size is read
    then) and before the first backward pass. Each step takes exactly
    ``num_gradients_to_accumulate`` backward passes (under DDP, the first ones
    inside ``model.no_sync()``); ``step()`` after fewer or more is an
    :class:`AccumulationError`. ``gain()`` after the last backward pass is the
    gain that ``step()`` will apply (fairscale's ``step += opt.gain()``).
    Anything that rescales ``.grad`` between backward and ``step()`` (clipping,
    ``GradScaler.unscale_``) biases the variance estimate; pass a loss scale as
    ``step(scale=...)`` or let ``GradScaler.step`` hand it over instead.
    Gradients assigned by hand (no backward pass since the last step) leave the
    estimates, and so the gain, unchanged (with a one-time warning).
    """

    config_schema: ClassVar[type[AdaScaleSGDConfig]] = AdaScaleSGDConfig
    #: fp16 params are updated in fp16, like torch.optim.SGD.
    supports_memory_efficient_fp16: ClassVar[bool] = False
    #: ``step(scale=s)`` folds 1/s into the SGD factors and divides the statistics by s^2.
    supports_step_with_scale = True
    #: the statistics come from backward hooks on the parameters; a flat master copy
    #: whose gradient is copied in (the FP16 wrappers) never fires them.
    supports_flat_params: ClassVar[bool] = False
    #: the gain and its all-reduce belong to one step over all groups; stepping groups
    #: separately would split one batch's statistics across steps.
    supports_groups: ClassVar[bool] = False
    #: the gain is one statistic over every gradient of every parameter
    sharding: ClassVar[str] = "global"
    #: under FSDP2 the statistics are all-reduced over the shards and ranks, once per step
    reduces_sharded_statistics: ClassVar[bool] = True
    #: read by optcore when a state_dict loads (and by every step): the state a stepped parameter keeps
    @staticmethod
    def state_shapes(group: Mapping[str, Any], p: Tensor) -> dict[str, tuple[int, ...]]:
        """The momentum buffer, of the parameter's shape, where the group has momentum."""
        return {"momentum_buffer": tuple(p.shape)} if group.get("momentum") else {}

    #: GradScaler hands over grad_scale / found_inf instead of unscaling .grad, which
    #: keeps the hook-recorded and the final gradients on the same scale.
    _step_supports_amp_scaling = True
    #: for optcore.testing: the kit's loop runs one backward pass per step, which is one
    #: gradient sample in one process; the plugin's tests run the kit on 2 gloo ranks.
    conformance_inputs: ClassVar[dict[str, Any]] = {
        "config": {"lr": 0.05, "momentum": 0.9},
        "skip": {
            "*": "AdaScaleSGD needs two gradient samples per step and the kit's loop gives one per process; "
            "optcore-adascale's tests run the kit on 2 gloo ranks, in float32 and float64"
        },
    }

    def __init__(
        self,
        params: Iterable[Tensor] | Iterable[dict[str, Any]],
        lr: float = 1e-3,
        momentum: float = 0.0,
        dampening: float = 0.0,
        weight_decay: float = 0.0,
        nesterov: bool = False,
        *,
        num_gradients_to_accumulate: int = 1,
        scale: float | None = None,
        smoothing: float | None = None,
        is_scaled_loss: bool = True,
        debias_ewma: bool = True,
    ) -> None:
        hp = validate_hparams(
            self.config_schema,
            dict(
                lr=lr, momentum=momentum, dampening=dampening, weight_decay=weight_decay, nesterov=nesterov,
                num_gradients_to_accumulate=num_gradients_to_accumulate, scale=scale, smoothing=smoothing,
                is_scaled_loss=is_scaled_loss, debias_ewma=debias_ewma,
            ),
            "AdaScaleSGD",
        )
        if hp["nesterov"] and (hp["momentum"] <= 0 or hp["dampening"] != 0):
            raise ConfigError(
                "AdaScaleSGD: nesterov=True needs momentum > 0 and dampening = 0 (as torch.optim.SGD).",
                problems=[("nesterov", "requires momentum > 0 and dampening = 0")],
                target="AdaScaleSGD",
            )
        self.world_size = _world_size()
        _check_samples(self.world_size, hp["num_gradients_to_accumulate"])
        self._hook_handles: list[Any] = []
        self._pending: list[list[Tensor]] = []  # per group: |g_i|^2 recorded by the hooks since the last step
        self._totals: list[list[Tensor]] = []  # per group (one process): |.grad|^2 after the last backward
        defaults = {k: hp[k] for k in ("lr", "momentum", "dampening", "weight_decay", "nesterov")}
        super().__init__(params, defaults)
        #: FSDP2's DTensor shards: the per-worker norms come from the unsharded stand-ins
        self._fsdp = any(_sharded.is_sharded(p) for g in self.param_groups for p in g["params"])

        self.num_gradients_to_accumulate: int = hp["num_gradients_to_accumulate"]
        self.is_scaled_loss: bool = hp["is_scaled_loss"]
        self.debias_ewma: bool = hp["debias_ewma"]
        samples = self.world_size * self.num_gradients_to_accumulate
        self._smoothing = float(hp["smoothing"] if hp["smoothing"] is not None else max(1 - samples / 1000, 0.0))
        self._scale = float(hp["scale"] if hp["scale"] is not None else samples)
        self._device = next((p.device for g in self.param_groups for p in g["params"]), torch.device("cpu"))
        # shape (1,), not 0-d: torch.compile drops in-place updates of 0-d tensor attributes
        self._progress = torch.zeros(1, dtype=_F64, device=self._device)
        # sigma^2 (squared norm) starts at 1 and the variance at 0: gain 1 until measured.
        self._avg: dict[str, Tensor] = {}
        self._complete_estimates()
        self._acc = _Accumulation()
        for index, group in enumerate(self.param_groups):
            self._watch(index, group)

    def _complete_estimates(self) -> None:
        """Create every running-average tensor either EWMA mode needs (updated in
        place, so a compiled step sees one fixed set of tensors)."""
        n = len(self.param_groups)
        for name in _ESTIMATES:
            fill = 1.0 if name == "grad_sqr_avg" else 0.0
            self._avg.setdefault(name, torch.full((n,), fill, dtype=_F64, device=self._device))
            for suffix in ("_biased", "_unbias", "_total"):
                self._avg.setdefault(name + suffix, torch.zeros(n, dtype=_F64, device=self._device))
            self._avg.setdefault(name + "_count", torch.zeros(1, dtype=_F64, device=self._device))

    def _reset_accumulation(self) -> None:
        """Forget the backward passes since the last step (transient, never saved)."""
        for parts in self._pending + self._totals:
            parts.clear()
        acc = self._acc  # its fields are reset, never the object (see _Accumulation)
        acc.backwards, acc.queued, acc.local, acc.total, acc.settled, acc.provisional = 0, False, None, None, 0, None

    # ----------------------------------------------------------------- hooks
    def _watch(self, index: int, group: Mapping[str, Any]) -> None:
        """Record the squared norm of every gradient autograd produces for ``group``'s params.

        In one process ``step()`` also needs ``|.grad|^2`` to know the gain before
        it touches a parameter (then it updates each in one pass): a
        post-accumulate hook reads ``.grad`` right after the last pass wrote it.
        Under DDP ``.grad`` is averaged after the hooks, so ``step()`` measures
        it instead."""
        self._pending.append([])
        self._totals.append([])
        ref = weakref.ref(self)  # the hook must not keep the optimizer alive

        def watch(p: Tensor) -> tuple[Callable[[Tensor], None], Callable[[Tensor], None]]:

            def record(grad: Tensor) -> None:
                opt = ref()
                if opt is None:
                    return
                acc = opt._acc
                opt._pending[index].append(_squared_norm(grad.detach()))
                if not acc.queued:  # once per backward pass: count it when the pass ends
                    acc.queued = True
                    Variable._execution_engine.queue_callback(opt._backward_done)

            def settle(q: Tensor) -> None:
                opt = ref()
                if opt is not None and opt._acc.backwards == opt.num_gradients_to_accumulate - 1:
                    if q.grad is not None:  # the last pass: .grad is final
                        opt._totals[index].append(_squared_norm(q.grad))

            return record, settle

        sharded = [(index, p) for p in group["params"] if p.requires_grad and _sharded.is_sharded(p)]
        if sharded:  # FSDP2: autograd writes the gradients of unsharded stand-ins (see _sharded)
            self._hook_handles.append(_sharded.UnshardedWatch(sharded, lambda _: watch(None)[0]))
        for p in group["params"]:
            if p.requires_grad and not _sharded.is_sharded(p):
                record, settle = watch(p)
                self._hook_handles.append(p.register_hook(record))
                if self.world_size == 1:
                    self._hook_handles.append(p.register_post_accumulate_grad_hook(settle))

    def _backward_done(self) -> None:
        """End of a backward pass that produced gradients for our params. After the
        ``c``-th, sum the recorded norms and all-reduce them (one tensor of
        ``n_groups`` numbers; stream-ordered on NCCL), so neither ``gain()`` nor
        ``step()`` needs a collective."""
        self._acc.queued = False
        self._acc.backwards += 1
        if self._acc.backwards != self.num_gradients_to_accumulate:
            return
        local = torch.stack([_sum64(parts, self._device) for parts in self._pending])
        if getattr(self, "_fsdp", False):  # the shards' .grad are reduced by now: |g|^2 travels with the per-worker sums
            # each element once: a shard replicated over HSDP's replicate dimension counts once per copy
            shards = [[_squared_norm(p.grad) / _sharded.copies(p.grad) for p in g["params"] if p.grad is not None]
                      for g in self.param_groups]
            both = torch.cat([local, torch.stack([_sum64(parts, self._device) for parts in shards])])
            dist.all_reduce(both)
            local, self._acc.total = both[: len(local)], both[len(local) :]
            self._acc.settled = sum(len(parts) for parts in shards)
        elif self.world_size > 1:
            dist.all_reduce(local)
        else:  # |.grad|^2 of every param the last pass reached
            self._acc.total = torch.stack([_sum64(parts, self._device) for parts in self._totals])
            self._acc.settled += sum(len(parts) for parts in self._totals)
        for parts in self._pending + self._totals:
            parts.clear()
        self._acc.local = local

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        super().add_param_group(param_group)
        if not hasattr(self, "_avg"):  # called from torch's __init__; __init__ watches the groups
            return
        if self._acc.backwards:
            raise AccumulationError("AdaScaleSGD: add param groups between steps, not during the accumulation.")
        self._watch(len(self.param_groups) - 1, self.param_groups[-1])
        for name, value in self._avg.items():
            if not name.endswith("_count"):  # per-group vectors; "_count" is one number
                fill = 1.0 if name == "grad_sqr_avg" else 0.0
                self._avg[name] = torch.cat([value, value.new_full((1,), fill)])

    def unhook(self) -> None:
        """Remove the gradient hooks (for example before deleting the model)."""
        for handle in self._hook_handles:
            handle.remove()
        self._hook_handles = []

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Zero the gradients and forget the backward passes recorded for them."""
        self._reset_accumulation()
        super().zero_grad(set_to_none)

    # ------------------------------------------------------------ public state
    @property
    def scale(self) -> float:
        """The batch size relative to the one ``lr`` was tuned for (``S``)."""
        return self._scale

    @property
    def smoothing(self) -> float:
        """Factor of the moving averages of gradient variance and squared norm."""
        return self._smoothing

    @property
    def progress(self) -> float:
        """Scale-invariant iterations so far: the sum of the gains of every step.

        Drive a schedule with it (``LambdaLR`` reading ``opt.progress``, or a
        scheduler stepped when it crosses the next integer) to train in the
        number of small-batch iterations the run stands for."""
        return float(self._progress)

    def gain(self, pg_idx: int | None = None) -> float:
        """The gain ratio ``r`` of group ``pg_idx``, or of all groups' summed
        statistics (what ``progress`` adds); 1 before anything was measured.

        After the last backward pass of a step it is the gain that ``step()``
        will apply (it measures ``|.grad|^2`` now; fairscale does so at the end
        of that backward pass); between steps, the gain of the last step. With a
        loss scale the preview measures the gradients as they are (gains hardly
        depend on a constant loss scale); ``step(scale=...)`` or GradScaler then
        measures them again on their true scale."""
        acc = self._acc
        if acc.local is not None and acc.provisional is None and acc.backwards == self.num_gradients_to_accumulate:
            self._check_settled()
            snapshot = {k: v.clone() for k, v in self._avg.items()}
            total = acc.total if acc.total is not None else torch.stack([
                _sum64([_squared_norm(p.grad) for p in g["params"] if p.grad is not None], self._device)
                for g in self.param_groups
            ])
            self._observe(self._acc.local, total, 1.0)
            self._acc.provisional = (snapshot, total)
        var, sqr = self._avg["grad_var_avg"], self._avg["grad_sqr_avg"]
        if pg_idx is None:
            v, s = float(var.sum()), float(sqr.sum())
        else:
            v, s = float(var[pg_idx]), float(sqr[pg_idx])
        return (v + s) / (v / self._scale + s)

    def set_scale(self, scale: float, update_estimate: bool = True) -> None:
        """Change ``S`` (the batch grew or shrank). The variance estimate is
        measured at scale ``S``, so it is rescaled by ``old / new`` unless
        ``update_estimate=False``."""
        if not scale >= 1:
            raise ConfigError(f"AdaScaleSGD: scale must be >= 1, got {scale}.", problems=[("scale", "must be >= 1")])
        if update_estimate:
            ratio = self._scale / float(scale)
            for name in ("grad_var_avg", "grad_var_avg_biased" if self.debias_ewma else "grad_var_avg_total"):
                self._avg[name].mul_(ratio)
        self._scale = float(scale)

    def set_num_gradients_to_accumulate(self, num_gradients_to_accumulate: int, update_smoothing: bool = True) -> None:
        """Accumulate a new number of backward passes per step (fairscale's
        method). ``scale`` stays as it is: call :meth:`set_scale` as well if the
        batch relative to the tuned one changed. With ``update_smoothing`` the
        smoothing becomes ``max(1 - world size x n / 1000, 0)``. Call it between
        steps, not in the middle of an accumulation."""
        if self._acc.backwards:
            raise AccumulationError(
                f"AdaScaleSGD.set_num_gradients_to_accumulate({num_gradients_to_accumulate}) was called after "
                f"{self._acc.backwards} backward pass(es) of a step; call it after step() or zero_grad()."
            )
        hp = validate_hparams(
            self.config_schema,
            {**self._global_hparams(), "num_gradients_to_accumulate": num_gradients_to_accumulate},
            "AdaScaleSGD",
        )
        _check_samples(self.world_size, hp["num_gradients_to_accumulate"])
        self.num_gradients_to_accumulate = hp["num_gradients_to_accumulate"]
        if update_smoothing:
            self._smoothing = max(1 - self.world_size * self.num_gradients_to_accumulate / 1000, 0.0)

    @property
    def optimizer_config(self) -> dict[str, Any]:
        return {**super().optimizer_config, **self._global_hparams()}

    # -------------------------------------------------------------------- step
    def _check_settled(self) -> None:
        """Drop the hooks' ``|.grad|^2`` if the last pass did not reach every
        ``.grad`` (a param used only in earlier passes): ``.grad`` is read instead."""
        acc = self._acc
        if acc.total is not None and acc.settled != sum(p.grad is not None for g in self.param_groups for p in g["params"]):
            acc.total = None

    def _check_watched(self) -> None:
        """Under FSDP2: a StepError, before anything changes, if the backward
        passes recorded the per-worker norms of some sharded parameters and not
        of others that have gradients (a gain from part of the gradient). With
        none recorded (DCP's initialisation step, gradients set by hand) the
        gain is kept, with the one-time warning of :meth:`_warn_unmeasured`."""
        if not getattr(self, "_fsdp", False) or not self._acc.backwards:
            return
        missing = [p for w in self._hook_handles if isinstance(w, _sharded.UnshardedWatch) for p in w.unwatched()]
        if missing:
            self._reset_accumulation()
            raise StepError(
                f"AdaScaleSGD: {len(missing)} FSDP2 parameters (shapes {[tuple(p.shape) for p in missing[:4]]}) have "
                "gradients, but no forward pass ran through them after the optimizer was built, so the per-worker "
                "gradient norms its gain needs were not recorded. Build the optimizer before the forward pass of "
                "its first step."
            )

    def _check_backwards(self) -> None:
        c, done = self.num_gradients_to_accumulate, self._acc.backwards
        if done and done != c:
            raise AccumulationError(
                f"AdaScaleSGD.step() after {done} backward pass(es), but num_gradients_to_accumulate is {c}: "
                f"each step takes exactly {c} (each one a gradient sample of the variance estimate, "
                "under DDP the first ones inside model.no_sync()). Run the remaining backward passes, "
                "or call set_num_gradients_to_accumulate() between steps if the accumulation changed."
            )

    @torch.no_grad()
    def step(  # type: ignore[override]
        self,
        closure: Callable[[], float] | None = None,
        scale: float = 1.0,
        groups: GroupSelector = None,
    ) -> float | None:
        """One AdaScale step: update the gradient statistics, then SGD with
        ``lr * gain`` on every group; gradients are treated as divided by
        ``scale`` (and by GradScaler's ``grad_scale``). Under torch.compile the
        same step runs without host synchronisation (the gain stays a tensor)."""
        prepared = prepare_step(self, closure, scale, groups, state_kind="floating")  # the contract's checks: nothing changed yet
        loss, scale = prepared.loss, prepared.scale
        if _world_size() != self.world_size:
            raise StepError(
                f"AdaScaleSGD was built for world size {self.world_size} but torch.distributed now has "
                f"{_world_size()} ranks; build the optimizer after init_process_group."
            )
        self._check_backwards()
        self._check_watched()
        if prepared.skip:  # GradScaler found inf/NaN gradients: skip this step's update
            if self._acc.provisional is not None:  # gain() measured inf/NaN gradients: undo
                for name, value in self._acc.provisional[0].items():
                    self._avg[name].copy_(value)
            self._reset_accumulation()
            return loss

        acc = self._acc
        self._check_settled()
        update_scale = scale if self.is_scaled_loss else scale * self.num_gradients_to_accumulate
        if acc.local is not None and acc.total is None and acc.provisional is None:
            # DDP: |.grad|^2 of the averaged gradient is read in the first pass
            # (while each gradient is in cache), the gain applied in a second
            passes = [self._first_pass(group, update_scale, measure=True) for group in self.param_groups]
            self._observe(acc.local, torch.stack([_sum64(squares, self._device) for squares, *_ in passes]), scale)
            self._reset_accumulation()
            gains = self._gains()  # per group, then the total
            factors = gains if torch.compiler.is_compiling() else gains.tolist()
            for index, (group, (_, params, directions, carried)) in enumerate(zip(self.param_groups, passes)):
                if params:  # p -= lr * gain * direction
                    _apply(params, directions, factors[index], -float(group["lr"]) / carried)
        else:
            # |.grad|^2 known from the hooks (one process) or from gain(): one pass per parameter
            if acc.provisional is not None:
                if scale != 1.0:  # gain() measured at scale 1: measure again on the true scale
                    for name, value in acc.provisional[0].items():
                        self._avg[name].copy_(value)
                    self._observe(acc.local, acc.provisional[1], scale)
            elif acc.local is not None:
                self._observe(acc.local, acc.total, scale)
            elif not torch.compiler.is_compiling():
                self._warn_unmeasured()
            self._reset_accumulation()
            gains = self._gains()
            factors = gains if torch.compiler.is_compiling() else gains.tolist()
            for index, group in enumerate(self.param_groups):
                self._first_pass(group, update_scale, measure=False, gain=factors[index])
        self._progress.add_(gains[-1])
        return loss

    def _warn_unmeasured(self) -> None:
        if not getattr(self, "_warned_unobserved", False):
            self._warned_unobserved = True
            warnings.warn(
                "AdaScaleSGD stepped on gradients no backward pass produced through its parameters "
                "(assigned by hand, or copied in by a wrapper holding master copies), so it measured "
                f"nothing and keeps its gain ({self.gain():.3g}). Build it on the parameters autograd "
                "writes to; for fp16 use autocast with torch.amp.GradScaler.",
                stacklevel=3,
            )

    def _gains(self) -> Tensor:
        """The gain of every group followed by the gain of the summed statistics."""
        var, sqr = self._avg["grad_var_avg"], self._avg["grad_sqr_avg"]
        var, sqr = torch.cat([var, var.sum().view(1)]), torch.cat([sqr, sqr.sum().view(1)])
        return (var + sqr) / (var / self._scale + sqr)

    def _first_pass(
        self, group: dict[str, Any], scale: float, measure: bool = True, gain: float | Tensor | None = None
    ) -> tuple[list[Tensor], list[Tensor], list[Tensor], float]:
        """The part of torch.optim.SGD's update that does not need the gain (weight
        decay, momentum), plus ``|g|^2`` if ``measure``; with ``gain``, the whole
        update (``p -= lr * gain * direction`` while the direction is in cache).

        On CPU it runs tensor by tensor, as torch's CPU default does, so each
        gradient is still in cache when its norm is taken, and the usual
        momentum update is one fused pass (torch's ``mul_`` then ``add_``, up to
        rounding); elsewhere as multi-tensor ops. Gradients count as divided by
        ``scale``, folded into the scalar factors. Returns the squared gradient
        norms, the params, their update directions, and the factor the
        directions still carry (``scale``, or 1 for the momentum buffer).
        """
        params = [p for p in group["params"] if p.grad is not None]
        momentum, dampening = group["momentum"], group["dampening"]
        weight_decay, nesterov = group["weight_decay"], group["nesterov"]
        squares: list[Tensor] = []
        directions: list[Tensor] = []
        if not params:
            return squares, params, directions, 1.0
        for chunk in _chunks(params):
            grads = [p.grad for p in chunk]
            # d = scale * (grad / scale + weight_decay * param); each use of d divides by scale
            d = torch._foreach_add(grads, chunk, alpha=weight_decay * scale) if weight_decay else grads
            if momentum:
                bufs = [self.state[p].get("momentum_buffer") for p in chunk]
                running = [i for i, b in enumerate(bufs) if b is not None]
                coef = (1 - dampening) / scale
                if running and coef == 1 and len(chunk) == 1:  # buf = d + momentum * buf, in one pass
                    torch.add(d[0], bufs[0], alpha=momentum, out=bufs[0])
                elif running:  # buf = momentum * buf + (1 - dampening) * d / scale
                    torch._foreach_mul_([bufs[i] for i in running], momentum)
                    torch._foreach_add_([bufs[i] for i in running], [d[i] for i in running], alpha=coef)
                for i, p in enumerate(chunk):
                    if bufs[i] is None:  # first step: buf = d / scale
                        bufs[i] = self.state[p]["momentum_buffer"] = torch.mul(d[i], 1 / scale).detach()
                # nesterov: d / scale + momentum * buf, still carrying scale
                d = torch._foreach_add(d, bufs, alpha=momentum * scale) if nesterov else bufs
            carried = 1.0 if momentum and not nesterov else scale
            if gain is not None:
                _apply(chunk, d, gain, -float(group["lr"]) / carried)
            else:
                directions += d
            if measure:
                squares += [_squared_norm(g) for g in grads]  # on CPU the gradient is still in cache
        return squares, params, directions, 1.0 if momentum and not nesterov else scale

    def _observe(self, local: Tensor, total: Tensor, scale: float) -> None:
        """Turn the summed per-sample ``|g_i|^2`` and the averaged gradient's
        squared norms (per group, float64) into new variance and squared-norm
        estimates (Appendix B.3). Tensor ops only: no host synchronisation."""
        local_sqr, total_sqr = local / scale**2, total / scale**2
        c = self.num_gradients_to_accumulate
        if c > 1:  # put both on the scale of one accumulation step's loss
            if self.is_scaled_loss:
                local_sqr = local_sqr * c**2
            else:
                total_sqr = total_sqr / c**2
        S, n = self._scale, self.world_size * c
        grad_var = local_sqr * (S / n) / (n - 1) - total_sqr * S / (n - 1)
        grad_sqr = total_sqr - grad_var / S
        self._update_avg("grad_sqr_avg", grad_sqr.clamp(min=0.0))
        self._update_avg("grad_var_avg", grad_var.clamp(min=1e-6))

    def _update_avg(self, name: str, value: Tensor) -> None:
        f, avg = self._smoothing, self._avg
        if self.debias_ewma:
            biased, unbias = avg[name + "_biased"], avg[name + "_unbias"]
            biased.mul_(f).add_(value, alpha=1 - f)
            unbias.mul_(f).add_(1 - f)
            avg[name].copy_(biased / unbias)
        else:  # Appendix B.3: the plain mean for the first 1 / (1 - f) steps, then the EWMA
            count, total = avg[name + "_count"], avg[name + "_total"]
            count.add_(1)
            early = count < 1 / (1 - f)
            total.add_(torch.where(early, value, 0.0))
            avg[name].copy_(torch.where(early, total / count, f * avg[name] + (1 - f) * value))

    # -------------------------------------------------------------- checkpoint
    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state.update({k: self.__dict__[k] for k in _PICKLED if k in self.__dict__})
        for k in ("_hook_handles", "_pending", "_totals", "_acc"):
            state.pop(k, None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        if "_avg" in state:  # unpickled or deep-copied: hooks do not travel with the params
            self._hook_handles, self._pending, self._totals = [], [], []
            self._acc = _Accumulation()
            for index, group in enumerate(self.param_groups):
                self._watch(index, group)

    def state_dict(self) -> dict[str, Any]:
        """torch's state dict plus an ``"adascale"`` entry of tensors, floats and
        the parameter count of each group (so ``torch.load(weights_only=True)``
        reads it, and a different model's estimates are refused on load)."""
        state = super().state_dict()
        estimates = {k: v.clone() for k, v in self._avg.items()}
        state["adascale"] = {
            "scale": self._scale, "progress": self.progress, "group_numel": self._group_numel(), **estimates
        }
        return state

    def _group_numel(self) -> list[int]:
        return [sum(p.numel() for p in g["params"]) for g in self.param_groups]

    def _check_saved(self, saved: Any) -> None:
        """Refuse AdaScale estimates measured on other parameters (they are sums
        over each group's elements, so another model's would set a wrong gain),
        and counters and estimates no run produces: a scale that is not finite
        and > 0, a negative or non-finite progress (the scale-invariant step
        count) or sample count, a NaN or infinite estimate."""
        if not isinstance(saved, Mapping):
            raise ConfigError(
                f"AdaScaleSGD.load_state_dict: the checkpoint's 'adascale' entry is {reprlib.repr(saved)}, "
                "not AdaScale's estimates. The checkpoint is damaged or was edited; load it as it was saved, "
                "or drop its 'adascale' entry to start the estimates afresh.",
                problems=[("adascale", "not a mapping")], target="AdaScaleSGD",
            )
        n = len(self.param_groups)
        problems = [(f"adascale.{key}", "missing") for key in ("scale", "progress") if key not in saved]
        for key, low in (("scale", 0.0), ("progress", None)):
            value = saved.get(key, 1.0)
            if not _finite_number(value) or (value <= low if low is not None else value < 0):
                problems.append((f"adascale.{key}", f"{reprlib.repr(value)}, not a finite number "
                                 + ("> 0" if low is not None else ">= 0")))
        numel = saved.get("group_numel")
        if numel is not None and (not isinstance(numel, (list, tuple)) or list(numel) != self._group_numel()):
            problems.append(("adascale.group_numel", f"checkpoint {reprlib.repr(numel)}, this optimizer "
                             f"{self._group_numel()}"))
        for key, value in saved.items():
            name = key if isinstance(key, str) and key.isidentifier() else reprlib.repr(key)
            if key in ("scale", "progress", "group_numel"):
                continue
            if not isinstance(key, str) or not any(key == e or key.startswith(e + "_") for e in _ESTIMATES):
                problems.append((f"adascale.{name}", "not an AdaScale estimate"))
                continue
            if not isinstance(value, Tensor) and not _finite_number(value):
                problems.append((f"adascale.{name}", f"{reprlib.repr(value)}, not a tensor or a number"))
                continue
            tensor = torch.as_tensor(value)
            shape = tuple(tensor.shape)
            want = (1,) if key.endswith("_count") else (n,)
            if key.endswith("_count") and shape == ():
                shape = (1,)
            if shape != want:
                problems.append((f"adascale.{name}", f"shape {shape}, expected {want} ({n} param groups)"))
            elif tensor.is_complex() or not bool(torch.isfinite(tensor.double()).all()):
                problems.append((f"adascale.{name}", "not finite real numbers"))
            elif key.endswith("_count") and bool((tensor < 0).any()):
                problems.append((f"adascale.{name}", "a negative count"))
        if problems:
            raise ConfigError(
                "AdaScaleSGD.load_state_dict: the checkpoint's AdaScale estimates belong to a different model "
                "(the numbers of parameter elements or param groups differ) or were edited: "
                + "; ".join(f"{k}: {m}" for k, m in problems)
                + ". Load it into the model it was saved from, "
                "or drop its 'adascale' entry to start the estimates afresh.",
                problems=problems,
                target="AdaScaleSGD",
            )

    def load_state_dict(  # type: ignore[override]
        self, state_dict: Mapping[str, Any], optimizer_overrides: Mapping[str, Any] | None = None
    ) -> None:
        """Load the SGD state and the running estimates. AdaScale's own
        hyper-parameters stay as built (the variance estimate is rescaled to the
        current ``scale`` if the checkpoint's differs); ``optimizer_overrides``
        may set them, ``scale`` through :meth:`set_scale`."""
        state_dict = dict(state_dict)
        saved = state_dict.pop("adascale", None)
        if saved is not None:
            self._check_saved(saved)
        overrides = dict(optimizer_overrides or {})
        own = {k: overrides.pop(k) for k in _GLOBAL_HPARAMS if k in overrides}
        super().load_state_dict(state_dict, overrides or None)
        self._reset_accumulation()
        if saved is not None:
            current, n = self._scale, len(self.param_groups)
            self._avg = {
                k: torch.as_tensor(v, dtype=_F64).to(self._device).clone().reshape(-1 if k.endswith("_count") else n)
                for k, v in saved.items() if k not in ("scale", "progress", "group_numel")
            }
            self._complete_estimates()
            self._progress = torch.tensor([float(saved["progress"])], dtype=_F64, device=self._device)
            self._scale = float(saved["scale"])
            self.set_scale(current)
        if own:
            hp = validate_hparams(self.config_schema, {**self._global_hparams(), **own}, "AdaScaleSGD")
            _check_samples(self.world_size, hp["num_gradients_to_accumulate"])
            self.num_gradients_to_accumulate = hp["num_gradients_to_accumulate"]
            self.is_scaled_loss, self.debias_ewma = hp["is_scaled_loss"], hp["debias_ewma"]
            if own.get("smoothing") is not None:
                self._smoothing = float(hp["smoothing"])
            if own.get("scale") is not None:
                self.set_scale(hp["scale"])

    def _global_hparams(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in _GLOBAL_HPARAMS}

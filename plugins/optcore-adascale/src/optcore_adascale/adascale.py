r"""AdaScale SGD (Johnson, Agrawal, Gu, Guestrin, ICML 2020).

A batch ``S`` times larger than the one the learning rate was tuned for
averages ``S`` gradient samples, which helps only as far as the samples
disagree. AdaScale measures that disagreement and multiplies the learning
rate by the gain ratio ``r`` (between 1 and ``S``)::

    c = num_gradients_to_accumulate, N = world size, n = c * N samples per step
    g_i      the gradient of one worker's accumulation step (seen by a hook, before DDP averages)
    g        = mean_i g_i                      (the .grad that step() reads)
    local    = sum_i |g_i|^2                   (all-reduced: ONE tensor of n_groups + 1 numbers)
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
own gradient. Everything else happens in ``step()``, when ``.grad`` holds the
averaged gradient: no autograd-engine callbacks and no counting of backward
passes (fairscale needs both), and one all-reduce of ``n_groups + 1`` numbers.
"""

from __future__ import annotations

import warnings
import weakref
from collections.abc import Callable, Iterable, Mapping
from typing import Any, ClassVar

import torch
import torch.distributed as dist
from torch import Tensor

from optcore import ConfigError, Optimizer, validate_hparams
from optcore import GroupSelector

from ._config import AdaScaleSGDConfig

_F64 = torch.float64
#: attributes that a pickle or deep copy carries besides torch's defaults, state and groups.
_PICKLED = ("world_size", "num_gradients_to_accumulate", "is_scaled_loss", "debias_ewma",
            "_smoothing", "_scale", "_progress", "_avg")
#: AdaScale's own hyper-parameters: global, so they live on the optimizer, not in param groups.
_GLOBAL_HPARAMS = ("num_gradients_to_accumulate", "scale", "smoothing", "is_scaled_loss", "debias_ewma")


def _squared_norm(t: Tensor) -> Tensor:
    """``|t|^2`` as a 0-d tensor: BLAS ``dot`` for dense fp32 (on CPU faster than
    torch's norm reduction, which barely uses a second thread), else ``vector_norm`` in fp32."""
    if t.dtype == torch.float32 and t.is_contiguous():
        flat = t.view(-1)
        return torch.dot(flat, flat)
    return torch.linalg.vector_norm(t, dtype=torch.float32).square()


def _chunks(params: list[Tensor]) -> list[list[Tensor]]:
    """One tensor at a time on CPU (cache-friendly, as torch's CPU default);
    one multi-tensor batch on accelerators (fewer kernel launches)."""
    return [[p] for p in params] if params[0].device.type == "cpu" else [params]


def _is_sharded(t: Tensor) -> bool:
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # torch without distributed support
        return False
    return isinstance(t, DTensor)


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


class AdaScaleSGD(Optimizer):
    """SGD whose learning rate is scaled by AdaScale's gain ratio (see the module docstring).

    Build it after ``torch.distributed.init_process_group`` (the world size is read
    then) and before the first backward pass. Under DDP, run the first
    ``num_gradients_to_accumulate - 1`` backward passes of a step inside
    ``model.no_sync()``. Statistics come from the gradients as autograd produced
    them and ``.grad`` at ``step()``: anything that rescales ``.grad`` in between
    (clipping, ``GradScaler.unscale_``) biases the variance estimate; pass a loss
    scale as ``step(scale=...)`` or let ``GradScaler.step`` hand it over instead.
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
    #: GradScaler hands over grad_scale / found_inf instead of unscaling .grad, which
    #: keeps the hook-recorded and the final gradients on the same scale.
    _step_supports_amp_scaling = True
    #: for optcore.testing: one process needs two accumulated gradients per step.
    conformance_inputs: ClassVar[dict[str, Any]] = {
        "config": {"lr": 0.05, "momentum": 0.9, "num_gradients_to_accumulate": 2}
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
        defaults = {k: hp[k] for k in ("lr", "momentum", "dampening", "weight_decay", "nesterov")}
        super().__init__(params, defaults)

        self.num_gradients_to_accumulate: int = hp["num_gradients_to_accumulate"]
        self.is_scaled_loss: bool = hp["is_scaled_loss"]
        self.debias_ewma: bool = hp["debias_ewma"]
        samples = self.world_size * self.num_gradients_to_accumulate
        self._smoothing = float(hp["smoothing"] if hp["smoothing"] is not None else max(1 - samples / 1000, 0.0))
        self._scale = float(hp["scale"] if hp["scale"] is not None else samples)
        self._progress = 0.0
        n = len(self.param_groups)
        # sigma^2 (squared norm) starts at 1 and the variance at 0: gain 1 until measured.
        self._avg: dict[str, Tensor] = {
            "grad_sqr_avg": torch.ones(n, dtype=_F64),
            "grad_var_avg": torch.zeros(n, dtype=_F64),
        }
        if any(_is_sharded(p) for g in self.param_groups for p in g["params"]):
            raise ConfigError(
                "AdaScaleSGD cannot step sharded (DTensor / FSDP) parameters: its variance estimate needs "
                "each worker's whole gradient before averaging. Use DDP (gradient accumulation under "
                "no_sync works), or an optimizer without cross-worker statistics."
            )
        for index, group in enumerate(self.param_groups):
            self._watch(index, group)

    # ----------------------------------------------------------------- hooks
    def _watch(self, index: int, group: Mapping[str, Any]) -> None:
        """Record the squared norm of every gradient autograd produces for ``group``'s params."""
        self._pending.append([])
        ref = weakref.ref(self)  # the hook must not keep the optimizer alive

        def record(grad: Tensor) -> None:
            opt = ref()
            if opt is not None:
                opt._pending[index].append(_squared_norm(grad.detach()))

        for p in group["params"]:
            if p.requires_grad:
                self._hook_handles.append(p.register_hook(record))

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        super().add_param_group(param_group)
        if not hasattr(self, "_avg"):  # called from torch's __init__; __init__ watches the groups
            return
        self._watch(len(self.param_groups) - 1, self.param_groups[-1])
        for name, value in self._avg.items():
            if value.ndim:  # per-group vectors; "_count" is a scalar
                fill = 1.0 if name == "grad_sqr_avg" else 0.0
                self._avg[name] = torch.cat([value, value.new_full((1,), fill)])

    def unhook(self) -> None:
        """Remove the gradient hooks (for example before deleting the model)."""
        for handle in self._hook_handles:
            handle.remove()
        self._hook_handles = []

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Zero the gradients and forget the statistics recorded for them."""
        for parts in self._pending:
            parts.clear()
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
        return self._progress

    def gain(self, pg_idx: int | None = None) -> float:
        """The gain ratio ``r`` of the last step (1 before the first): of group
        ``pg_idx``, or of all groups' summed statistics (what ``progress`` adds)."""
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
                if name in self._avg:
                    self._avg[name] = self._avg[name] * ratio
        self._scale = float(scale)

    @property
    def optimizer_config(self) -> dict[str, Any]:
        return {**super().optimizer_config, **self._global_hparams()}

    # -------------------------------------------------------------------- step
    @torch.no_grad()
    def step(  # type: ignore[override]
        self,
        closure: Callable[[], float] | None = None,
        scale: float = 1.0,
        groups: GroupSelector = None,
    ) -> float | None:
        """One AdaScale step: update the gradient statistics (one all-reduce when
        distributed), then SGD with ``lr * gain`` on every group; gradients are
        treated as divided by ``scale`` (and by GradScaler's ``grad_scale``)."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if groups is not None and len(self._select_groups(groups)) != len(self.param_groups):
            raise ConfigError(
                "AdaScaleSGD steps all param groups at once (supports_groups is False): the gain "
                "comes from one batch's statistics and one all-reduce per step. Give groups their "
                "own lr instead of stepping them separately."
            )
        if _world_size() != self.world_size:
            raise ConfigError(
                f"AdaScaleSGD was built for world size {self.world_size} but torch.distributed now has "
                f"{_world_size()} ranks; build the optimizer after init_process_group."
            )
        grad_scale, found_inf = getattr(self, "grad_scale", None), getattr(self, "found_inf", None)
        if grad_scale is not None:
            scale = scale * float(grad_scale)
        if found_inf is not None and float(found_inf) != 0.0:  # GradScaler: skip this step's update
            for parts in self._pending:
                parts.clear()
            return loss

        update_scale = scale if self.is_scaled_loss else scale * self.num_gradients_to_accumulate
        samples, work = self._reduce_samples()  # overlaps with the first pass
        passes = [self._first_pass(group, update_scale) for group in self.param_groups]
        if work is not None:
            work.wait()
        self._observe(samples, [squares for squares, *_ in passes], scale)
        for index, (group, (_, params, directions, carried)) in enumerate(zip(self.param_groups, passes)):
            if params:  # p -= lr * gain * direction
                torch._foreach_add_(params, directions, alpha=-float(group["lr"]) * self.gain(index) / carried)
        self._progress += self.gain()
        return loss

    def _reduce_samples(self) -> tuple[Tensor, Any]:
        """Sum the recorded ``|g_i|^2`` per group over ranks (one async all-reduce of
        ``n_groups + 1`` numbers; the last says whether any rank recorded anything)."""
        device = next((p.device for g in self.param_groups for p in g["params"]), torch.device("cpu"))
        zero = torch.zeros((), dtype=_F64, device=device)
        local = [torch.stack(parts).to(device, _F64).sum() if parts else zero for parts in self._pending]
        local.append(torch.tensor(float(any(self._pending)), dtype=_F64, device=device))
        for parts in self._pending:
            parts.clear()
        samples = torch.stack(local)
        work = dist.all_reduce(samples, async_op=True) if self.world_size > 1 else None
        return samples, work

    def _first_pass(
        self, group: dict[str, Any], scale: float
    ) -> tuple[list[Tensor], list[Tensor], list[Tensor], float]:
        """The part of torch.optim.SGD's update that does not need the gain (weight
        decay, momentum), plus ``|g|^2``.

        On CPU it runs tensor by tensor, as torch's CPU default does, so each
        gradient is still in cache when its norm is taken, and the usual
        momentum update is one fused pass (torch's ``mul_`` then ``add_``, up to
        rounding); elsewhere as multi-tensor ops. Gradients count as divided by
        ``scale``, folded into the scalar factors. Returns the squared gradient
        norms, the params, their update directions, and the factor the
        directions still carry (``scale``, or 1 for the momentum buffer).
        """
        params = [p for p in group["params"] if p.grad is not None]
        if any(p.grad.is_sparse for p in params):
            raise ConfigError("AdaScaleSGD does not support sparse gradients; use torch.optim.SGD.")
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
            directions += d
            squares += [_squared_norm(g) for g in grads]  # on CPU the gradient is still in cache
        return squares, params, directions, 1.0 if momentum and not nesterov else scale

    def _observe(self, samples: Tensor, squares: list[list[Tensor]], scale: float) -> None:
        """Turn the summed per-sample ``|g_i|^2`` and the averaged gradient's
        squared norms into new variance and squared-norm estimates (Appendix B.3)."""
        n_groups = len(squares)
        zero = samples.new_zeros(())
        total = [torch.stack(sq).to(samples.device, _F64).sum() if sq else zero for sq in squares]
        values = torch.cat([samples, torch.stack(total)]).cpu()
        if values[n_groups] == 0:  # no backward pass on any rank since the last step
            if not getattr(self, "_warned_unobserved", False) and bool(values[n_groups + 1 :].any()):
                self._warned_unobserved = True
                warnings.warn(
                    "AdaScaleSGD stepped on gradients no backward pass produced through its parameters "
                    "(assigned by hand, or copied in by a wrapper holding master copies), so it measured "
                    f"nothing and keeps its gain ({self.gain():.3g}). Build it on the parameters autograd "
                    "writes to; for fp16 use autocast with torch.amp.GradScaler.",
                    stacklevel=4,
                )
            return
        local_sqr, total_sqr = values[:n_groups] / scale**2, values[n_groups + 1 :] / scale**2
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
            avg[name + "_biased"] = f * avg.get(name + "_biased", torch.zeros_like(value)) + (1 - f) * value
            avg[name + "_unbias"] = f * avg.get(name + "_unbias", torch.zeros_like(value)) + (1 - f)
            avg[name] = avg[name + "_biased"] / avg[name + "_unbias"]
        else:  # Appendix B.3: the plain mean for the first 1 / (1 - f) steps, then the EWMA
            count = avg.get(name + "_count", torch.zeros((), dtype=_F64)) + 1
            avg[name + "_count"] = count
            if count < 1 / (1 - f):
                avg[name + "_total"] = avg.get(name + "_total", torch.zeros_like(value)) + value
                avg[name] = avg[name + "_total"] / count
            else:
                avg[name] = f * avg[name] + (1 - f) * value

    # -------------------------------------------------------------- checkpoint
    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state.update({k: self.__dict__[k] for k in _PICKLED if k in self.__dict__})
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        if "_avg" in state:  # unpickled or deep-copied: hooks do not travel with the params
            self._hook_handles, self._pending = [], []
            for index, group in enumerate(self.param_groups):
                self._watch(index, group)

    def state_dict(self) -> dict[str, Any]:
        """torch's state dict plus an ``"adascale"`` entry of tensors and floats
        (so ``torch.load(weights_only=True)`` reads it)."""
        state = super().state_dict()
        estimates = {k: v.clone() for k, v in self._avg.items()}
        state["adascale"] = {"scale": self._scale, "progress": self._progress, **estimates}
        return state

    def load_state_dict(  # type: ignore[override]
        self, state_dict: Mapping[str, Any], optimizer_overrides: Mapping[str, Any] | None = None
    ) -> None:
        """Load the SGD state and the running estimates. AdaScale's own
        hyper-parameters stay as built (the variance estimate is rescaled to the
        current ``scale`` if the checkpoint's differs); ``optimizer_overrides``
        may set them, ``scale`` through :meth:`set_scale`."""
        state_dict = dict(state_dict)
        saved = state_dict.pop("adascale", None)
        overrides = dict(optimizer_overrides or {})
        own = {k: overrides.pop(k) for k in _GLOBAL_HPARAMS if k in overrides}
        super().load_state_dict(state_dict, overrides or None)
        if saved is not None:
            current = self._scale
            self._avg = {
                k: torch.as_tensor(v, dtype=_F64).clone() for k, v in saved.items() if k not in ("scale", "progress")
            }
            self._progress = float(saved["progress"])
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

"""What an optimizer's first step checks about where its parameters live.

Every optcore optimizer gets step hooks from :func:`install` (the contract
installs them when it is built). Until the first real step they do three
things, and after it nothing but one dictionary look-up:

* **DCP's initialisation step.** ``torch.distributed.checkpoint.state_dict``
  makes the state of a fresh optimizer by stepping it with zero gradients and
  ``lr=0`` (``_init_optim_state``), before it saves and before it loads. An
  optimizer whose step does not scale by ``lr`` (Adafactor's relative step,
  weight decay applied with its own step size) moves the parameters there,
  and every optimizer counts a step. :class:`InitStep` runs that step for the
  state's layout and puts back the parameters and what the optimizer holds
  outside ``state``; the state it made is marked a placeholder, dropped by
  the first real step unless a checkpoint loads over it, so the first real
  step is that of a fresh optimizer.
* **Replaced parameters.** A wrapper that swaps the parameters for tensors
  of other shapes (DeepSpeed ZeRO's flat partitions, any stage) is refused by
  :func:`check_not_reshaped` unless the update is elementwise.
* **Replicated statistics.** An optimizer whose ``sharding`` is ``"global"``
  (its update uses statistics over every gradient, AdaScale's gain) is only
  right when every rank steps all parameters; a
  ``ZeroRedundancyOptimizer(optimizer_class=...)`` built by hand hands each
  rank a shard. :func:`check_replicated` raises the same
  :class:`~optcore.ConfigError` on every rank inside ZeRO's step, and
  elsewhere when the ranks' parameters (count, sizes, shapes; one
  all-gather) differ.

The checks of a checkpoint's layout under DCP (:func:`check_dcp_layout`) and
of fused kernels over FSDP2's shards (:func:`refuse_kernels_on_shards`: only
a class that declares ``fused_steps_local_shards = True`` takes them) live
here too: they are about where parameters and state live, and so does
:class:`ShardedMuon` (:mod:`._owned`), the plan's Muon over FSDP2's shards:
each whole matrix orthogonalised on an owner rank, the rest on local rows.
:mod:`._callable` finds DeepSpeed's client optimizer callable on the stack and
refuses the bare tensors it is handed where the engine's model's names would
give other param groups (:func:`plan_without_names`).
"""

from __future__ import annotations

import contextvars
import functools
import sys
import warnings
import zlib
from collections import Counter
from collections.abc import Callable
from typing import Any

import torch

from .._errors import ConfigError
from ._callable import deepspeed_client_model as deepspeed_client_model
from ._callable import plan_without_names as plan_without_names
from ._dcp_flat import dcp_code, frame_of
from ._dcp_flat import flat_record as flat_record
from ._owned import ShardedMuon, is_dtensor, layout_problem

#: instance attributes (in ``__dict__``) the checks keep
STEPPED = "_optcore_stepped"
PLACEHOLDER = "_optcore_placeholder_state"
INSTALLED = "_optcore_first_step_hooks"
BUILT_ON = "_optcore_built_on"
RUNNING = "_optcore_dcp_init_step"


#: set while an optimizer runs DCP's initialisation step: the optimizers its step
#: steps (a composite's parts, a precision wrapper's inner one) just step
_initialising: contextvars.ContextVar[bool] = contextvars.ContextVar("optcore_dcp_init", default=False)


def install(optimizer: Any) -> None:
    """Register the first-step checks as ``optimizer``'s step pre- and
    post-hooks (once). Hooks, not a wrapper around ``step``: torch's step
    wrapper calls them in its own frame, so a compiled step has no frame, and
    no graph break, more than torch's; compiled, they return at once."""
    groups = optimizer.__dict__.get("param_groups", getattr(type(optimizer), "param_groups", None))
    if BUILT_ON not in optimizer.__dict__ and isinstance(groups, list):  # a wrapper's __init__ may not have set them yet
        optimizer.__dict__[BUILT_ON] = [(id(p), tuple(p.shape)) for g in groups for p in g["params"]]
    if optimizer.__dict__.get(INSTALLED, False):
        return
    pre, post = (getattr(optimizer, f"_optimizer_step_{kind}_hooks", None) for kind in ("pre", "post"))
    if not (isinstance(pre, dict) and isinstance(post, dict)):
        return  # not set up as torch's Optimizer.__init__ does: it has no step hooks to run
    pre[INSTALLED] = _before_step  # torch runs the values; the key only has to be its own
    post[INSTALLED] = _after_step
    optimizer.__dict__[INSTALLED] = True


def _before_step(optimizer: Any, args: Any, kwargs: Any) -> None:
    if torch.compiler.is_dynamo_compiling() or optimizer.__dict__.get(STEPPED, False):
        return
    stale = optimizer.__dict__.pop(RUNNING, None)  # a step that raised inside DCP's initialisation
    if stale is not None:
        stale.__exit__(None, None, None)
    init = begin_first_step(optimizer)
    if init is not None:
        optimizer.__dict__[RUNNING] = init.__enter__()


def _after_step(optimizer: Any, args: Any, kwargs: Any) -> None:
    if torch.compiler.is_dynamo_compiling():
        return
    init = optimizer.__dict__.pop(RUNNING, None)
    if init is not None:
        init.__exit__(None, None, None)


@torch._disable_dynamo  # type: ignore[misc]
def begin_first_step(optimizer: Any) -> InitStep | None:
    """Before a step while ``optimizer`` has not stepped: DCP's initialisation
    step is returned as an :class:`InitStep` to run the step in; otherwise a
    placeholder state is dropped, a ``global`` optimizer checked and the
    optimizer marked stepped (``None``: step as usual). Never traced: it runs
    in eager frames only (a compiled step skips it), where dynamo, compiling
    the frames it calls, would count its stack walk as graph breaks."""
    if _initialising.get():  # stepped by an optimizer that runs DCP's initialisation step
        return None
    if not _has_state(optimizer) and in_dcp_init():
        return InitStep(optimizer)
    if optimizer.__dict__.pop(PLACEHOLDER, False):
        optimizer.state.clear()  # DCP's placeholder: the first real step starts fresh
    check_not_reshaped(optimizer)
    if getattr(optimizer, "sharding", None) == "global" and not _reduces_over_shards(optimizer):
        check_replicated(optimizer)
    optimizer.__dict__[STEPPED] = True
    optimizer.__dict__.pop(BUILT_ON, None)
    return None


def _reduces_over_shards(optimizer: Any) -> bool:
    """Whether every parameter is a DTensor shard (FSDP2: the ranks hold the
    same global shapes) and the optimizer reduces its statistics over them."""
    params = [p for g in optimizer.param_groups for p in g["params"]]
    return getattr(optimizer, REDUCES, False) is True and bool(params) and all(
        hasattr(p, "placements") and hasattr(p, "device_mesh") for p in params)


def check_not_reshaped(optimizer: Any) -> None:
    """A :class:`ConfigError` when parameters the optimizer was built on were
    replaced by tensors of other shapes (DeepSpeed's ZeRO stages hand the
    client optimizer flat 1-D partitions of each group) and its update is not
    elementwise: a factored second moment would become an unfactored one, a
    per-tensor or global statistic one over a slice. Replacements of the same
    shapes (a precision wrapper's per-tensor fp32 copies), added groups and a
    step over some of the groups pass."""
    built = optimizer.__dict__.get(BUILT_ON)
    sharding = getattr(optimizer, "sharding", "unknown")
    if not built or sharding == "elementwise" or getattr(optimizer, "supports_flat_params", False) is True:
        return  # a class that declares it steps flat parameters exactly
    now = [(id(p), tuple(p.shape)) for g in optimizer.param_groups for p in g["params"]]
    ids = {i for i, _ in now}
    gone = sorted(shape for i, shape in built if i not in ids)
    came = sorted(shape for i, shape in now if i not in {i for i, _ in built})
    if not came or not Counter(gone) - Counter(came):  # a subset stepped, or stand-ins of the same shapes
        return
    name = type(optimizer).__name__
    raise ConfigError(
        f"{name} was built on parameters of shapes {gone[:4]}{' ...' if len(gone) > 4 else ''} and is asked to "
        f"step tensors of shapes {came[:4]}{' ...' if len(came) > 4 else ''} in their place: a wrapper replaced "
        "them (DeepSpeed's ZeRO stages 1, 2 and 3 hand the client optimizer flat 1-D partitions of each param "
        "group). "
        f"{name}'s update is not elementwise (sharding={sharding!r}): over a flat slice it computes something "
        "else than over the tensors. Build it through optcore.integrations.deepspeed (which refuses what cannot "
        "work before any collective), use ZeRO stage 0, or an elementwise optimizer (AdamW, SGD, Lion).",
        problems=[("sharding", f"{sharding} optimizer over replaced parameters")],
        target=name,
    )


def in_dcp_get() -> bool:
    """Whether DCP's ``get_optimizer_state_dict`` is asking for a state dict."""
    return _on_stack(dcp_code("_get_optim_state_dict"))


def check_dcp_layout(optimizer: Any, state_dict: Any) -> None:
    """Under DCP's ``get_optimizer_state_dict``: a :class:`ConfigError` unless
    ``state_dict`` has one entry per parameter of ``optimizer.param_groups``.
    DCP names each saved entry after the parameter at its position, so a
    layout of the optimizer's own (a precision wrapper's flat fp32 buffer per
    group) would be filed under the wrong names and fail to load."""
    groups = state_dict.get("param_groups") if isinstance(state_dict, dict) else None
    if not isinstance(groups, list) or not in_dcp_get():
        return
    saved = [len(g.get("params", ())) for g in groups]
    live = [len(g["params"]) for g in optimizer.param_groups]
    if saved == live:
        return
    name = type(optimizer).__name__
    hint = " Build it with flat=False (one fp32 copy per parameter)." if getattr(optimizer, "flat", False) else ""
    raise ConfigError(
        f"{name} keeps its optimizer state in a layout of its own ({saved} entries per param group for {live} "
        "parameters), and torch.distributed.checkpoint files state by parameter name, one entry per parameter: "
        f"the checkpoint would not load.{hint} Or save with {name}.state_dict() and torch.save.",
        problems=[("state_dict", "not one entry per parameter")],
        target=name,
    )


def _in_zero_step() -> bool:
    """Whether ``ZeroRedundancyOptimizer`` is stepping this rank's shard (its
    ``_local_step`` on the stack)."""
    zero = getattr(sys.modules.get("torch.distributed.optim"), "ZeroRedundancyOptimizer", None)
    return _on_stack(getattr(getattr(zero, "_local_step", None), "__code__", None))


def _on_stack(code: Any, depth: int = 12) -> bool:
    """Whether ``code`` runs in one of ``depth`` frames above the caller of our caller."""
    return frame_of(code, start=2, depth=depth) is not None


def _has_state(optimizer: Any) -> bool:
    return bool(optimizer.state)


def in_dcp_init() -> bool:
    """Whether DCP's ``_init_optim_state`` is on the stack (a few frames up)."""
    return _on_stack(dcp_code("_init_optim_state"))


class InitStep:
    """DCP's zero-gradient step, run inside it, for the state's layout only: the
    parameters and what the optimizer holds outside ``state`` are put back,
    warnings about the empty step are silenced, and the new state is a
    placeholder."""

    def __init__(self, optimizer: Any) -> None:
        self.optimizer = optimizer

    def __enter__(self) -> InitStep:
        optimizer = self.optimizer
        self.params = [p for g in optimizer.param_groups for p in g["params"]]
        with torch.no_grad():
            self.saved = [p.detach().clone() for p in self.params]
            self.held, self.names = _held(optimizer), set(vars(optimizer))
        self.token = _initialising.set(True)
        self.warnings = warnings.catch_warnings()
        self.warnings.__enter__()
        warnings.simplefilter("ignore")
        return self

    @torch.no_grad()
    def __exit__(self, *exc: Any) -> None:
        self.warnings.__exit__(*exc)
        _initialising.reset(self.token)
        optimizer = self.optimizer
        for p, before in zip(self.params, self.saved):
            p.copy_(before)
        for owner, before, tensors in self.held:
            owner.clear()
            owner.update(before)
            for tensor, value in tensors:
                tensor.copy_(value)
        for name in set(vars(optimizer)) - self.names:  # flags the step set (a warning given once)
            delattr(optimizer, name)
        optimizer.__dict__[PLACEHOLDER] = True


_SKIPPED = ("state", "param_groups", "defaults")


def _held(optimizer: Any) -> list[tuple[dict[Any, Any], dict[Any, Any], list[tuple[torch.Tensor, torch.Tensor]]]]:
    """What the optimizer holds outside ``state``, to put back: (a namespace,
    a shallow copy of it, a copy of each tensor in it) for its own attributes,
    each dict attribute (AdaScale's running averages) and each plain object
    attribute (a loss scaler's counters)."""
    own = {k: v for k, v in vars(optimizer).items() if k not in _SKIPPED}
    spaces: list[dict[Any, Any]] = []
    for value in own.values():
        if isinstance(value, dict):
            spaces.append(value)
        elif hasattr(value, "__dict__") and not isinstance(value, (torch.Tensor, torch.nn.Module, torch.optim.Optimizer, type)):
            spaces.append(vars(value))
    held = [(vars(optimizer), dict(vars(optimizer)), _tensors(own))]
    return held + [(space, dict(space), _tensors(space)) for space in spaces]


def _tensors(space: dict[Any, Any]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(v, v.detach().clone()) for v in space.values() if isinstance(v, torch.Tensor)]


def check_replicated(optimizer: Any, group: Any = None) -> None:
    """The same :class:`ConfigError` on every rank unless all ranks step the
    same parameters: inside ZeRO's step always (no collective), elsewhere when
    one all-gather of (count, elements, shapes) differs between ranks. Ranks
    may hold different values (local SGD averages them now and then)."""
    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size(group) == 1:
        return
    params = [p.detach() for g in optimizer.param_groups for p in g["params"]]
    if _in_zero_step():  # every rank is in ZeRO's step: each raises without a collective
        lines = [f"  this rank: {len(params)} parameters, {sum(p.numel() for p in params)} elements (its shard)"]
    else:
        layout = zlib.crc32(";".join(f"{p.dtype}{tuple(p.shape)}" for p in params).encode())
        device = params[0].device if params else torch.device("cpu")
        if dist.get_backend(group) == "nccl" and device.type != "cuda":
            device = torch.device("cuda", torch.cuda.current_device())
        mine = torch.tensor([len(params), sum(p.numel() for p in params), layout], dtype=torch.int64, device=device)
        gathered = [torch.empty_like(mine) for _ in range(dist.get_world_size(group))]
        dist.all_gather(gathered, mine, group=group)
        rows = [t.tolist() for t in gathered]
        if all(row == rows[0] for row in rows):
            return
        lines = [f"  rank {r}: {n} parameters, {e} elements" for r, (n, e, _) in enumerate(rows)]
    name = type(optimizer).__name__
    raise ConfigError(
        f"{name}'s update uses statistics over the gradients of every parameter (sharding='global'), and the "
        "ranks step different parameters:\n" + "\n".join(lines) + "\n"
        "A ZeroRedundancyOptimizer (or another wrapper that hands each rank a shard) would make each rank "
        f"compute its own statistics from its shard, silently different from one process. Train {name} "
        "unsharded under DDP (optcore.build_optimizer on every rank, the same parameters everywhere), or "
        "shard an optimizer whose sharding is elementwise, factored or per_tensor with "
        "optcore.distributed.zero_redundancy.",
        problems=[("sharding", "global optimizer on sharded parameters")],
        target=name,
    )


def refuse_on_shards(spec: Any, hparams: Any, groups: list[dict[str, Any]]) -> None:
    """What the plan refuses over FSDP2's DTensor shards: fused kernels that
    do not step local shards, and statistics across shards that the optimizer
    does not reduce."""
    refuse_kernels_on_shards(spec, hparams, groups)
    refuse_unreduced_statistics(spec, groups)


#: the class attribute by which an optimizer whose statistics cross shards declares
#: that it reduces them over the mesh itself (optcore-adafactor, optcore-adascale)
REDUCES = "reduces_sharded_statistics"


def refuse_unreduced_statistics(spec: Any, groups: list[dict[str, Any]]) -> None:
    """An optimizer whose update uses statistics over a whole tensor
    (``factored``: Adafactor's row and column means) or over every gradient
    (``global``: AdaScale's gain), refused over FSDP2's DTensor shards when the
    plan is made, before any collective, unless its class declares
    ``reduces_sharded_statistics = True``: stepped shard by shard, it fails on
    mixed tensors or, worse, computes each rank's statistics from its slice."""
    kind = getattr(spec.capabilities, "sharding", None)
    if kind not in ("factored", "global") or getattr(spec.target, REDUCES, False) is True:
        return
    sharded = [tuple(p.shape) for g in groups for p in g["params"] if hasattr(p, "placements") and hasattr(p, "device_mesh")]
    if not sharded:
        return
    what = ("row and column statistics and RMS terms over each whole tensor" if kind == "factored"
            else "statistics over the gradients of every parameter on every rank")
    raise ConfigError(
        f"{spec.name} computes {what} (sharding={kind!r}), and {len(sharded)} of its parameters are DTensor shards "
        f"(FSDP2's fully_shard; shapes {sharded[:4]}{' ...' if len(sharded) > 4 else ''}); it does not declare that it "
        "reduces them across the mesh, so each rank would compute them from its own slice. Use optcore-adafactor's "
        "Adafactor or optcore-adascale's AdaScaleSGD (they reduce their statistics under FSDP2), train unsharded "
        "under DDP, or use an elementwise optimizer (AdamW, SGD, Lion).",
        problems=[("sharding", f"{kind} optimizer over DTensor parameters")],
        target=spec.name,
    )


#: the class attribute by which an optimizer whose update is elementwise declares
#: that its ``fused=True`` kernel steps each rank's local shard of DTensor
#: parameters (``to_local()`` of parameter, gradient and state; optcore-lion's C kernel)
LOCAL_KERNEL = "fused_steps_local_shards"


def kernel_steps_local_shards(spec: Any) -> bool:
    """Whether ``spec``'s class declares ``fused_steps_local_shards = True`` and
    its update is elementwise: only then is a kernel over each rank's slice the
    same update as over the whole tensor."""
    declared = getattr(spec.target, LOCAL_KERNEL, False) is True
    return declared and getattr(spec.capabilities, "sharding", None) == "elementwise"


def refuse_kernels_on_shards(spec: Any, hparams: Any, groups: list[dict[str, Any]]) -> None:
    """``fused=True`` over FSDP2's DTensor shards, refused when the plan is made
    unless the class declares that its kernel steps local shards
    (:data:`LOCAL_KERNEL`): torch's ``_fused_*`` ops have no sharding rule for a
    DTensor, and the step would fail on its first call."""
    asked = [g.get("name", i) for i, g in enumerate(groups) if g.get("fused", hparams.get("fused")) is True]
    sharded = [p for g in groups for p in g["params"] if hasattr(p, "placements") and hasattr(p, "device_mesh")]
    if not (asked and sharded) or kernel_steps_local_shards(spec):
        return
    name = spec.name
    if spec.source == "torch":
        why = (f"torch's fused kernel (aten._fused_{name.lower()}_) has no sharding rule for a DTensor, so the "
               "first step would fail")
    else:
        why = (f"{name}'s class does not declare that its kernel steps each rank's local shard "
               f"({LOCAL_KERNEL} = True, with sharding='elementwise'), so it would be handed DTensors it cannot take")
    raise ConfigError(
        f"{name}: fused=True asks for a fused kernel, and {len(sharded)} parameters are DTensor shards (FSDP2's "
        f"fully_shard): {why}. Leave fused unset, and optcore picks the foreach path, which steps each rank's "
        "local shard (optcore-lion's Lion takes fused=True under FSDP2: its C kernel steps the local shards).",
        problems=[("fused", "fused kernel over DTensor parameters")],
        target=name,
    )

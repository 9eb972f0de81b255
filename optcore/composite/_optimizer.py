"""``CompositeOptimizer``: several optimizers over disjoint parameters, as one.

Its ``param_groups`` are the parts' own group dicts, flat, each with an
``"optimizer"`` entry naming the part that steps it, and all parts share one
``state`` mapping: torch's ``state_dict``, LR schedulers (each group relative to
its own ``initial_lr``), ``clip_grad_norm`` and ``zero_grad`` see one optimizer,
while each part's ``step`` is its own class's, so the numbers are those of the
parts run side by side.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

from .._contract import ContractMixin, GroupSelector
from .._errors import ConfigError, warn_user
from .._spec import OptimizerSpec
from .._values import short_repr


class CompositeOptimizer(ContractMixin, torch.optim.Optimizer):
    """Several optimizers over disjoint parameters: one ``torch.optim.Optimizer``."""

    supports_flat_params = False
    flat_params_unsupported_reason = "a composite steps its parts' parameters with different algorithms"

    def __init__(self, parts: Sequence[torch.optim.Optimizer], routing: Sequence[Mapping[str, Any]] = ()) -> None:
        self.parts = {_label(part): part for part in parts}
        if len(self.parts) != len(parts):
            raise ConfigError("A composite's parts must carry distinct 'optimizer' labels in their param groups.")
        super().__init__([g for part in parts for g in part.param_groups], {})
        for part in parts:
            part.state = self.state  # one mapping: disjoint parameters, so no key is shared
            # the state_dict is the composite's: a part's hooks on its layout (GaLore saves its projector as
            # tensors) run on it, over the one state
            for hook in getattr(part, "_optimizer_state_dict_post_hooks", {}).values():
                self.register_state_dict_post_hook(hook)
            for hook in getattr(part, "_optimizer_load_state_dict_pre_hooks", {}).values():
                self.register_load_state_dict_pre_hook(hook)
        self.routing = tuple(routing)
        # what each part was routed, by group and shape: a precision wrapper re-points the groups to fp32
        # copies of the same shapes after the build, which is no change of routing
        self._routed = {label: _layout(part) for label, part in self.parts.items()}
        self._base_lrs = [_as_float(g["lr"]) for g in self.param_groups]
        self._checked = False
        self.optcore_spec = COMPOSITE_SPEC

    # -- capability flags: true of the whole only when true of every part
    @property  # type: ignore[override]
    def supports_step_with_scale(self) -> bool:
        return all(getattr(p, "supports_step_with_scale", False) for p in self.parts.values())

    @property  # type: ignore[override]
    def supports_memory_efficient_fp16(self) -> bool:
        return all(getattr(p, "supports_memory_efficient_fp16", False) for p in self.parts.values())

    @property  # type: ignore[override]
    def supports_groups(self) -> bool:
        return all(getattr(p, "supports_groups", False) for p in self.parts.values())

    @property  # type: ignore[override]
    def sharding(self) -> str:
        """The most coupling of the parts' (``elementwise`` < ``factored`` < ``per_tensor`` < ``global`` < ``unknown``):
        a shard can be stepped alone only where every part can."""
        return max((getattr(p, "sharding", "unknown") for p in self.parts.values()), key=_COUPLING.index)

    @property  # type: ignore[override]
    def lr_schedule(self) -> str:
        """``"any"`` only when every part takes any schedule; else the most restrictive part's."""
        return max((getattr(p, "lr_schedule", "any") for p in self.parts.values()), key=_SCHEDULES.index)

    @property
    def optimizer_config(self) -> dict[str, Any]:  # type: ignore[override]
        """Each part's effective hyper-parameters, by label."""
        return {label: dict(part.optimizer_config) for label, part in self.parts.items()}

    def set_lr(self, lr: float | Tensor | Sequence[float | Tensor]) -> None:
        """One number is the first group's lr (over its ``lr_scale``); every other
        group keeps its ratio to it from the build, so Muon's 0.02 and AdamW's 3e-4
        move together, as a scheduler moves them. The first group is the first that has an
        lr: a part with a relative step size (Adafactor's, lr ``None``) keeps computing its own."""
        if isinstance(lr, (int, float)) or (isinstance(lr, Tensor) and lr.ndim == 0):
            known = [(g, base) for g, base in zip(self.param_groups, self._base_lrs) if base is not None]
            if not known or not known[0][1]:
                raise ConfigError("set_lr(number) scales every group from the first group's base lr, which is "
                                  f"{'0' if known else 'None'}; pass one lr per group.")
            first = known[0][0].get("lr_scale", 1.0) * lr / known[0][1]
            return super().set_lr([None if base is None else first * base for base in self._base_lrs])
        return super().set_lr(lr)

    def step(  # type: ignore[override]
        self, closure: Callable[[], float] | None = None, scale: float = 1.0, groups: GroupSelector = None
    ) -> float | None:
        """Each part steps its selected groups with its own ``step`` (``scale`` folded in
        where it can); the first step checks that each stepped exactly its own parameters."""
        with torch.enable_grad():
            loss = closure() if closure is not None else None
        selected = {id(g) for g in self._select_groups(groups)}
        stepped: dict[str, set[int]] = {}
        for label, part in self.parts.items():
            local = [i for i, g in enumerate(part.param_groups) if id(g) in selected]
            if not local:
                continue
            before = set(map(id, self.state)) if not self._checked else set()
            if scale == 1.0 and len(local) == len(part.param_groups):
                part.step()
            else:
                part.step(scale=scale, groups=None if len(local) == len(part.param_groups) else local)
            if not self._checked:
                stepped[label] = set(map(id, self.state)) - before
        if not self._checked:
            self._check_routes(stepped)
        return loss

    def _check_routes(self, stepped: dict[str, set[int]]) -> None:
        """After the first step: every part gave state to its own parameters only, and
        to each that had a gradient; a parameter without one is named (a frozen
        module, or a model wrapped after the build, would otherwise step nothing)."""
        self._checked = True
        names = {id(p): f"{r['name']} {r['shape']}" for r, p in zip(self.routing, _params_in_routing_order(self))}
        problems, idle = [], []
        for label, ids in stepped.items():
            part = self.parts[label]
            strangers = ids & _not_built_with(part, self._routed[label])
            if strangers:
                problems.append(f"{label} stepped {len(strangers)} parameters not routed to it")
            if ids:  # a stateful algorithm: each parameter it stepped has state
                missed = [p for g in part.param_groups for p in g["params"] if p.grad is not None and id(p) not in ids]
                if missed:
                    problems.append(f"{label} did not step {[names.get(id(p), tuple(p.shape)) for p in missed][:8]}")
            idle += [f"{names.get(id(p), tuple(p.shape))} -> {label}" for g in part.param_groups for p in g["params"]
                     if p.grad is None and id(p) not in ids]
        if problems:
            raise ConfigError(
                "The composite's first step did not follow its routing: " + "; ".join(problems) + ". Something changed "
                "the parts' param groups after the build; build the optimizer last, over the final model.",
                problems=[("routing", p) for p in problems],
            )
        if idle:
            warn_user(
                f"The composite's first step found no gradient for {len(idle)} parameters, so their optimizer did not "
                f"step them: {idle[:8]}{' ...' if len(idle) > 8 else ''}. A frozen module, an unused branch, or a model "
                "wrapped (FSDP, DDP re-created) after the optimizer was built does this; build the optimizer over the "
                "final model.", UserWarning)

    def part_for(self, group: Mapping[str, Any]) -> torch.optim.Optimizer:
        """The part that steps ``group``: its ``state_shapes`` rule and schema judge
        the group's saved state and values when a state dict loads."""
        return self.parts[group["optimizer"]]

    def load_state_dict(self, state_dict: Mapping[str, Any], optimizer_overrides: Mapping[str, Any] | None = None) -> None:  # type: ignore[override]
        """The contract's loading (each group judged by the part that steps it),
        refused when the saved groups were routed differently; then each part
        gets its groups and the shared state back."""
        groups = state_dict.get("param_groups") if isinstance(state_dict, Mapping) else None
        saved = [g.get("optimizer") if isinstance(g, Mapping) else None for g in groups] if isinstance(groups, list) else []
        mine = [g.get("optimizer") for g in self.param_groups]
        if saved != mine:
            raise ConfigError(
                f"This state_dict's param groups were stepped by {short_repr(saved, 200)}, and this composite's by {mine}: the "
                "routing differs (another config or model). Resume with the config that saved it.",
                problems=[("param_groups", "routed differently")],
            )
        super().load_state_dict(state_dict, optimizer_overrides)
        for label, part in self.parts.items():
            part.param_groups = [g for g in self.param_groups if g["optimizer"] == label]
            part.state = self.state


def _params_in_routing_order(optimizer: CompositeOptimizer) -> list[Tensor]:
    return [p for g in optimizer.param_groups for p in g["params"]]


def _layout(part: torch.optim.Optimizer) -> list[list[tuple[int, ...]]]:
    """The shapes of each of ``part``'s groups' parameters, in order."""
    return [[tuple(p.shape) for p in g["params"]] for g in part.param_groups]


def _not_built_with(part: torch.optim.Optimizer, built: list[list[tuple[int, ...]]]) -> set[int]:
    """The ids of ``part``'s parameters in no place its build gave it: a place
    is a group and a position with the shape it had (a wrapper's fp32 copy, or
    torch's new group dicts after a load, keep every place)."""
    out = set()
    for g, group in enumerate(part.param_groups):
        shapes = built[g] if g < len(built) else []
        out.update(id(p) for i, p in enumerate(group["params"]) if i >= len(shapes) or tuple(p.shape) != shapes[i])
    return out


def _label(part: torch.optim.Optimizer) -> str:
    labels = {g.get("optimizer") for g in part.param_groups}
    if len(labels) != 1 or None in labels:
        raise ConfigError("Each part of a composite needs one 'optimizer' label on all its param groups.")
    return str(labels.pop())


def _as_float(lr: Any) -> float | None:
    """A group's lr as a number; ``None`` where the part computes its own (Adafactor's relative step)."""
    if lr is None:
        return None
    return float(lr.detach()) if isinstance(lr, Tensor) else float(lr)


_COUPLING = ("elementwise", "factored", "per_tensor", "global", "unknown")
_SCHEDULES = ("any", "constant", "none")

COMPOSITE_SPEC = OptimizerSpec(
    name="Composite", source="builtin", provider="optcore", qualified="optcore:Composite", loader=lambda: CompositeOptimizer
)

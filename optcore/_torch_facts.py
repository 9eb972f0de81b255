"""What is true of each ``torch.optim`` class, and of the third-party classes optcore
knows, as plain data (no pydantic import, so that resolving and listing names
stays cheap)."""

from __future__ import annotations

#: name -> (pointwise update: works on one flat param, fused kernel takes ``grad_scale``)
TORCH_FACTS: dict[str, tuple[bool, bool]] = {
    "SGD": (True, True),
    "Adam": (True, True),
    "AdamW": (True, True),
    "Adamax": (True, False),
    "NAdam": (True, False),
    "RAdam": (True, False),
    "RMSprop": (True, False),
    "Adagrad": (True, True),
    "Adadelta": (True, False),
    "ASGD": (True, False),
    "Rprop": (True, False),
    "LBFGS": (False, False),
    "SparseAdam": (False, False),
    "Adafactor": (False, False),  # factored second moment needs the shape
    "Muon": (False, False),  # orthogonalises 2-D updates
}

#: Classes that hold one param group only / evaluate the closure themselves.
SINGLE_GROUP = frozenset({"LBFGS"})
PASSES_CLOSURE = frozenset({"LBFGS"})

#: The contract's ``lr_schedule`` of third-party classes that do not declare it:
#: (top-level package, class name) -> value. Schedule-free optimizers replace the
#: decay by iterate averaging, so they take warm-up and constant schedules only.
KNOWN_LR_SCHEDULE: dict[tuple[str, str], str] = {
    **{("schedulefree", name): "constant" for name in (
        "AdamWScheduleFree", "AdamWScheduleFreeClosure", "AdamWScheduleFreeReference", "AdamWScheduleFreePaper",
        "RAdamScheduleFree", "RAdamScheduleFreeClosure", "SGDScheduleFree", "SGDScheduleFreeClosure",
        "SGDScheduleFreeReference", "ScheduleFreeWrapper", "ScheduleFreeWrapperReference", "ScheduleFreeWrapperSwap")},
    **{("pytorch_optimizer", name): "constant" for name in (
        "ScheduleFreeAdamW", "ScheduleFreeRAdam", "ScheduleFreeSGD", "ScheduleFreeWrapper")},
}


def known_lr_schedule(cls: type) -> str | None:
    """``lr_schedule`` from :data:`KNOWN_LR_SCHEDULE` for ``cls`` or a class it
    derives from; ``None`` for a class optcore knows nothing of."""
    for klass in cls.__mro__:
        value = KNOWN_LR_SCHEDULE.get((klass.__module__.partition(".")[0], klass.__name__))
        if value is not None:
            return value
    return None

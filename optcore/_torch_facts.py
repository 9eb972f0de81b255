"""What is true of each ``torch.optim`` class, and of the third-party classes optcore
knows (their lr schedules, how they couple their elements), as plain data (no pydantic
import, so that resolving and listing names stays cheap)."""

from __future__ import annotations

#: How an update couples elements, so what a shard of a tensor can compute alone:
#: per element; per row and column statistics; per whole tensor (an orthogonalised
#: update, a trust ratio); statistics over all parameters; not known.
SHARDING_KINDS = ("elementwise", "factored", "per_tensor", "global", "unknown")

#: name -> (pointwise update: works on one flat param, fused kernel takes ``grad_scale``, sharding)
TORCH_FACTS: dict[str, tuple[bool, bool, str]] = {
    "SGD": (True, True, "elementwise"),
    "Adam": (True, True, "elementwise"),
    "AdamW": (True, True, "elementwise"),
    "Adamax": (True, False, "elementwise"),
    "NAdam": (True, False, "elementwise"),
    "RAdam": (True, False, "elementwise"),
    "RMSprop": (True, False, "elementwise"),
    "Adagrad": (True, True, "elementwise"),
    "Adadelta": (True, False, "elementwise"),
    "ASGD": (True, False, "elementwise"),
    "Rprop": (True, False, "elementwise"),
    "LBFGS": (False, False, "global"),
    "SparseAdam": (False, False, "elementwise"),
    "Adafactor": (False, False, "factored"),  # factored second moment needs the shape
    "Muon": (False, False, "per_tensor"),  # orthogonalises 2-D updates
}

#: The state each class keeps for a parameter once it has stepped, which a loaded state dict must hold exactly
#: (optcore.guards judges it): ``key`` has the parameter's shape, ``key()`` is 0-dim, ``key?flag`` is kept only
#: while the group's ``flag`` is true. Adafactor's factors follow optcore.guards' factored rule; LBFGS has none.
TORCH_STATE: dict[str, str] = {
    "SGD": "momentum_buffer?momentum",
    **dict.fromkeys(("Adam", "AdamW"), "step() exp_avg exp_avg_sq max_exp_avg_sq?amsgrad"),
    "Adamax": "step() exp_avg exp_inf",
    "NAdam": "step() mu_product() exp_avg exp_avg_sq",
    **dict.fromkeys(("RAdam", "SparseAdam"), "step() exp_avg exp_avg_sq"),
    "RMSprop": "step() square_avg momentum_buffer?momentum grad_avg?centered",
    "Adagrad": "step() sum",
    "Adadelta": "step() square_avg acc_delta",
    "ASGD": "step() eta() mu() ax",
    "Rprop": "step() prev step_size",
    "Adafactor": "step()",
    "Muon": "momentum_buffer",
}

#: ``module top level:class name`` -> sharding, for third-party classes whose update is known.
PACKAGE_SHARDING: dict[str, str] = {
    **dict.fromkeys(
        ("lion_pytorch:Lion", "timm:Lion", "timm:Adan", "timm:AdaBelief", "timm:NAdamW", "timm:LaProp", "timm:MADGRAD",
         "timm:RMSpropTF", "timm:SGDW", "optimi:Adam", "optimi:AdamW", "optimi:SGD", "optimi:RAdam", "optimi:Lion",
         "optimi:Adan", "schedulefree:AdamWScheduleFree", "schedulefree:SGDScheduleFree",
         "schedulefree:RAdamScheduleFree", "schedulefree:AdamWScheduleFreeClosure"),
        "elementwise",
    ),
    **dict.fromkeys(
        ("timm:Adafactor", "timm:AdafactorBigVision", "transformers:Adafactor", "pytorch_optimizer:AdaFactor",
         "pytorch_optimizer:CAME"),
        "factored",
    ),
    **dict.fromkeys(
        ("timm:Lamb", "timm:Lars", "timm:AdamP", "timm:SGDP", "timm:NvNovoGrad", "timm:Kron", "optimi:StableAdamW",
         "pytorch_optimizer:Lamb", "pytorch_optimizer:LARS", "pytorch_optimizer:Shampoo", "pytorch_optimizer:SOAP",
         "pytorch_optimizer:Kron"),
        "per_tensor",
    ),
    **dict.fromkeys(
        ("pytorch_optimizer:DAdaptAdam", "pytorch_optimizer:DAdaptSGD", "pytorch_optimizer:DAdaptLion",
         "pytorch_optimizer:Prodigy"),
        "global",
    ),
}

#: What a class takes of each parameter (shape, dtype, layout), not a hyper-parameter:
#: name -> ((tensor attribute or method, the value it must have, the rule as a reader says it), ...)
PARAM_RULES: dict[str, tuple[tuple[str, object, str], ...]] = {
    "Muon": (("ndim", 2, "2-D parameters only (matrices)"), ("is_complex", False, "real parameters only")),
    "SparseAdam": (("is_sparse", False, "dense parameters only (the gradients are sparse)"),
                   ("is_complex", False, "real parameters only")),
    "Adafactor": (("is_complex", False, "real parameters only"),),
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

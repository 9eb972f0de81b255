"""What is true of each ``torch.optim`` class, as plain data (no pydantic import,
so that resolving and listing names stays cheap)."""

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

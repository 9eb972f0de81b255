"""Several algorithms as one optimizer, and stepping inside the backward pass.

A config with a ``fallback`` beside its ``type``, or a ``param_groups`` entry
with its own ``"optimizer"``, plans one optimizer per algorithm
(:mod:`._routing`) and builds a :class:`CompositeOptimizer`;
``"step_in_backward": true`` builds a :class:`StepInBackward` around any
optimizer. The plan reaches this package through the few names below.
"""

from ._backward import StepInBackward
from ._optimizer import COMPOSITE_SPEC, CompositeOptimizer
from ._routing import (
    backward_flag,
    matrix_only,
    part_links,
    plan_composite,
    place_sharded_matrices,
    refuse_wrapped_step_in_backward,
    routed_groups,
)

__all__ = [
    "COMPOSITE_SPEC", "CompositeOptimizer", "StepInBackward", "backward_flag", "matrix_only", "part_links",
    "plan_composite", "place_sharded_matrices", "refuse_wrapped_step_in_backward", "routed_groups",
]

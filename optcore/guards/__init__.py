"""Checks for input optcore does not control: checkpoints, the tensors a fused
kernel is handed, the gradients and state a step is handed, config patterns
and config nesting.

Each answers "can this be used?" from metadata alone (shapes, dtypes, sizes,
depths, where a module would be imported from), cheaply enough to run on
every load, step or config, and names what is wrong; nothing here changes
what it is given or runs code it judges.
"""

from ._imports import judging_only, locate, not_judged, paths_turned_off, without_imports
from ._kernel_inputs import check_fused_inputs
from ._nesting import MAX_DEPTH, MAX_NODES, check_nesting
from ._patterns import MAX_PATTERN_LENGTH, PatternError, compile_pattern
from ._state import ELEMENTWISE, check_state_dict
from ._step_inputs import STATE_KINDS, grad_problem, overlaps_itself, state_problem, step_problem

__all__ = [
    "ELEMENTWISE",
    "MAX_DEPTH",
    "MAX_NODES",
    "MAX_PATTERN_LENGTH",
    "STATE_KINDS",
    "PatternError",
    "check_fused_inputs",
    "check_nesting",
    "check_state_dict",
    "compile_pattern",
    "grad_problem",
    "judging_only",
    "locate",
    "not_judged",
    "overlaps_itself",
    "paths_turned_off",
    "state_problem",
    "step_problem",
    "without_imports",
]

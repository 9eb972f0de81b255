"""``unwrap``: the optcore optimizer inside the wrappers training stacks add.

accelerate's ``AcceleratedOptimizer`` keeps it as ``.optimizer``, Lightning's
``LightningOptimizer`` as ``._optimizer``, ``ZeroRedundancyOptimizer`` builds
one per rank as ``.optim`` (over that rank's shard), and Hugging Face's
wrappers follow accelerate. The one ``optcore.distributed.zero_redundancy``
returns is itself an optcore optimizer (its contract spans all ranks); inside
one built by hand, the rank's optimizer learns ZeRO's process group, so its
``clip_grad_norm`` measures the norm over every rank's shard. They forward ``step`` and ``zero_grad`` but hide
the rest of the contract (``get_lr``, ``clip_grad_norm``, ``step(scale=)``,
the capability flags, ...); ``optcore.unwrap(opt).clip_grad_norm(1.0)``
reaches it.
"""

from __future__ import annotations

import sys
from typing import Any

from .._contract import ContractMixin
from .._errors import ConfigError

#: Where known wrappers keep what they wrap, tried in this order.
WRAPPED_ATTRIBUTES = ("optimizer", "_optimizer", "optim")


def unwrap(optimizer: Any) -> Any:
    """The optcore optimizer ``optimizer`` is or wraps (itself when it is one).

    Raises :class:`~optcore.ConfigError` when nothing inside is an optcore
    optimizer, saying what was found.
    """
    seen: list[str] = []
    current = optimizer
    for _ in range(8):  # wrappers nest a few deep at most (Lightning -> accelerate -> optcore)
        imitated = vars(current).get("_optimizer") if hasattr(current, "__dict__") else None
        if imitated is not None and imitated is not current:
            # LightningOptimizer subclasses the class it wraps (isinstance holds) but not its state
            seen.append(type(current).__name__)
            current = imitated
            continue
        if isinstance(current, ContractMixin):
            return current
        seen.append(type(current).__name__)
        inner = next((getattr(current, a) for a in WRAPPED_ATTRIBUTES if _has(current, a)), None)
        if inner is None or inner is current:
            break
        _mark_shard(current, inner)
        current = inner
    raise ConfigError(
        f"No optcore optimizer inside {' -> '.join(seen)}: build the optimizer with optcore.build_optimizer "
        "(or optcore.build) and hand that to the trainer, then optcore.unwrap() finds it again."
    )


def _has(obj: Any, attribute: str) -> bool:
    try:
        value = object.__getattribute__(obj, attribute)
    except AttributeError:
        value = getattr(obj, attribute, None)
    return value is not None and hasattr(value, "param_groups")


def _mark_shard(wrapper: Any, inner: Any) -> None:
    """Give a ``ZeroRedundancyOptimizer``'s local optimizer ZeRO's process group."""
    zero = getattr(sys.modules.get("torch.distributed.optim"), "ZeroRedundancyOptimizer", None)
    if zero is not None and isinstance(wrapper, zero) and isinstance(inner, ContractMixin):
        inner.shard_group = wrapper.process_group

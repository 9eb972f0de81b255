"""optcore-lion: the Lion optimizer (Chen et al. 2023) as an optcore plugin.

Installing this distribution registers ``Lion`` in the entry-point group
``optcore.optimizers``, so ``optcore.build_optimizer({"type": "Lion"}, model)``
works (``"optcore_lion:Lion"`` picks this one where lion-pytorch is installed too).
"""

from .functional import lion, lion_update
from .lion import Lion, LionConfig

__all__ = ["Lion", "LionConfig", "lion", "lion_update"]
__version__ = "0.1.0"

"""optcore-adafactor: Adafactor (Shazeer & Stern 2018) for optcore.

Installing this distribution registers ``Adafactor`` in the entry-point group
``optcore.optimizers``. torch >= 2.5 ships its own ``torch.optim.Adafactor``
(different semantics), and torch names resolve first: pick this one with
``{"type": "optcore_adafactor:Adafactor"}``.
"""

from __future__ import annotations

from ._config import AdafactorConfig
from .adafactor import Adafactor
from .functional import adafactor_update, relative_step_size

__all__ = ["Adafactor", "AdafactorConfig", "adafactor_update", "relative_step_size"]
__version__ = "0.1.0"

"""optcore-adascale: AdaScale SGD (Johnson, Agrawal, Gu, Guestrin, ICML 2020).

``pip install optcore-adascale`` makes ``{"type": "AdaScaleSGD", ...}`` resolve
through the ``optcore.optimizers`` entry point.
"""

from ._config import AdaScaleSGDConfig
from ._errors import AccumulationError
from .adascale import AdaScaleSGD

__all__ = ["AccumulationError", "AdaScaleSGD", "AdaScaleSGDConfig"]
__version__ = "0.1.0"

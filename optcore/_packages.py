"""Third-party packages known to ship optimizers, and the classes they ship.

This is data, read without importing anything: a package's module is imported
only when one of its names is built or described. A package that is not
installed simply contributes nothing. The order is the resolution order among
packages (API.md).

``classes`` are the names listing shows without importing the package. A
package with a registry of its own (pytorch_optimizer's
``get_supported_optimizers()``, 128 names; timm's ``list_optimizers()``) is
also asked for a plain name that none of optcore's tables has, and only then
imported: ``ask_names`` lists the package's names, ``ask_class`` turns one of
them into its class.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


def _pytorch_optimizer_names() -> list[str]:
    import pytorch_optimizer

    return list(pytorch_optimizer.get_supported_optimizers())


def _pytorch_optimizer_class(name: str) -> Any:
    import pytorch_optimizer

    return pytorch_optimizer.load_optimizer(name)


def _timm_names() -> list[str]:
    from timm.optim import list_optimizers

    return [n for n in list_optimizers() if isinstance(n, str)]


def _timm_class(name: str) -> Any:
    from timm.optim import get_optimizer_class

    # The class itself: with its defaults bound, timm returns a partial.
    return get_optimizer_class(name, bind_defaults=False)


@dataclass(frozen=True)
class KnownPackage:
    distribution: str  # what `pip install` takes
    module: str  # where the classes live
    classes: tuple[str, ...]
    ask_names: Callable[[], list[str]] | None = None  # the package's own registry (imports it)
    ask_class: Callable[[str], Any] | None = None

    @property
    def top_level(self) -> str:
        return self.module.partition(".")[0]


KNOWN_PACKAGES: tuple[KnownPackage, ...] = (
    KnownPackage("lion-pytorch", "lion_pytorch", ("Lion",)),
    KnownPackage(
        "pytorch_optimizer",
        "pytorch_optimizer",
        (
            "ADOPT", "AdaBelief", "AdaBound", "AdaFactor", "AdaMod", "AdaNorm", "Adai", "AdamP",
            "Adan", "AdEMAMix", "AggMo", "AvaGrad", "CAME", "DAdaptAdam", "DAdaptLion", "DAdaptSGD",
            "DiffGrad", "FAdam", "Kron", "LaProp", "Lamb", "LARS", "Lion", "MADGRAD", "MARS",
            "NovoGrad", "PAdam", "Prodigy", "QHAdam", "Ranger", "ScheduleFreeAdamW",
            "ScheduleFreeRAdam", "ScheduleFreeSGD", "SGDP", "SGDW", "SignSGD", "SM3", "SOAP",
            "StableAdamW", "Tiger", "Yogi",
        ),
        _pytorch_optimizer_names,
        _pytorch_optimizer_class,
    ),
    KnownPackage(
        "timm",
        "timm.optim",
        (
            "AdaBelief", "Adafactor", "AdafactorBigVision", "AdamP", "Adan", "Adopt", "Kron",
            "Lamb", "LaProp", "Lars", "Lion", "MADGRAD", "Mars", "NAdamW", "NvNovoGrad",
            "RMSpropTF", "SGDP", "SGDW",
        ),
        _timm_names,
        _timm_class,
    ),
    KnownPackage("transformers", "transformers.optimization", ("Adafactor",)),
    KnownPackage(
        "schedulefree",
        "schedulefree",
        ("AdamWScheduleFree", "RAdamScheduleFree", "SGDScheduleFree", "AdamWScheduleFreeClosure"),
    ),
    KnownPackage(
        "bitsandbytes",
        "bitsandbytes.optim",
        (
            "Adam8bit", "AdamW8bit", "PagedAdam8bit", "PagedAdamW8bit", "PagedAdamW32bit",
            "Lion8bit", "PagedLion8bit", "SGD8bit", "LAMB8bit", "LARS8bit", "RMSprop8bit",
            "Adagrad8bit", "AdEMAMix8bit",
        ),
    ),
    KnownPackage("torch-optimi", "optimi", ("Adam", "AdamW", "Adan", "Lion", "RAdam", "Ranger", "SGD", "StableAdamW")),
)

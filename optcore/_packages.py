"""Third-party packages known to ship optimizers, and the classes they ship.

This is data, read without importing anything: a package's module is imported
only when one of its names is built or described. A package that is not
installed simply contributes nothing. The order is the resolution order among
packages (API.md).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class KnownPackage:
    distribution: str  # what `pip install` takes
    module: str  # where the classes live
    classes: tuple[str, ...]

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
    ),
    KnownPackage(
        "timm",
        "timm.optim",
        (
            "AdaBelief", "Adafactor", "AdafactorBigVision", "AdamP", "Adan", "Adopt", "Kron",
            "Lamb", "LaProp", "Lars", "Lion", "MADGRAD", "Mars", "NAdamW", "NvNovoGrad",
            "RMSpropTF", "SGDP", "SGDW",
        ),
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

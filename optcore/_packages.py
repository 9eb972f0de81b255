"""Third-party packages known to ship optimizers (data, in resolution order),
and the classes they ship: a package's module is imported only when one of
its names is built or described. One with a registry of its own
(``ask_names``, ``ask_class``) is also asked for a plain name no table has.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import inspect
import threading
from collections.abc import Callable, Container, Iterable
from dataclasses import dataclass
from typing import Any

from ._errors import ConfigError, OptimizerNotFoundError
from ._values import clean_text, short_repr
from ._names import close_matches, normalize
from ._spec import OptimizerSpec
from .lowrank import low_rank


@dataclass(frozen=True)
class KnownPackage:
    distribution: str  # what `pip install` takes
    module: str  # where the classes live
    classes: tuple[str, ...]
    ask_names: Callable[[], list[str]] | None = None  # the package's own registry (imports it)
    ask_class: Callable[[str], Any] | None = None
    wrap: Callable[[type, str], type] | None = None  # what optcore builds for one of ``classes`` (the class if None)

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
        lambda: importlib.import_module("pytorch_optimizer").get_supported_optimizers(),
        lambda name: importlib.import_module("pytorch_optimizer").load_optimizer(name),
    ),
    KnownPackage(
        "timm",
        "timm.optim",
        (
            "AdaBelief", "Adafactor", "AdafactorBigVision", "AdamP", "Adan", "Adopt", "Kron",
            "Lamb", "LaProp", "Lars", "Lion", "MADGRAD", "Mars", "NAdamW", "NvNovoGrad",
            "RMSpropTF", "SGDP", "SGDW",
        ),
        lambda: [n for n in importlib.import_module("timm.optim").list_optimizers() if isinstance(n, str)],
        # the class itself: with its defaults bound, timm returns a partial
        lambda name: importlib.import_module("timm.optim").get_optimizer_class(name, bind_defaults=False),
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
    # GaLore's projection settings live in its param groups: lowrank makes them arguments
    KnownPackage("galore-torch", "galore_torch", ("GaLoreAdamW", "GaLoreAdamW8bit", "GaLoreAdafactor"), wrap=low_rank),
    KnownPackage("torch-optimi", "optimi", ("Adam", "AdamW", "Adan", "Lion", "RAdam", "Ranger", "SGD", "StableAdamW")),
)


def importable_classes(kind: str) -> tuple[type, ...]:
    """The classes an import path may name, by registry kind."""
    import torch  # listing names needs no torch; checking a class does
    from torch.optim import lr_scheduler

    if kind == "scheduler":
        return (lr_scheduler.LRScheduler, lr_scheduler.ReduceLROnPlateau)
    return (torch.optim.Optimizer,)


def load_package_class(pkg: KnownPackage, attr: str) -> Any:
    """A class of the table (a failure is the package's install, not a plugin's: a ConfigError)."""
    what = f"{pkg.module}:{attr}"
    try:
        mod = importlib.import_module(pkg.module)
    except KeyboardInterrupt:
        raise
    except BaseException as exc:
        raise ConfigError(
            f"{what} is in optcore's table of {pkg.distribution}'s optimizers, and importing {pkg.module} failed "
            f"({type(exc).__name__}: {clean_text(exc)}). Reinstall or upgrade {pkg.distribution}, or pick another "
            "provider of the name (`optcore list --all`).",
            problems=[("type", "package failed to import")],
        ) from exc
    obj = getattr(mod, attr, None)
    if obj is None:
        raise OptimizerNotFoundError(
            what,
            [f"module {pkg.module}"],
            close_matches(attr, [n for n in vars(mod) if not n.startswith("_")]),
            hint=f"The installed {pkg.distribution} has no {attr}; upgrade it (pip install -U {pkg.distribution}).",
        )
    return pkg.wrap(obj, attr) if pkg.wrap is not None and isinstance(obj, type) else obj


def is_installed(top_level: str) -> bool:
    try:
        return importlib.util.find_spec(top_level) is not None
    except (ImportError, ValueError):
        return False


def what_it_is(obj: Any) -> str:
    """What an import path named, for a message."""
    if isinstance(obj, type):
        return f"the class {obj.__module__}.{obj.__qualname__}"
    if inspect.ismodule(obj):
        return f"the module {obj.__name__}"
    if callable(obj):
        name = getattr(obj, "__qualname__", None) or getattr(obj, "__name__", None) or type(obj).__name__
        return f"the {type(obj).__name__} {getattr(obj, '__module__', None) or '?'}.{name}"
    return f"a {type(obj).__name__} ({short_repr(obj, 60)})"


class PackageRegistries:
    """The registries installed packages keep of their own optimizers, each read once per process."""

    def __init__(self, packages: Iterable[KnownPackage], kind: str = "optimizer") -> None:
        self.packages = [p for p in packages if p.ask_names is not None and p.ask_class is not None]
        self.kind = kind
        self._names: dict[str, dict[str, str]] = {}  # distribution -> normalised -> the package's spelling
        self.failures: dict[str, str] = {}  # distribution -> why its registry could not be read
        self._lock = threading.RLock()

    def _names_of(self, pkg: KnownPackage) -> dict[str, str]:
        with self._lock:
            if pkg.distribution not in self._names:
                if not is_installed(pkg.top_level):
                    return {}  # not remembered: it may be installed later in the process
                self._names[pkg.distribution] = {}
                try:
                    self._names[pkg.distribution] = {normalize(n): n for n in pkg.ask_names()}  # type: ignore[misc]
                except KeyboardInterrupt:
                    raise
                except BaseException as exc:  # a broken package never stops other names
                    self.failures[pkg.distribution] = f"{type(exc).__name__}: {clean_text(exc)}"
            return self._names[pkg.distribution]

    def forget(self) -> None:
        """Read the registries again (after installing a package)."""
        with self._lock:
            self._names.clear()
            self.failures.clear()

    def matching(self, prefix: str) -> list[KnownPackage]:
        """The packages a qualified name's prefix names (module or distribution)."""
        key = normalize(prefix)
        return [p for p in self.packages if key in {normalize(p.module), normalize(p.distribution), normalize(p.top_level)}]

    def find(self, name: str, packages: Iterable[KnownPackage] | None = None, **spec_args: Any) -> list[OptimizerSpec]:
        """A spec per package whose registry has ``name`` (imports them)."""
        key = normalize(name)
        pkgs = self.packages if packages is None else packages
        return [self._spec(p, self._names_of(p)[key], **spec_args) for p in pkgs if key in self._names_of(p)]

    def every(self, skip: Container[str] = (), **spec_args: Any) -> list[OptimizerSpec]:
        """A spec for every registry name not in ``skip`` (normalised) that loads."""
        out = []
        for pkg in self.packages:
            for key, spelt in self._names_of(pkg).items():
                if key not in skip:
                    with contextlib.suppress(ConfigError):
                        out.append(self._spec(pkg, spelt, **spec_args))
        return out

    def all_names(self) -> list[str]:
        """The names already read (for close matches)."""
        return [n for names in self._names.values() for n in names.values()]

    def _spec(self, pkg: KnownPackage, spelt: str, **spec_args: Any) -> OptimizerSpec:
        where = f"{pkg.distribution}'s registry"
        try:
            cls = pkg.ask_class(spelt)  # type: ignore[misc]
        except KeyboardInterrupt:
            raise
        except BaseException as exc:
            raise ConfigError(
                f"{spelt!r} is in {where}, and loading it failed ({type(exc).__name__}: {clean_text(exc)}); "
                f"it may need an optional dependency of {pkg.distribution} or a GPU.",
                problems=[("type", "failed to load")],
            ) from exc
        if not (isinstance(cls, type) and issubclass(cls, importable_classes(self.kind))):
            raise ConfigError(
                f"{spelt!r} in {where} is {what_it_is(cls)}, not a class of torch's {self.kind}s; optcore builds "
                "only those from a package's registry.",
                problems=[("type", f"not a {self.kind} class")],
            )
        name = cls.__name__ if normalize(cls.__name__) == normalize(spelt) else spelt
        spec = OptimizerSpec(
            name=name, source="package", provider=pkg.distribution, qualified=f"{pkg.module}:{name}",
            loader=lambda: cls, **spec_args,
        )
        spec.__dict__["target"] = cls  # loaded already: listing may show its flags
        return spec

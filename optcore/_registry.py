"""The optimizer names: one :class:`~optcore._resolution.Registry` fed with
``torch.optim`` (its signatures typed by :mod:`._torch_optims`) and the known packages.
Specs pickle as a call of this module's :func:`resolve`, so the name
``optcore._registry.resolve`` is part of every pickled optimizer: it stays.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from ._errors import OptimizerNotFoundError
from ._packages import KNOWN_PACKAGES, PackageRegistries, is_installed, load_package_class
from ._plugins import OPTIMIZERS_GROUP
from .missing import missing_provider, shipped_but_off, shipped_providers
from ._resolution import Registry, ShadowedNameWarning
from ._spec import OptimizerSpec
from ._torch_facts import TORCH_FACTS

#: ``ShadowedNameWarning`` is re-exported: tests and plugins filter it by this module.
__all__ = ["OPTIMIZERS", "ShadowedNameWarning", "list_optimizers", "register_optimizer", "resolve", "unregister_optimizer"]


def _torch_specs() -> list[OptimizerSpec]:
    names = [n for n in TORCH_FACTS if isinstance(getattr(torch.optim, n, None), type)]
    names += sorted(
        n
        for n, obj in vars(torch.optim).items()
        if isinstance(obj, type) and issubclass(obj, torch.optim.Optimizer) and obj is not torch.optim.Optimizer
        and n not in TORCH_FACTS
    )
    return [
        OptimizerSpec(
            name=n,
            source="torch",
            provider="torch",
            qualified=f"torch:{n}",
            loader=(lambda n=n: getattr(torch.optim, n)),
            explicit_schema=functools.partial(_torch_schema, n),
            version=torch.__version__,
            reduce_to=resolve,
        )
        for n in names
    ]


def _torch_schema(name: str) -> Any:
    from ._torch_optims import torch_schema  # lazily: the schemas are pydantic models

    return torch_schema(name)


def _package_specs() -> list[OptimizerSpec]:
    return [
        OptimizerSpec(
            name=cls,
            source="package",
            provider=pkg.distribution,
            qualified=f"{pkg.module}:{cls}",
            loader=functools.cache(functools.partial(load_package_class, pkg, cls)),  # loaded once
            reduce_to=resolve,
        )
        for pkg in KNOWN_PACKAGES
        if is_installed(pkg.top_level)
        for cls in pkg.classes
    ]


def resolve(name: Any, *, allow_import_paths: bool | None = None) -> OptimizerSpec:
    """The :class:`OptimizerSpec` for ``name``, or :class:`OptimizerNotFoundError`
    with the closest names. ``allow_import_paths=False`` (or
    ``OPTCORE_ALLOW_IMPORT_PATHS=0`` when it is ``None``) refuses dotted paths."""
    try:
        return OPTIMIZERS.resolve(name, allow_import_paths=allow_import_paths)
    except OptimizerNotFoundError as exc:  # a name only a package that is not installed has: say which
        if not isinstance(name, str) or ":" in name:
            raise
        if not (hint := missing_provider(name, shipped_providers(name)) or shipped_but_off(name)):
            raise
        raise OptimizerNotFoundError(exc.name, exc.searched, exc.suggestions, hint=hint) from None


OPTIMIZERS = Registry(
    "optimizer",
    OPTIMIZERS_GROUP,
    [_torch_specs, _package_specs],
    reduce_to=resolve,
    asked=PackageRegistries(KNOWN_PACKAGES),
)


def list_optimizers(all: bool = False, ask_packages: bool = False) -> list[OptimizerSpec]:
    """Every resolvable optimizer name (``all=True``: shadowed providers too),
    importing no plugin or package unless ``ask_packages=True`` adds the names
    only installed packages' own registries have (pytorch_optimizer's ``Shampoo``)."""
    return OPTIMIZERS.list(all=all, ask_packages=ask_packages)


def register_optimizer(name_or_target: Any = None, target: Any = None, *, schema: Any = None, override: bool = False) -> Any:
    """Register an optimizer class or factory under a name (API.md's three
    spellings); a name registered twice needs ``override=True``."""
    return OPTIMIZERS.register(name_or_target, target, schema=schema, override=override)


def unregister_optimizer(name: str) -> None:
    """Remove a ``register_optimizer`` registration."""
    OPTIMIZERS.unregister(name)

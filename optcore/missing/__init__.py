"""What to install for a name that nothing installed provides.

Resolution and the registry call these when a ``type`` name resolves nowhere:
the plugins optcore's repository ships (:data:`SHIPPED_PLUGINS`), the packages
optcore knows (``_packages.KNOWN_PACKAGES``), and a ``distribution:Name`` whose
distribution is not installed, switched off or no plugin each get a message
that says what to ``pip install``. Metadata is read; nothing is imported.
"""

from __future__ import annotations

from collections.abc import Sequence

from .._names import normalize
from .._packages import KNOWN_PACKAGES, is_installed
from .._plugins import OPTIMIZERS_GROUP, declared, switched_off
from .._values import clean_text

#: The plugins optcore's repository ships (``plugins/<distribution>/``) and the
#: optimizer names each declares, so that a name asked for while its plugin is
#: not installed says what to install (tests/resolution/test_missing_providers.py
#: checks it against each plugin's pyproject.toml).
SHIPPED_PLUGINS: dict[str, tuple[str, ...]] = {
    "optcore-lion": ("Lion",),
    "optcore-adafactor": ("Adafactor",),
    "optcore-fp16": ("FP16Optimizer", "MemoryEfficientFP16Optimizer"),
    "optcore-adascale": ("AdaScaleSGD",),
}


def missing_provider(name: str, plugins: Sequence[str] = ()) -> str:
    """What to install for ``name`` when only packages optcore knows, or ``plugins``
    (optcore's shipped plugins that declare it), provide it and none is installed, else ``""``."""
    key = normalize(name)
    dists = [p.distribution for p in KNOWN_PACKAGES if not is_installed(p.top_level) and key in map(normalize, p.classes)]
    if plugins:
        also = (f" It is also an optimizer of {' and of '.join(dists)}: `pip install {dists[0]}` gives that one "
                f"(with both installed, {name!r} is the package's, as packages resolve first, and "
                f"'{plugins[0]}:{name}' the plugin's).") if dists else ""  # fmt: skip
        return (f"{name!r} is an optimizer of optcore's plugin {' and of '.join(plugins)}, which is not installed: "
                f"`pip install {plugins[0]}` (or `pip install ./plugins/{plugins[0]}` in optcore's repository), "
                f"then run again.{also}")
    return (f"{name!r} is an optimizer of {' and of '.join(dists)}, which is not installed: `pip install {dists[0]}`, "
            "then run again (`optcore list` shows it).") if dists else ""


def shipped_providers(name: str, group: str = OPTIMIZERS_GROUP) -> list[str]:
    """The shipped plugins (:data:`SHIPPED_PLUGINS`) that declare ``name`` and whose
    entry points are not found: what a user could install to get it."""
    return [d for d in _shipped_with(name, group) if not declared(d, group)]


def shipped_but_off(name: str, group: str = OPTIMIZERS_GROUP) -> str:
    """Why an installed shipped plugin that declares ``name`` does not provide it
    (an environment switch leaves it out), else ``""``."""
    for dist in _shipped_with(name, group):
        if off := switched_off(dist, group):
            return f"{name!r} is an optimizer of {dist}, which is installed, but {off}."
    return ""


def _shipped_with(name: str, group: str) -> list[str]:
    key = normalize(name)
    return [d for d, names in SHIPPED_PLUGINS.items() if group == OPTIMIZERS_GROUP and key in map(normalize, names)]


def not_provided(distribution: str, name: str, group: str, kind: str, could_be_module: bool) -> tuple[str, str]:
    """``(headline, hint)`` for ``distribution:name`` that no plugin in use
    provides: the distribution is not installed, is switched off, declares other
    names or is no plugin. Reads metadata only; ``distribution`` is the user's text."""
    from importlib import metadata

    dist, what = clean_text(distribution, 100), clean_text(name, 100)
    shipped = normalize(distribution) in map(normalize, SHIPPED_PLUGINS)
    mine = declared(distribution, group)
    if mine and (off := switched_off(distribution, group)):
        return f"Distribution {dist!r} is installed, but its {group} entry points are not in use.", f"{off}."
    if mine:
        return (f"Distribution {dist!r} declares no {kind} named {what!r}.",
                f"Its {group} entry points: {', '.join(mine)}. A newer version may have it: "
                f"`pip install -U {dist}`.")  # fmt: skip
    try:
        metadata.distribution(distribution)
    except (metadata.PackageNotFoundError, ValueError):
        pass
    else:
        return (f"Distribution {dist!r} is installed, and is not an optcore plugin: it declares no {group} "
                f"entry points.", f"Name the class by its import path ('module:{what}'), or install the plugin "
                "that provides it.")  # fmt: skip
    thing = "distribution or module" if could_be_module else "distribution"
    where = f" (or `pip install ./plugins/{dist}` in optcore's repository)" if shipped else ""
    return (f"No {thing} {dist!r} is installed, so nothing provides {what!r} under that name.",
            f"Install it: `pip install {dist}`{where}, then run again; `optcore list` shows the names installed now.")

"""Extension points beyond "add an optimizer", carried by pluggy: hooks with the
``optcore_`` prefix, implemented by modules or objects that entry points in
group ``optcore.hooks`` name, loaded when a hook is first called.
"""

from __future__ import annotations

import threading
import warnings
from typing import Any

import pluggy

from ._errors import PluginLoadError
from ._names import normalize
from ._plugins import HOOKS_GROUP, entry_points

hookspec = pluggy.HookspecMarker("optcore")
hookimpl = pluggy.HookimplMarker("optcore")


class OptcoreHookSpecs:
    """The hooks a plugin may implement (decorate with ``optcore.plugin.hookimpl``)."""

    @hookspec
    def optcore_rewrite_config(self, config: dict[str, Any]) -> dict[str, Any] | None:
        """Turn config keys this plugin owns into plain config, before resolution:
        return the config to use instead of ``config`` (a fresh dict with
        ``type``), or ``None`` when none of its keys are present. Plugins run in
        turn, each seeing the previous one's result; each optimizer of a wrapper
        chain gets its turn (a config with ``optimizer`` is the wrapper's).
        Implement it plainly: optcore calls each implementation itself, so
        ``wrapper=True`` implementations are not supported for this hook."""

    @hookspec
    def optcore_config_keys(self) -> dict[str, Any] | None:
        """The top-level config keys this plugin adds, as the JSON Schema of an
        object (``{"properties": ..., "$defs": ...}``), for exported schemas."""

    @hookspec
    def optcore_param_group_policies(self, model: Any, config: dict[str, Any]) -> list[dict[str, Any]] | None:
        """Contribute ``{"params": "<regex over parameter names>", **hparams}``
        overrides for ``model``, applied after the defaults and before the
        config's own ``param_groups`` (which therefore win), or ``None``."""

    @hookspec
    def optcore_optimizer_built(self, optimizer: Any, config: dict[str, Any]) -> None:
        """Observe every optimizer ``build_optimizer`` builds (logging, checks): the
        one that steps, so under a precision wrapper the inner optimizer."""


#: (the entries it was made from, the manager, normalised distribution -> why its hook plugin failed to load)
_manager: tuple[Any, pluggy.PluginManager, dict[str, str]] | None = None
_lock = threading.Lock()


def get_plugin_manager() -> pluggy.PluginManager:
    """The process-wide plugin manager, with the hook plugins loaded; one that
    fails to load is skipped with a warning naming its distribution."""
    global _manager
    entries = entry_points(HOOKS_GROUP)  # cached; a new tuple after a refresh or a changed environment
    current = _manager
    if current is not None and current[0] is entries:
        return current[1]
    with _lock:
        if _manager is None or _manager[0] is not entries:
            pm = pluggy.PluginManager("optcore")
            pm.add_hookspecs(OptcoreHookSpecs)
            failures: dict[str, str] = {}
            for entry in entries:
                try:
                    plugin = entry.load()
                    if not pm.is_registered(plugin):
                        pm.register(plugin, name=f"{entry.distribution}:{entry.name}")
                except Exception as exc:  # noqa: BLE001 - reported: a broken hook plugin never stops a build
                    if not isinstance(exc, PluginLoadError):
                        exc = PluginLoadError(entry.distribution, f"{HOOKS_GROUP}:{entry.name}", exc, entry.version)
                    warnings.warn(str(exc), RuntimeWarning, stacklevel=1)
                    failures[normalize(entry.distribution or entry.module)] = exc.detail
            _manager = (entries, pm, failures)
        return _manager[1]


def load_failure(distribution: str) -> str | None:
    """Why ``distribution``'s hook plugin failed to load in this process, or ``None``."""
    get_plugin_manager()
    current = _manager  # one snapshot: another thread may rebuild the manager
    return current[2].get(normalize(distribution)) if current is not None else None


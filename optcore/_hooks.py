"""Extension points beyond "add an optimizer", carried by pluggy.

Adding an optimizer or a scheduler is an entry point (groups
``optcore.optimizers`` and ``optcore.schedulers``). Everything else a plugin
may want to change about a build is a hook declared here, with the ``optcore_``
prefix. Hook plugins are modules or objects named by entry points in group
``optcore.hooks``; they are loaded the first time a hook is called, never at
``import optcore``.
"""

from __future__ import annotations

import threading
from typing import Any

import pluggy

hookspec = pluggy.HookspecMarker("optcore")
hookimpl = pluggy.HookimplMarker("optcore")



class OptcoreHookSpecs:
    """The hooks a plugin may implement (decorate with ``optcore.hookimpl``)."""

    @hookspec(firstresult=True)
    def optcore_wrap_optimizer(self, optimizer: Any, options: dict[str, Any]) -> Any:
        """Wrap a freshly built optimizer according to ``options``.

        ``options`` holds the wrapper keys of the optimizer config that the core
        does not interpret itself: ``precision`` ("fp16"/"bf16"),
        ``memory_efficient`` and ``loss_scaler``. Return the wrapper to hand to
        the user instead of ``optimizer``, or ``None`` if these options are not
        yours. The first non-``None`` result wins.
        """

    @hookspec
    def optcore_param_group_policies(self, model: Any, config: dict[str, Any]) -> list[dict[str, Any]] | None:
        """Contribute param-group overrides for ``model``.

        Return a list of ``{"params": "<regex over parameter names>", **hparams}``
        entries, applied after the defaults and before the config's own
        ``param_groups`` (which therefore win), or ``None``.
        """

    @hookspec
    def optcore_optimizer_built(self, optimizer: Any, config: dict[str, Any]) -> None:
        """Observe every optimizer ``build_optimizer`` returns (logging, checks)."""


_manager: pluggy.PluginManager | None = None
_lock = threading.Lock()


def get_plugin_manager() -> pluggy.PluginManager:
    """The process-wide plugin manager, with the hook plugins of group
    ``optcore.hooks`` loaded (honouring ``OPTCORE_DISABLE_PLUGIN_AUTOLOAD`` and
    ``OPTCORE_PLUGINS``). A hook plugin that fails to load is skipped with a
    warning naming its distribution; it never stops a build."""
    global _manager
    if _manager is not None:
        return _manager
    with _lock:
        if _manager is None:
            from ._plugins import load_hook_plugins

            pm = pluggy.PluginManager("optcore")
            pm.add_hookspecs(OptcoreHookSpecs)
            load_hook_plugins(pm)
            _manager = pm
    return _manager


def reset_plugin_manager() -> None:
    """Forget the plugin manager (tests, or after installing a plugin at run time)."""
    global _manager
    with _lock:
        _manager = None

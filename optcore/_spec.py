"""``OptimizerSpec``: the frozen record of one resolvable name. ``target``,
``schema`` and ``capabilities`` load on first access, so listing imports no
plugin or package; a spec pickles as a call of its registry's resolve
function (``reduce_to``), so this module needs no import of the registry.
"""

from __future__ import annotations

import inspect
import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from functools import cached_property
from typing import Any, Literal

from ._adapt import capabilities

Source = Literal["torch", "package", "builtin", "plugin", "user"]
_LOAD_LOCK = threading.RLock()


@dataclass(frozen=True)
class Capabilities:
    """The contract's capability flags, as true of the default build; ``sharding``:
    how its update couples elements (``elementwise``, ``factored``, ``per_tensor``,
    ``global`` or ``unknown``), which says where it can step a shard alone."""

    memory_efficient_fp16: bool = False
    step_with_scale: bool = False
    flat_params: bool = False
    groups: bool = True
    sharding: str = "unknown"

    def as_dict(self) -> dict[str, bool | str]:
        return {flag if flag == "sharding" else f"supports_{flag}": v for flag, v in asdict(self).items()}


@dataclass(frozen=True, eq=False)
class OptimizerSpec:
    """One optimizer name and where it comes from; ``qualified`` is the spelling
    that always selects it (``"torch:Adafactor"``, ``"optcore_lion:Lion"``)."""

    name: str
    source: Source
    provider: str
    qualified: str
    loader: Callable[[], Any] = field(repr=False)
    explicit_schema: Any = field(default=None, repr=False)
    shadowed: tuple[OptimizerSpec, ...] = ()
    version: str | None = None
    kind: str = "optimizer"
    reduce_to: Callable[[str], Any] | None = field(default=None, repr=False)

    def __deepcopy__(self, memo: dict[int, Any]) -> OptimizerSpec:
        return self  # immutable record: optimizers carrying it deep-copy cheaply

    def __reduce__(self) -> tuple[Any, ...]:
        if self.reduce_to is None:
            raise TypeError(
                f"Cannot pickle the spec {self.qualified!r}: it was not made by a registry. "
                "Pickle its qualified name and resolve that instead."
            )
        return (self.reduce_to, (self.qualified,))

    @cached_property
    def target(self) -> Any:
        """The class or factory (imports its module on first access)."""
        with _LOAD_LOCK:  # one lock for all specs: creating hundreds of specs stays cheap
            return self.loader()

    @cached_property
    def schema(self) -> Any:
        """The pydantic model of the hyper-parameters."""
        if self.explicit_schema is not None:
            if callable(self.explicit_schema) and not isinstance(self.explicit_schema, type):
                return self.explicit_schema()  # a loader: keeps pydantic out of listing
            return self.explicit_schema
        declared = getattr(self.target, "config_schema", None)
        if declared is not None:
            return declared
        from ._schema import schema_from_signature  # lazily: _schema imports pydantic

        skip = ("params",) if self.kind == "optimizer" else ("optimizer",)
        return schema_from_signature(self.target, name=self.name, skip=skip)

    @cached_property
    def capabilities(self) -> Capabilities:
        if self.kind != "optimizer" or not isinstance(self.target, type):
            return Capabilities()
        return Capabilities(**capabilities(self.target))

    @property
    def loaded(self) -> bool:
        """Whether ``target`` is at hand without importing a plugin or a third-party package."""
        return "target" in self.__dict__ or self.source in ("torch", "builtin", "user")

    @property
    def known_capabilities(self) -> Capabilities | None:
        """The capability flags if ``loaded``, else ``None``: what a listing shows."""
        return self.capabilities if self.loaded else None

    @property
    def description(self) -> str:
        """The first paragraph of the target's own docstring (not an inherited "Base class for all optimizers.")."""
        own = vars(self.target).get("__doc__") if isinstance(self.target, type) else None
        doc = inspect.cleandoc(own) if own else (inspect.getdoc(self.target) or "")
        return doc.split("\n\n", 1)[0].replace("\n", " ").strip()

    @property
    def is_wrapper(self) -> bool:
        """True for precision wrappers and other optimizers that wrap an inner one."""
        return bool(getattr(self.target, "wraps_optimizer", False))

    def describe(self) -> dict[str, Any]:
        """A JSON-ready summary (what ``optcore list --json`` prints)."""
        out: dict[str, Any] = {key: getattr(self, key) for key in ("name", "qualified", "source", "provider")}
        out["shadowed"] = [s.qualified for s in self.shadowed]
        if self.version:
            out["version"] = self.version
        return out

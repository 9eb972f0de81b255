"""``OptimizerSpec``: the frozen record of one resolvable name.

A spec knows where a name comes from without importing it: ``target`` (the
class), ``schema`` and ``capabilities`` are loaded on first access. Listing
names therefore costs no import of any plugin or third-party package.
"""

from __future__ import annotations

import inspect
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Literal

Source = Literal["torch", "package", "builtin", "plugin", "user"]
_LOAD_LOCK = threading.RLock()


@dataclass(frozen=True)
class Capabilities:
    """The contract's capability flags, as true of the default build."""

    memory_efficient_fp16: bool = False
    step_with_scale: bool = False
    flat_params: bool = False
    groups: bool = True

    def as_dict(self) -> dict[str, bool]:
        return {
            "supports_memory_efficient_fp16": self.memory_efficient_fp16,
            "supports_step_with_scale": self.step_with_scale,
            "supports_flat_params": self.flat_params,
            "supports_groups": self.groups,
        }


@dataclass(frozen=True, eq=False)
class OptimizerSpec:
    """One optimizer name and where it comes from.

    ``qualified`` is the explicit spelling that always selects this spec
    (``"torch:Adafactor"``, ``"optcore_lion:Lion"``, ``"lion_pytorch.Lion"``).
    """

    name: str
    source: Source
    provider: str
    qualified: str
    loader: Callable[[], Any] = field(repr=False)
    explicit_schema: Any = field(default=None, repr=False)
    shadowed: tuple[OptimizerSpec, ...] = ()
    version: str | None = None
    kind: str = "optimizer"

    def __deepcopy__(self, memo: dict[int, Any]) -> OptimizerSpec:
        return self  # immutable record: optimizers carrying it deep-copy cheaply

    def __reduce__(self) -> tuple[Any, ...]:
        from ._registry import resolve

        return (resolve, (self.qualified,))

    # ----------------------------------------------------------- lazy members
    @cached_property
    def target(self) -> Any:
        """The class or factory (imports its module on first access)."""
        with _LOAD_LOCK:  # one lock for all specs: creating hundreds of specs stays cheap
            return self.loader()

    @cached_property
    def schema(self) -> Any:
        """The pydantic model of the hyper-parameters (``.model_json_schema()``
        exports JSON Schema)."""
        if self.explicit_schema is not None:
            if callable(self.explicit_schema) and not isinstance(self.explicit_schema, type):
                return self.explicit_schema()  # a loader: keeps pydantic out of listing
            return self.explicit_schema
        declared = getattr(self.target, "config_schema", None)
        if declared is not None:
            return declared
        from ._schema import schema_from_signature

        skip = ("params",) if self.kind == "optimizer" else ("optimizer",)
        return schema_from_signature(self.target, name=self.name, skip=skip)

    @cached_property
    def capabilities(self) -> Capabilities:
        target = self.target
        if self.kind != "optimizer" or not isinstance(target, type):
            return Capabilities()
        from ._adapt import capabilities

        return Capabilities(**capabilities(target))

    @property
    def description(self) -> str:
        """The first paragraph of the target's docstring."""
        # The class's own docstring: an inherited one ("Base class for all
        # optimizers.") would describe something else.
        own = vars(self.target).get("__doc__") if isinstance(self.target, type) else None
        doc = inspect.cleandoc(own) if own else (inspect.getdoc(self.target) or "")
        return doc.split("\n\n", 1)[0].replace("\n", " ").strip()

    @property
    def is_wrapper(self) -> bool:
        """True for precision wrappers and other optimizers that wrap an inner one."""
        return bool(getattr(self.target, "wraps_optimizer", False))

    def describe(self) -> dict[str, Any]:
        """A JSON-ready summary (what ``optcore list --json`` prints)."""
        out: dict[str, Any] = {
            "name": self.name,
            "qualified": self.qualified,
            "source": self.source,
            "provider": self.provider,
            "shadowed": [s.qualified for s in self.shadowed],
        }
        if self.version:
            out["version"] = self.version
        return out

"""GaLore (``galore-torch``) by name, its projection settings as hyper-parameters.

GaLore's classes take the usual Adam/Adafactor arguments in their constructors
and read the projection (``rank``, ``update_proj_gap``, ``scale``,
``proj_type``) from each param group: a group with a ``rank`` has its gradients
projected to that rank (an SVD of the gradient every ``update_proj_gap`` steps)
and its moments kept in the projected shape; a group without one is plain
Adam(W). Here the projection settings are constructor arguments too, so a
config names them beside ``type`` and a ``param_groups`` entry may override them:

    {"type": "GaLoreAdamW", "lr": 1e-3, "rank": 128, "fallback": {"type": "AdamW"}}

The classes declare ``optcore_matrix_only``: as a composite's main type they
take the 2-D hidden matrices (embeddings and the output head go to the
fallback, as GaLore's own recipes and HF's ``optim_target_modules`` do), and
their update is ``per_tensor`` (the projection is of the whole matrix).
"""

from __future__ import annotations

import inspect
import threading
from typing import Annotated, Any, Literal

from annotated_types import Ge, Gt

#: GaLore's settings read from each param group, with the defaults of its paper and README.
PROJECTION: dict[str, Any] = {"rank": 128, "update_proj_gap": 200, "scale": 0.25, "proj_type": "std"}
_ANNOTATIONS: dict[str, Any] = {"rank": Annotated[int, Ge(1)], "update_proj_gap": Annotated[int, Ge(1)],
                                "scale": Annotated[float, Gt(0)],
                                "proj_type": Literal["std", "reverse_std", "right", "left", "full"]}  # fmt: skip
_cache: dict[type, type] = {}
_lock = threading.Lock()


def low_rank(cls: type, name: str) -> type:
    """``cls`` (galore_torch's optimizer ``name``: its classes are named ``AdamW``,
    ``AdamW8bit`` and ``Adafactor`` inside it) taking the projection settings as arguments."""
    with _lock:
        if cls in _cache:
            return _cache[cls]
        base_init = cls.__init__

        def __init__(self: Any, params: Any, *args: Any, rank: int = PROJECTION["rank"],
                     update_proj_gap: int = PROJECTION["update_proj_gap"], scale: float = PROJECTION["scale"],
                     proj_type: str = PROJECTION["proj_type"], **kwargs: Any) -> None:  # fmt: skip
            if quiet:
                kwargs.setdefault("no_deprecation_warning", True)  # its warning is about torch's AdamW, not GaLore
            base_init(self, params, *args, **kwargs)
            projection = {"rank": rank, "update_proj_gap": update_proj_gap, "scale": scale, "proj_type": proj_type}
            self.defaults.update(projection)
            for group in self.param_groups:
                for key, value in projection.items():
                    group.setdefault(key, value)
            _refuse_non_matrices(name, self.param_groups)
            self.register_state_dict_post_hook(_projectors_as_dicts)
            self.register_load_state_dict_pre_hook(_projectors_from_dicts)

        signature = inspect.signature(base_init)
        quiet = "no_deprecation_warning" in signature.parameters
        kept = [p for p in signature.parameters.values() if p.name != "no_deprecation_warning"]
        added = [inspect.Parameter(k, inspect.Parameter.KEYWORD_ONLY, default=v, annotation=_ANNOTATIONS[k])
                 for k, v in PROJECTION.items()]  # fmt: skip
        positional = [p for p in kept if p.kind is not inspect.Parameter.VAR_KEYWORD]
        __init__.__annotations__ = dict(_ANNOTATIONS)  # what get_type_hints, and so the derived schema, reads
        __init__.__signature__ = signature.replace(parameters=[  # type: ignore[attr-defined]
            *[p.replace(kind=inspect.Parameter.POSITIONAL_OR_KEYWORD) if p.kind is inspect.Parameter.KEYWORD_ONLY
              else p for p in positional], *added])  # fmt: skip
        namespace = {
            "__init__": __init__,
            "__module__": __name__,
            "__qualname__": name,
            "__doc__": f"galore_torch's {name}, with {', '.join(PROJECTION)} as arguments.\n\n{cls.__doc__ or ''}",
            "optcore_matrix_only": True,
            "sharding": "per_tensor",
        }
        made = type(name, (cls,), namespace)
        _cache[cls] = made
        return made


def _refuse_non_matrices(name: str, groups: list[dict[str, Any]]) -> None:
    """GaLore projects each gradient as a matrix: anything else fails in its first step."""
    from .._errors import ConfigError

    other = [tuple(p.shape) for g in groups if "rank" in g for p in g["params"] if p.ndim != 2]
    if other:
        raise ConfigError(
            f"{name} projects each gradient as a matrix, and {len(other)} of its parameters are not 2-D (shapes "
            f"{other[:4]}). Give the rest to a fallback, e.g. {{'type': '{name}', 'rank': 128, 'fallback': "
            "{'type': 'AdamW'}}, or route only the matrices to it with a param group's 'optimizer'.",
            problems=[("type", f"{name} over parameters that are not 2-D")],
        )


#: the key a projector's fields are saved under, in place of the object
_SAVED = "galore_projector"


def _projectors_as_dicts(optimizer: Any, state_dict: dict[str, Any]) -> dict[str, Any]:
    """The state with each ``GaLoreProjector`` as a dict of its fields: tensors and
    numbers load with ``torch.load(weights_only=True)`` and through DCP, an object does not."""
    state = {}
    for key, entry in state_dict["state"].items():
        projector = entry.get("projector")
        if projector is not None and not isinstance(projector, dict):
            entry = {**entry, "projector": {_SAVED: dict(vars(projector))}}
        state[key] = entry
    return {**state_dict, "state": state}


def _projectors_from_dicts(optimizer: Any, state_dict: dict[str, Any]) -> dict[str, Any]:
    from galore_torch.galore_projector import GaLoreProjector

    state = {}
    for key, entry in state_dict["state"].items():
        saved = entry.get("projector")
        if isinstance(saved, dict) and _SAVED in saved:
            fields = dict(saved[_SAVED])
            projector = GaLoreProjector(fields.pop("rank"))
            vars(projector).update(fields)
            entry = {**entry, "projector": projector}
        state[key] = entry
    return {**state_dict, "state": state}


def __getattr__(name: str) -> type:
    """``optcore.lowrank.GaLoreAdamW`` and its siblings, made on first use (and on unpickling)."""
    if name.startswith("_"):
        raise AttributeError(name)
    import galore_torch

    target = getattr(galore_torch, name, None)
    if not isinstance(target, type):
        raise AttributeError(f"galore_torch has no optimizer {name!r}")
    return low_rank(target, name)

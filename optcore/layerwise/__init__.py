"""Layer-wise learning-rate decay: the config key ``layer_decay`` (BEiT's and
timm's fine-tuning recipe). Each parameter gets a layer id; layer ``i`` of
``0 .. L`` trains at ``lr * layer_decay ** (L - i)``, so the head keeps the
full ``lr`` and the embeddings get the smallest.

Two rules give the ids (docs/getting-started.md, "Layer-wise lr decay"):

- a **timm model** (one with ``group_matcher()``): timm's own, as
  ``timm.optim.create_optimizer_v2(model, layer_decay=...)`` groups it through
  ``param_groups_layer_decay``: the layers of ``model.group_matcher(coarse=False)``
  (mapped as timm's ``group_parameters(..., reverse=True)`` maps them), and
  timm's weight-decay rule: 1-D parameters and the names matching
  ``model.no_weight_decay()`` get none;
- **any other model**, by name: the numbered blocks are the container with the
  most numbered children (``encoder.layer.3``, ``transformer.h.3``,
  ``model.layers.3``, ``blocks.3``); block ``k`` is layer ``k + 1``, the
  parameters before the first block (embeddings) layer 0, and those after the
  last (final norm, pooler, head) layer ``N + 1`` for ``N`` blocks.

:mod:`optcore._params` asks :func:`assign_layers` once per build and turns the ids
into ``lr_scale`` and the group names timm uses (``layer_3_decay``,
``layer_3_no_decay``).
"""

from __future__ import annotations

import fnmatch
import re
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import chain
from typing import Any

from .._errors import ConfigError
from .._values import as_finite, clean_text, short_repr

__all__ = ["LayerDecay", "assign_layers", "layer_decay_value", "refuse_ungroupable"]

#: timm's ``MATCH_PREV_GROUP``: a matcher suffix that joins the group before it.
_MATCH_PREV_GROUP = 99999.0
_NUMBERED = re.compile(r"^(?:(.*?)\.)?(\d+)(?:\.|$)")


def layer_decay_value(value: Any) -> float:
    """The config's ``layer_decay``: a number in (0, 1]."""
    try:
        rate = as_finite(value, "layer_decay")
    except ValueError as exc:
        raise ConfigError(
            f"{exc}: layer_decay is the factor each layer below the head multiplies the lr by, e.g. 0.75.",
            problems=[("layer_decay", "not a finite number")],
        ) from None
    if not 0.0 < rate <= 1.0:
        raise ConfigError(
            f"layer_decay must be in (0, 1], got {short_repr(value)}: each layer below the head trains at "
            "layer_decay times the lr of the layer above (timm's fine-tuning recipes use 0.65 to 0.9).",
            problems=[("layer_decay", "not in (0, 1]")],
        )
    return rate


@dataclass(frozen=True)
class LayerDecay:
    """The layer of each parameter name; ``no_decay``: the names that get no
    weight decay where the rule has its own (timm's), else ``None``."""

    layers: Mapping[str, int]
    top: int
    rate: float
    no_decay: frozenset[str] | None = None

    def overrides(self, name: str, exempt: bool) -> dict[str, Any]:
        """The ``lr_scale`` and group name (timm's) of parameter ``name``; ``exempt``: it gets no weight decay."""
        layer = self.layers.get(name, self.top)
        return {"lr_scale": self.rate ** (self.top - layer), "name": f"layer_{layer}_{'no_decay' if exempt else 'decay'}"}


def refuse_ungroupable(explicit_groups: bool) -> None:
    """Raises the :class:`~optcore.ConfigError` for parameters given without names
    (``explicit_groups``: as param-group dicts), whose layers cannot be found."""
    given = "explicit param-group dicts were given" if explicit_groups else "the parameters were given without names"
    raise ConfigError(
        f"layer_decay finds each parameter's layer from its name, but {given}: pass the model (nn.Module) or a dict "
        "of name -> tensor" + (", or give each group its own lr_scale." if explicit_groups else "."),
        problems=[("layer_decay", "explicit param groups" if explicit_groups else "unnamed parameters")],
    )


def assign_layers(params_or_model: Any, named: Sequence[tuple[Any, Any]], rate: float, named_ok: bool = True) -> LayerDecay:
    """Layer ids for ``named`` (the trainable ``(name, tensor)`` pairs, in order)
    of ``params_or_model``: timm's rule on a model with ``group_matcher``, else
    the numbered-blocks rule. Raises :class:`~optcore.ConfigError` when neither
    finds layers, or the parameters have no names (``named_ok`` false)."""
    if not named_ok:
        refuse_ungroupable(explicit_groups=False)
    matcher = getattr(params_or_model, "group_matcher", None)
    if callable(matcher) and hasattr(params_or_model, "named_parameters"):
        return _timm(params_or_model, matcher, rate)
    return _by_blocks([n for n, _ in named], rate)


# ------------------------------------------------------------ timm's models
def _timm(model: Any, group_matcher: Callable[..., Any], rate: float) -> LayerDecay:
    """timm's ``param_groups_layer_decay``: layers over *all* named parameters
    (frozen ones too, as timm counts them), the top one the largest id."""
    try:
        spec = group_matcher(coarse=False)
    except Exception as exc:  # noqa: BLE001  (a model's own method, any error: say whose)
        raise ConfigError(
            f"layer_decay asked {type(model).__name__}.group_matcher(coarse=False) for its layers and it raised "
            f"{type(exc).__name__}: {clean_text(exc, 200)}.",
            problems=[("layer_decay", "group_matcher failed")],
        ) from None
    names = [n for n, _ in model.named_parameters()]
    layers = _layers_from_matcher(names, spec, type(model).__name__)
    top = max(layers.values())
    patterns = getattr(model, "no_weight_decay", None)
    patterns = list(patterns()) if callable(patterns) else []
    no_decay = frozenset(
        n for n, p in model.named_parameters() if p.ndim <= 1 or any(fnmatch.fnmatchcase(n, str(x)) for x in patterns)
    )
    return LayerDecay(layers, top, rate, no_decay)


def _layers_from_matcher(names: list[str], spec: Any, owner: str) -> dict[str, int]:
    """timm's ``group_with_matcher(..., reverse=True)``: each name's ordinal
    tuple from the first matching regex (unmatched: the largest), the ordinals
    sorted and numbered, a ``MATCH_PREV_GROUP`` suffix joining the group before."""
    if isinstance(spec, Mapping):
        compiled: list[tuple[re.Pattern[str], tuple[float, ...], Any]] = []
        for ordinal, rule in enumerate(spec.values()):
            if rule is None:
                continue
            entries = rule if isinstance(rule, (list, tuple)) else [(rule, None)]
            for entry in entries:
                pattern, suffix = entry if isinstance(entry, (list, tuple)) else (entry, None)
                compiled.append((re.compile(pattern), (float(ordinal),), suffix))

        def grouping(name: str) -> tuple[float, ...]:
            for regex, prefix, suffix in compiled:
                found = regex.match(name)
                if found:
                    parts = (prefix, found.groups(), suffix)
                    return tuple(map(float, chain.from_iterable(filter(None, parts))))
            return (float("inf"),)  # neck and head: the largest ordinal
    elif callable(spec):

        def grouping(name: str) -> tuple[float, ...]:
            ordinal = spec(name)
            return tuple(ordinal) if isinstance(ordinal, Iterable) else (ordinal,)
    else:
        raise ConfigError(
            f"{owner}.group_matcher(coarse=False) returned {short_repr(spec)}, not timm's mapping of regexes or a "
            "function of the parameter name; layer_decay cannot read layers from it.",
            problems=[("layer_decay", "unknown group_matcher")],
        )
    by_ordinal: dict[tuple[float, ...], list[str]] = defaultdict(list)
    for name in names:
        by_ordinal[grouping(name)].append(name)
    layers: dict[str, int] = {}
    layer = -1
    for ordinal in sorted(by_ordinal):
        if layer < 0 or ordinal[-1] != _MATCH_PREV_GROUP:
            layer += 1
        layers.update(dict.fromkeys(by_ordinal[ordinal], layer))
    return layers


# ------------------------------------------------------------ any other model
def _by_blocks(names: list[str], rate: float) -> LayerDecay:
    """The container with the most numbered children holds the blocks."""
    indices: dict[str, set[int]] = defaultdict(set)
    block_of: dict[str, tuple[str, int]] = {}
    for name in names:
        found = _NUMBERED.match(name)  # the first path component that is a number
        if found:
            prefix, index = found.group(1) or "", int(found.group(2))
            indices[prefix].add(index)
            block_of[name] = (prefix, index)
    if not indices:
        shown = ", ".join(clean_text(n, 60) for n in names[:6]) + (", ..." if len(names) > 6 else "")
        raise ConfigError(
            "layer_decay needs numbered blocks in the parameter names (as in 'encoder.layer.3.', 'h.3.', "
            f"'layers.3.') or a timm model (with group_matcher()); these names have none: {shown}. Give layer-wise "
            "lr with 'param_groups' and 'lr_scale' instead.",
            problems=[("layer_decay", "no numbered blocks")],
        )
    container = max(indices, key=lambda prefix: len(indices[prefix]))  # the first seen on a tie
    ordered = sorted(indices[container])
    rank = {index: k for k, index in enumerate(ordered)}  # numbered 0.. even where the names skip
    count = len(ordered)
    layers: dict[str, int] = {}
    seen_block = False
    for name in names:
        prefix, index = block_of.get(name, (None, None))
        if prefix == container and index is not None:
            layers[name], seen_block = rank[index] + 1, True
        else:
            layers[name] = count + 1 if seen_block else 0
    return LayerDecay(layers, count + 1, rate)

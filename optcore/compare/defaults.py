"""The default line-up of ``optcore compare``, as data (:data:`DEFAULTS`), and the
one line that names it in ``optcore compare --help``: this module imports nothing,
so that building the ``optcore`` command's parser keeps torch out, and the help
text is made from the line-up itself (:func:`lineup_text`), so the two agree.
"""

from __future__ import annotations

from typing import Any

#: The default line-up: label, implementations in order of preference (the first
#: installed one is used), hyper-parameters, and the search space ``--trials`` draws
#: from (:data:`optcore.compare.lineup.SPACE_DIMS` says what each name sets). Learning rates were picked on a 3x
#: grid (1e-3, 3e-3, 1e-2, 3e-2, ...) by held-out loss on the char-lm task at 300 steps,
#: seed 0; Prodigy keeps its authors' rule lr=1. Adafactor uses a fixed lr (relative
#: step off): its relative-step default reached 2.41 where lr=1e-2 reached 2.18.
#: Each space spans about a decade and a half of lr on either side of the line-up's pick
#: (log scale), and the hyper-parameters the literature tunes for that optimizer
#: (weight decay on a log scale, beta1/beta2 or momentum, a linear warm-up fraction):
#: the same kind of space for every optimizer, so that K trials are an equal budget.
DEFAULTS: tuple[tuple[str, tuple[str, ...], dict[str, Any], dict[str, tuple[float, float, bool]]], ...] = (
    ("AdamW", ("torch:AdamW",), {"lr": 1e-2, "weight_decay": 0.01},
     {"lr": (3e-4, 1e-1, True), "weight_decay": (1e-4, 0.3, True), "beta1": (0.8, 0.95, False),
      "beta2": (0.95, 0.999, False), "warmup": (0.0, 0.1, False)}),
    ("Adam", ("torch:Adam",), {"lr": 1e-2},
     {"lr": (3e-4, 1e-1, True), "beta1": (0.8, 0.95, False), "beta2": (0.95, 0.999, False),
      "warmup": (0.0, 0.1, False)}),
    ("NAdam", ("torch:NAdam",), {"lr": 1e-2},
     {"lr": (3e-4, 1e-1, True), "beta1": (0.8, 0.95, False), "beta2": (0.95, 0.999, False),
      "warmup": (0.0, 0.1, False)}),
    ("SGD", ("torch:SGD",), {"lr": 0.3, "momentum": 0.9, "nesterov": True},
     {"lr": (1e-2, 3.0, True), "momentum": (0.8, 0.99, False), "warmup": (0.0, 0.1, False)}),
    ("RMSprop", ("torch:RMSprop",), {"lr": 3e-3},
     {"lr": (1e-4, 3e-2, True), "warmup": (0.0, 0.1, False)}),
    ("Adagrad", ("torch:Adagrad",), {"lr": 3e-2},
     {"lr": (1e-3, 0.3, True), "warmup": (0.0, 0.1, False)}),
    ("Lion", ("optcore-lion:Lion", "lion_pytorch:Lion"), {"lr": 3e-3, "weight_decay": 0.1},
     {"lr": (1e-4, 3e-2, True), "weight_decay": (1e-3, 1.0, True), "beta1": (0.85, 0.95, False),
      "beta2": (0.95, 0.999, False), "warmup": (0.0, 0.1, False)}),
    ("Adafactor", ("optcore-adafactor:Adafactor", "torch:Adafactor"),
     {"lr": 1e-2, "relative_step": False, "scale_parameter": False},
     {"lr": (3e-4, 1e-1, True), "warmup": (0.0, 0.1, False)}),
    ("Prodigy", ("pytorch_optimizer:Prodigy",), {"lr": 1.0},
     {"lr": (0.1, 3.0, True), "weight_decay": (1e-4, 0.3, True)}),
    ("ScheduleFreeAdamW", ("pytorch_optimizer:ScheduleFreeAdamW",), {"lr": 1e-2},
     {"lr": (3e-4, 1e-1, True), "weight_decay": (1e-4, 0.3, True)}),
    # A composite: Muon on the hidden matrices, AdamW on the rest (torch >= 2.9). match_rms_adamw puts
    # Muon's updates at AdamW's RMS, so AdamW's pick serves both halves (not swept on its own).
    ("Muon+AdamW", ("torch:Muon",),
     {"lr": 1e-2, "adjust_lr_fn": "match_rms_adamw", "fallback": {"type": "torch:AdamW", "weight_decay": 0.01}},
     {"lr": (3e-4, 1e-1, True), "momentum": (0.8, 0.99, False)}),
)  # fmt: skip


def lineup_text() -> str:
    """``AdamW (torch:AdamW), ..., Lion (optcore-lion:Lion, else lion_pytorch:Lion), ...``:
    every default config by label, with its implementations in order of preference."""
    parts = []
    for label, candidates, hparams, _ in DEFAULTS:
        fallback = hparams.get("fallback", {}).get("type") if isinstance(hparams.get("fallback"), dict) else None
        rest = f"; the rest: {fallback}" if fallback else ""
        parts.append(f"{label} ({', else '.join(candidates)}{rest})")
    return ", ".join(parts)

"""How names are compared: case, ``_`` and ``-`` do not matter."""

from __future__ import annotations

import difflib
from collections.abc import Iterable

#: The longest ``type`` name resolution looks at (real ones are under 120
#: characters); comparing a 10 MB name with every known one takes seconds.
MAX_NAME_LENGTH = 200


def normalize(name: str) -> str:
    """``"Adam_W"``, ``"adam-w"`` and ``"AdamW"`` are one name: ``"adamw"``."""
    return name.replace("_", "").replace("-", "").replace(" ", "").lower()


def close_matches(name: str, candidates: Iterable[str], n: int = 3) -> list[str]:
    """The known names closest to ``name`` (compared normalised, returned as spelt)."""
    by_norm: dict[str, str] = {}
    for c in candidates:
        by_norm.setdefault(normalize(c), c)
    hits = difflib.get_close_matches(normalize(name), list(by_norm), n=n, cutoff=0.6)
    return [by_norm[h] for h in hits]

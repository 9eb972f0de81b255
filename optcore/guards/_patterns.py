"""Patterns a config gives (``param_groups`` regexes), matched in time linear
in the text: Python's ``re`` backtracks, and ``^(.*.*.*.*)*\\.bias_$`` against
one parameter name runs for minutes. RE2 (google-re2) has no backtracking, so
no pattern can do that; it refuses the constructs that need it
(backreferences, lookahead and lookbehind).

Python's parser reads the pattern first, so a malformed one gets the message
and position it gives today. Before either parser, the length is bounded
(:data:`MAX_PATTERN_LENGTH`): both take time that grows with the pattern (11 s
for a 10 MB one), so an oversized pattern is refused before either reads it.
"""

from __future__ import annotations

import re
from typing import Any

#: longest pattern taken, in characters: a param-group regex over parameter names is a few dozen, an
#: alternation of a hundred module names a couple of thousand; compiling 4,096 takes under 0.3 s
MAX_PATTERN_LENGTH = 4096


class PatternError(ValueError):
    """A pattern that cannot be used; ``unsupported``: valid Python, refused by RE2."""

    def __init__(self, why: str, unsupported: bool = False) -> None:
        super().__init__(why)
        self.why = why
        self.unsupported = unsupported


def compile_pattern(text: str) -> Any:
    """``text`` compiled by RE2: ``.search(name)`` and ``.pattern`` like ``re``'s."""
    if len(text) > MAX_PATTERN_LENGTH:
        raise PatternError(
            f"it is {len(text):,} characters long, over the limit of {MAX_PATTERN_LENGTH:,} "
            "(optcore.guards.MAX_PATTERN_LENGTH); match the names with a shorter regex "
            "(a prefix such as ^encoder\\. selects a whole module)"
        )
    try:
        re.compile(text)
    except (re.error, RecursionError, OverflowError) as exc:  # the last two: a pathological pattern
        raise PatternError(str(exc) if isinstance(exc, re.error) else f"{type(exc).__name__}; write a simpler regex") from None
    import re2  # google-re2: imported with the first pattern

    options = re2.Options()
    options.log_errors = False  # RE2 would also print each refusal on stderr
    try:
        return re2.compile(text, options)
    except re2.error as exc:
        detail = exc.args[0] if exc.args else exc
        why = detail.decode("utf-8", "replace") if isinstance(detail, bytes) else str(detail)
        if "too large" in why:  # over RE2's memory budget once compiled: a size, no missing feature
            raise PatternError(f"{why} (counted repetitions such as {{n,m}} expand); write a smaller regex") from None
        raise PatternError(why, unsupported=True) from None

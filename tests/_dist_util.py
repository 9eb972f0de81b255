"""The spawning helpers the multi-process tests use; they live in the kit
(:mod:`optcore.testing._ranks`) so that ``optcore.testing.check_placements``
and plugins' tests spawn ranks the same way."""

from optcore.testing._ranks import RanksFailed, free_port, run_ranks

__all__ = ["RanksFailed", "free_port", "run_ranks"]

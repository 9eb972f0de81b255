"""``optcore.distributed.zero_redundancy`` (API.md), defined with the other
training-stack integrations in :mod:`optcore.integrations.zero`."""

from .integrations.zero import zero_redundancy

__all__ = ["zero_redundancy"]

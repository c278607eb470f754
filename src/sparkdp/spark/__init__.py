"""The only package of sparkdp that imports pyspark (design rule 1, docs/architecture.md)."""

from .session import session

__all__ = ["session"]

"""The only package of sparkdp that imports pyspark (STYLE.md G1)."""

from .session import session

__all__ = ["session"]

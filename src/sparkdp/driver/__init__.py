"""The driver side of a job, above the worker engine (``train``) and the Spark stages (``spark``)."""

from .api import fit, run

__all__ = ["fit", "run"]

"""The driver side of a job, above the worker engine (``train``) and the Spark stages (``spark``)."""

from .api import fit, fit_job, launch, run

__all__ = ["fit", "fit_job", "launch", "run"]

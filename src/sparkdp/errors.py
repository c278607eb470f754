"""The exceptions sparkdp raises.

A small hierarchy so that callers and tests can catch by kind and ``match=`` on
messages.  Every message says what was received, what is allowed, and what to do.
"""

from __future__ import annotations


class SparkdpError(Exception):
    """Base class of every error sparkdp raises on purpose."""


class ConfigError(SparkdpError, ValueError):
    """A setting, argument or input that cannot be used as given."""


class DataError(SparkdpError, ValueError):
    """Training or evaluation data that cannot be turned into tensors."""


class RendezvousTimeout(SparkdpError, TimeoutError):
    """The workers of a job did not all start (or meet) within the time allowed."""


class WorkerFailed(SparkdpError, RuntimeError):
    """A training task failed; the message carries the worker's own error."""

    rank: int | None = None  # the failed worker, when its task reported the error itself


class TrainingDiverged(SparkdpError, ArithmeticError):
    """The loss became NaN or infinite: restarting would not help."""


class WorkerHung(WorkerFailed):
    """A worker stopped making progress: the others timed out waiting for it in a collective."""


class WorkerLost(WorkerFailed):
    """A worker's process or executor went away (killed, crashed, its machine lost)."""


class WorkerOutOfMemory(WorkerFailed):
    """A worker ran out of memory: a restart with the same settings would run out again, so the
    job fails at once (the message says what the model's state needs and how to shard it)."""

    limit_bytes: int | None = None  # the worker's memory limit, when it had one it could read


class WorkerPreempted(WorkerFailed):
    """A worker was asked to stop (SIGTERM, SIGHUP: its executor decommissioned, its machine
    shutting down); every rank saved at the step they agreed on and stopped. Restarted from that
    checkpoint without counting against ``max_restarts``."""


class EnvironmentProblem(SparkdpError, RuntimeError):
    """Something the machine lacks (Java, a dataset, a reachable master)."""


class ProtocolError(SparkdpError, ConnectionError):
    """A parameter-server message that is malformed, forged, oversized or replayed."""


class AuthenticationError(ProtocolError):
    """A peer that could not prove it holds the job's secret."""

"""Concurrency primitives of the parameter server: one lock object per shard.

The rule declares what it needs (:class:`~sparkdp.rules.base.Locking`); the server
picks the primitive here.  Every lock is used through ``with`` so that an exception
inside ``rule.apply`` can never leave a lock held (design rule 2, docs/architecture.md).
"""

from __future__ import annotations

import threading

from sparkdp.errors import ConfigError
from sparkdp.rules.base import Locking


class NoLock:
    """Hogwild!: applies and reads run concurrently; torn reads are accepted by design."""

    def __enter__(self) -> NoLock:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


class GlobalLock:
    """One mutex around apply / on_pull / pull-copy of a shard."""

    def __init__(self) -> None:
        self._lock = threading.Lock()

    def __enter__(self) -> GlobalLock:
        self._lock.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self._lock.release()


def make_lock(locking: Locking | str) -> NoLock | GlobalLock:
    """Return the lock for ``locking`` (a :class:`Locking` or its string value)."""
    try:
        kind = Locking(locking)
    except ValueError:
        allowed = ", ".join(repr(m.value) for m in Locking)
        raise ConfigError(f"Unknown locking {locking!r}; allowed: {allowed}.") from None
    return GlobalLock() if kind is Locking.GLOBAL else NoLock()


class VersionCounter:
    """A shard's version: read-and-increment is atomic even when the shard is lock-free.

    Under Hogwild the apply itself is unlocked, but two pushes must never get the same
    version ticket (dist-keras increments ``num_updates`` outside its mutex, a race on
    the staleness counter — design rule 2).  The tiny lock here guards only the integer.
    """

    def __init__(self, start: int = 0) -> None:
        self._value = int(start)
        self._lock = threading.Lock()

    @property
    def value(self) -> int:
        return self._value

    def ticket(self) -> int:
        """Increment and return the version *before* the increment."""
        with self._lock:
            before = self._value
            self._value = before + 1
            return before

    def set(self, value: int) -> None:
        with self._lock:
            self._value = int(value)

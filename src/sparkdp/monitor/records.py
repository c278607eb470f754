"""What a monitoring record must hold before the hub keeps it.

A worker's records are JSON from another process: the hub stores the latest ``metrics`` record of
every worker and computes rates from two of them, so one record with a missing counter or a string
where a number belongs would break every later record of that worker (and the job's totals).
Each kind has its fields' types and ranges here; ``problem`` names what is wrong, or None.
"""

from __future__ import annotations

import math
from typing import Any

#: the largest count or byte total a record may carry (2^63 - 1: what a 64-bit counter holds)
MAX_COUNT = (1 << 63) - 1
#: the longest host name kept (DNS allows 253 characters)
MAX_HOST_CHARS = 255


def _count(value: Any) -> bool:
    return type(value) is int and 0 <= value <= MAX_COUNT


def _amount(value: Any) -> bool:
    """A finite number of at least 0 (seconds, bytes, percent)."""
    return type(value) in (int, float) and math.isfinite(value) and 0 <= value <= MAX_COUNT


def _number(value: Any) -> bool:
    return type(value) in (int, float) and math.isfinite(value) and abs(value) <= MAX_COUNT


def _host(value: Any) -> bool:
    return type(value) is str and len(value) <= MAX_HOST_CHARS


def _positive_count_or_none(value: Any) -> bool:
    return value is None or (_count(value) and value > 0)


_CHECKS = {
    _count: "a whole number from 0 to 2^63-1",
    _amount: "a finite number of at least 0",
    _number: "a finite number",
    _host: f"a string of at most {MAX_HOST_CHARS} characters",
    _positive_count_or_none: "a whole number above 0, or null",
}

# kind -> field -> (check, required)
_FIELDS: dict[str, dict[str, tuple[Any, bool]]] = {
    "metrics": {
        "time": (_amount, True),
        "steps": (_count, True),
        "samples": (_count, True),
        "data_s": (_amount, True),
        "compute_s": (_amount, True),
        "comm_s": (_amount, True),
        "net_sent": (_amount, True),
        "net_recv": (_amount, True),
        "loss_sum": (_number, False),
        "tokens": (_count, False),
        "saved_steps": (_count, False),
        "saved_samples": (_count, False),
        "epoch": (_count, False),
        "step": (_count, False),
        "bytes_sent": (_amount, False),
        "bytes_recv": (_amount, False),
        "cpu_percent": (_amount, False),
        "rss_bytes": (_amount, False),
        "host": (_host, False),
    },
    "epoch_start": {
        "time": (_amount, False),
        "epoch": (_count, True),
        "epochs": (_positive_count_or_none, False),
        "steps_per_epoch": (_positive_count_or_none, False),
    },
    "epoch": {"time": (_amount, False), "epoch": (_count, True)},
    # a worker that trains on its own (asynchronous) asking whether the driver wants the job to stop
    "stop_query": {"time": (_amount, False), "epoch": (_count, True)},
    "output": {
        "time": (_amount, False),
        "stream": (lambda v: v in ("stdout", "stderr"), False),
        "text": (lambda v: type(v) is str, True),
    },
    "server": {"time": (_amount, False), "shard": (_count, True), "host": (_host, False)},
}
_CHECKS_BY_KIND = {"output": {"stream": "'stdout' or 'stderr'", "text": "a string"}}

#: the kinds of record a worker may send
KINDS = frozenset(_FIELDS)


def problem(record: dict[str, Any]) -> str | None:
    """What makes ``record`` (of a kind in ``KINDS``) unfit to keep, or None if it is fit."""
    kind = record["type"]
    for name, (check, required) in _FIELDS[kind].items():
        if name not in record:
            if required:
                return f"a {kind!r} record lacks {name!r}"
            continue
        if not check(record[name]):
            wanted = _CHECKS_BY_KIND.get(kind, {}).get(name) or _CHECKS[check]
            return f"a {kind!r} record's {name!r} is {_shown(record[name])}, not {wanted}"
    return None


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."

"""The messages of a per-step fault-tolerant job's quorum (``driver.quorum``), as both ends read
them: a worker's arrival at a step boundary and the quorum's decision for it. Each is checked
field by field when it is read from the wire; anything else is a ``ProtocolError``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import ProtocolError

#: a joining worker's ``step``: it holds no committed step yet
JOINING = -1


@dataclass(frozen=True)
class Arrival:
    """One worker at a step boundary: the job steps it has committed (:data:`JOINING` for a
    replacement) and whether its last step's collective succeeded (None: it ran none)."""

    step: int
    ok: bool | None = None

    @classmethod
    def from_json(cls, meta: Any) -> Arrival:
        """An arrival from a ``QUORUM`` message's JSON, checked (``ProtocolError`` if malformed)."""
        if not isinstance(meta, dict):
            raise ProtocolError(f"a quorum message must be a JSON object; got {type(meta).__name__}.")
        step, ok = meta.get("step"), meta.get("ok")
        if type(step) is not int or not JOINING <= step < 2**53:
            raise ProtocolError(f"a quorum message's step must be an integer >= {JOINING}; got {step!r}.")
        if ok is not None and type(ok) is not bool:
            raise ProtocolError(f"a quorum message's ok must be true, false or null; got {ok!r}.")
        return cls(step, ok)


@dataclass(frozen=True)
class Decision:
    """What one worker is told at a boundary (the ``QUORUM_REPLY`` it gets)."""

    quorum: int
    members: tuple[int, ...]
    step: int
    commit: bool
    done: bool = False
    heal_to: tuple[int, ...] = ()
    heal_from: int | None = None

    @property
    def world(self) -> int:
        return len(self.members)

    def rank_of(self, worker: int) -> int:
        return self.members.index(worker)

    def to_json(self) -> dict[str, Any]:
        return {
            "quorum": self.quorum,
            "members": list(self.members),
            "step": self.step,
            "commit": self.commit,
            "done": self.done,
            "heal_to": list(self.heal_to),
            "heal_from": self.heal_from,
        }

    @classmethod
    def from_json(cls, meta: Any) -> Decision:
        """A decision from a ``QUORUM_REPLY``'s JSON, checked (``ProtocolError`` if malformed)."""
        try:
            members, heal_to = tuple(meta["members"]), tuple(meta["heal_to"])
            decision = cls(
                meta["quorum"],
                members,
                meta["step"],
                meta["commit"],
                meta["done"],
                heal_to,
                meta["heal_from"],
            )
        except (KeyError, TypeError) as exc:
            raise ProtocolError(f"malformed quorum reply: {exc}") from None
        ints = (decision.quorum, decision.step, *members, *heal_to)
        if not all(type(v) is int and v >= 0 for v in ints) or not all(
            type(v) is bool for v in (decision.commit, decision.done)
        ):
            raise ProtocolError("malformed quorum reply: counts must be integers >= 0, flags true or false.")
        if decision.heal_from is not None and type(decision.heal_from) is not int:
            raise ProtocolError("malformed quorum reply: heal_from must be a worker number or null.")
        return decision


__all__ = ["JOINING", "Arrival", "Decision"]

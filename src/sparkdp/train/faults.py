"""Fault injection, off by default: watch recovery happen, and test it.

Set ``SPARKDP_FAULT`` on the driver (it travels to the workers inside the job) to one of

* ``kill:rank=R:step=S`` -- worker R kills its own process (SIGKILL) after its S-th step;
* ``stop:rank=R:step=S`` -- worker R stops itself (SIGSTOP) after its S-th step, as a hung
  process would (only the collective timeout, ``pg_timeout_s``, ends the wait);
* ``raise:rank=R:step=S`` -- worker R raises ``RuntimeError`` after its S-th step;
* ``term:rank=R:step=S`` -- worker R sends itself SIGTERM after its S-th step, as a preempted
  machine's would be (a synchronous job saves at the next step boundary and restarts from there:
  ``train.preempt``);
* ``slow:rank=R:step=S:ms=M`` -- from its S-th step on, worker R sleeps M ms in every step, as
  a busy or slower machine would (a straggler; ``sparkdp.monitor.stragglers`` names it);
  ``slow:rank=R1,R2:step=S:factor=F`` -- those workers take F times as long per step (they sleep
  F - 1 times their last step's time): heterogeneous machines, so that asynchronous staleness
  is real even where every worker shares one CPU (``sparkdp bench --slow``);
* ``kill-driver:step=S`` -- worker 0 kills the driver (SIGKILL) after its S-th step, as a lost
  driver machine would (same machine only: the driver's process id travels with the job);
* ``kill-server:rank=S:step=P`` -- with parameter servers on the executors (``servers=K``),
  server S kills its own task's process once it has applied P pushes, as a lost executor would.

Steps count from the start of the first attempt of the stage; a fault fires once per job:
the driver clears it before any restart.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass

from ..errors import ConfigError

ENV = "SPARKDP_FAULT"
ACTIONS = ("kill", "stop", "raise", "term", "kill-driver", "slow", "kill-server")


@dataclass(frozen=True)
class Fault:
    action: str
    rank: int
    step: int
    driver_pid: int = 0
    delay_ms: int = 0
    factor: float = 0.0  # slow: the step-time multiplier (instead of delay_ms)
    more_ranks: tuple[int, ...] = ()  # slow: the other slowed workers

    def maybe_fire(self, rank: int, steps_done: int) -> None:
        if self.action == "slow" and rank in (self.rank, *self.more_ranks) and steps_done >= self.step:
            now = time.perf_counter()
            if not self.factor:
                time.sleep(self.delay_ms / 1000)
            elif _last_step_end.get(rank) is not None:
                time.sleep((self.factor - 1.0) * (now - _last_step_end[rank]))
            _last_step_end[rank] = time.perf_counter()
            return
        if rank != self.rank or steps_done != self.step or self.action == "kill-server":
            return  # a server's fault fires in the server (driver.server_tasks)
        if self.action == "raise":
            raise RuntimeError(f"fault injected by {ENV}: worker {rank} fails after step {steps_done}")
        if self.action == "kill-driver":
            os.kill(self.driver_pid, signal.SIGKILL)
            return
        os.kill(
            os.getpid(), {"kill": signal.SIGKILL, "term": signal.SIGTERM}.get(self.action, signal.SIGSTOP)
        )


_last_step_end: dict[int, float] = {}  # slow by factor: when each slowed rank's previous step ended


def fault_from_env(environ: dict[str, str] | None = None) -> Fault | None:
    """The fault ``SPARKDP_FAULT`` asks for, or None when it is unset or empty."""
    text = (os.environ if environ is None else environ).get(ENV, "").strip()
    if not text:
        return None
    action, *fields = text.split(":")
    try:
        values = dict(f.split("=", 1) for f in fields)
        ranks = [0] if action == "kill-driver" else [int(r) for r in values.pop("rank").split(",")]
        factor = float(values.pop("factor")) if action == "slow" and "factor" in values else 0.0
        delay = int(values.pop("ms")) if action == "slow" and not factor else 0
        fault = Fault(
            action,
            ranks[0],
            int(values.pop("step")),
            driver_pid=os.getpid(),
            delay_ms=delay,
            factor=factor,
            more_ranks=tuple(ranks[1:]),
        )
        ok = (
            action in ACTIONS
            and not values
            and min(ranks) >= 0
            and fault.step >= 1
            and delay >= 0
            and (len(ranks) == 1 or action == "slow")
            and (not factor or factor >= 1.0)
        )
    except (KeyError, ValueError):
        ok = False
    if not ok:
        raise ConfigError(
            f"{ENV}={text!r} is not a fault sparkdp knows; use ACTION:rank=R:step=S with ACTION one "
            f"of kill, stop, raise, term, R >= 0 and S >= 1 (e.g. kill:rank=1:step=30), "
            "slow:rank=R:step=S:ms=M, slow:rank=R1,R2:step=S:factor=F (F >= 1), kill-driver:step=S, or "
            "kill-server:rank=S:step=P; "
            "or unset it."
        )
    return fault

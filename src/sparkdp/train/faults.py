"""Fault injection, off by default: watch recovery happen, and test it.

Set ``SPARKDP_FAULT`` on the driver (it travels to the workers inside the job) to one of

* ``kill:rank=R:step=S`` -- worker R kills its own process (SIGKILL) after its S-th step;
* ``stop:rank=R:step=S`` -- worker R stops itself (SIGSTOP) after its S-th step, as a hung
  process would (only the collective timeout, ``pg_timeout_s``, ends the wait);
* ``raise:rank=R:step=S`` -- worker R raises ``RuntimeError`` after its S-th step;
* ``slow:rank=R:step=S:ms=M`` -- from its S-th step on, worker R sleeps M ms in every step, as
  a busy or slower machine would (a straggler; ``sparkdp.monitor.stragglers`` names it);
* ``kill-driver:step=S`` -- worker 0 kills the driver (SIGKILL) after its S-th step, as a lost
  driver machine would (same machine only: the driver's process id travels with the job).

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
ACTIONS = ("kill", "stop", "raise", "kill-driver", "slow")


@dataclass(frozen=True)
class Fault:
    action: str
    rank: int
    step: int
    driver_pid: int = 0
    delay_ms: int = 0

    def maybe_fire(self, rank: int, steps_done: int) -> None:
        if self.action == "slow" and rank == self.rank and steps_done >= self.step:
            time.sleep(self.delay_ms / 1000)
            return
        if rank != self.rank or steps_done != self.step:
            return
        if self.action == "raise":
            raise RuntimeError(f"fault injected by {ENV}: worker {rank} fails after step {steps_done}")
        if self.action == "kill-driver":
            os.kill(self.driver_pid, signal.SIGKILL)
            return
        os.kill(os.getpid(), signal.SIGKILL if self.action == "kill" else signal.SIGSTOP)


def fault_from_env(environ: dict[str, str] | None = None) -> Fault | None:
    """The fault ``SPARKDP_FAULT`` asks for, or None when it is unset or empty."""
    text = (os.environ if environ is None else environ).get(ENV, "").strip()
    if not text:
        return None
    action, *fields = text.split(":")
    try:
        values = dict(f.split("=", 1) for f in fields)
        rank = 0 if action == "kill-driver" else int(values.pop("rank"))
        delay = int(values.pop("ms")) if action == "slow" else 0
        fault = Fault(action, rank, int(values.pop("step")), driver_pid=os.getpid(), delay_ms=delay)
        ok = action in ACTIONS and not values and fault.rank >= 0 and fault.step >= 1 and delay >= 0
    except (KeyError, ValueError):
        ok = False
    if not ok:
        raise ConfigError(f"{ENV}={text!r} is not a fault sparkdp knows; use ACTION:rank=R:step=S with ACTION one "
                          f"of kill, stop, raise, R >= 0 and S >= 1 (e.g. kill:rank=1:step=30), "
                          "slow:rank=R:step=S:ms=M, or kill-driver:step=S; or unset it.")
    return fault

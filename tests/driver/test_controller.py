"""The one controller loop every plan runs through (no Spark needed): attempts, the restart
number each sees, one line per failure and per recovery, errors raised at once."""

from __future__ import annotations

import logging

import pytest

from sparkdp.config import JobConfig
from sparkdp.driver.controller import Attempt, Controller, RestartPolicy
from sparkdp.errors import ConfigError, WorkerFailed, WorkerLost

pytestmark = pytest.mark.timeout(30)


class _Plan:
    """Fails with the errors given, one per attempt, then returns its attempts."""

    def __init__(self, *errors: BaseException, where: str | None = "epoch 1, step 6") -> None:
        self.errors, self.where, self.seen = list(errors), where, []

    def attempt(self, attempt: Attempt) -> list[Attempt]:
        self.seen.append(attempt)
        if self.errors:
            raise self.errors.pop(0)
        return self.seen

    def restart_point(self) -> str | None:
        return self.where


def test_each_failure_and_each_recovery_is_one_line_and_attempts_count_restarts(caplog):
    slots = iter([1, 3, 3])
    controller: Controller[list[Attempt]] = Controller(
        RestartPolicy.of(JobConfig.of(max_restarts=2, min_workers=1)), 3, lambda: next(slots)
    )
    with caplog.at_level(logging.WARNING, logger="sparkdp"):
        seen = controller.run(
            _Plan(WorkerLost("worker 2 died"), WorkerFailed("worker 0 failed: boom\ntrace"))
        )
    assert seen == [Attempt(0, 3), Attempt(1, 1), Attempt(2, 3)]
    assert [r.getMessage() for r in caplog.records] == [
        "sparkdp: worker 2 died -- restart 1 of 2 from epoch 1, step 6 on 1 of 3 workers (task slots gone)",
        "sparkdp: worker 0 failed: boom -- restart 2 of 2 from epoch 1, step 6",
        "sparkdp: recovered from failure 2 (worker 0 failed: boom) on 3 of 3 workers",
    ]
    # a plan run in parts (a streamed DataFrame's epochs) shares the count: a third failure is one too many
    with pytest.raises(WorkerFailed, match=r"failed 3 times, more than max_restarts=2"):
        controller.run(_Plan(WorkerLost("worker 1 died")))


def test_errors_a_restart_cannot_fix_and_plans_without_checkpoints_fail_at_once():
    plan = _Plan(ConfigError("bad setting"))
    with pytest.raises(ConfigError):
        Controller(RestartPolicy(max_restarts=3), 2).run(plan)
    assert len(plan.seen) == 1
    lost = WorkerLost("worker 1 died")
    plan = _Plan(lost, where=None)
    with pytest.raises(WorkerLost) as info:
        Controller(RestartPolicy(max_restarts=3), 2).run(plan)
    assert info.value is lost and len(plan.seen) == 1
    plan = _Plan(WorkerLost("worker 1 died"))
    with pytest.raises(WorkerLost):
        Controller(RestartPolicy(max_restarts=0), 2).run(
            plan
        )  # max_restarts=0: the first failure ends the job
    assert len(plan.seen) == 1

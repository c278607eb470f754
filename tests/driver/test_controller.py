"""The one controller loop every plan runs through (no Spark needed): attempts, the restart
number each sees, one line per failure and per recovery, errors raised at once."""

from __future__ import annotations

import logging

import pytest

from sparkdp.config import JobConfig
from sparkdp.driver.controller import Attempt, Controller, RestartPolicy, ScalingPolicy
from sparkdp.errors import ConfigError, WorkerFailed, WorkerLost, WorkerPreempted

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
        RestartPolicy.of(JobConfig.of(max_restarts=2)), ScalingPolicy(3, 1, lambda: next(slots))
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
        Controller(RestartPolicy(max_restarts=3), ScalingPolicy(2)).run(plan)
    assert len(plan.seen) == 1
    lost = WorkerLost("worker 1 died")
    plan = _Plan(lost, where=None)
    with pytest.raises(WorkerLost) as info:
        Controller(RestartPolicy(max_restarts=3), ScalingPolicy(2)).run(plan)
    assert info.value is lost and len(plan.seen) == 1
    plan = _Plan(WorkerLost("worker 1 died"))
    with pytest.raises(WorkerLost):
        Controller(RestartPolicy(max_restarts=0), ScalingPolicy(2)).run(
            plan
        )  # max_restarts=0: the first failure ends the job
    assert len(plan.seen) == 1


class _Moving(_Plan):
    """Restart points that move on (a preemption saves where it stopped) unless ``stuck``."""

    def __init__(self, *errors: BaseException, stuck: bool = False) -> None:
        super().__init__(*errors)
        self.points = iter(
            ["epoch 1, step 6"] * 9 if stuck else [f"epoch 1, step {6 * i}" for i in range(1, 9)]
        )

    def restart_point(self) -> str | None:
        return next(self.points)


def test_preemptions_restart_without_counting_against_max_restarts(caplog):
    preempted = WorkerPreempted("preempted: worker 1 received SIGTERM or SIGHUP; saved a checkpoint ...")
    plan = _Moving(preempted, preempted, WorkerLost("worker 0 died"))
    slots = iter([1, 2, 2])
    policy = RestartPolicy.of(JobConfig.of(max_restarts=1))
    with caplog.at_level(logging.WARNING, logger="sparkdp"):
        seen = Controller(policy, ScalingPolicy(2, 1, lambda: next(slots, 2))).run(plan)
    # the slots come back after the first preemption: the job grows back to 2 workers
    assert seen == [Attempt(0, 2), Attempt(1, 1), Attempt(2, 2), Attempt(3, 2)]
    assert [r.getMessage() for r in caplog.records] == [
        "sparkdp: preempted: worker 1 received SIGTERM or SIGHUP; saved a checkpoint ... -- preemption 1, "
        "restart from epoch 1, step 6 on 1 of 2 workers (task slots gone) (preemptions do not count against "
        "max_restarts)",
        "sparkdp: preempted: worker 1 received SIGTERM or SIGHUP; saved a checkpoint ... -- preemption 2, "
        "restart from epoch 1, step 12 (preemptions do not count against max_restarts)",
        # the one failure max_restarts=1 allows is still there after two preemptions
        "sparkdp: worker 0 died -- restart 1 of 1 from epoch 1, step 18",
        "sparkdp: recovered from failure 1 (worker 0 died) on 2 of 2 workers",
    ]
    assert [p["restart_from"] for p in policy.preemptions] == ["epoch 1, step 6", "epoch 1, step 12"]
    assert len(policy.failures) == 1


def test_a_preemption_alone_recovers_with_its_own_line_even_with_max_restarts_0(caplog):
    plan = _Moving(WorkerPreempted("worker 0 preempted"))
    with caplog.at_level(logging.WARNING, logger="sparkdp"):
        Controller(RestartPolicy(max_restarts=0), ScalingPolicy(2)).run(plan)
    assert [r.getMessage() for r in caplog.records][-1] == (
        "sparkdp: recovered from preemption 1 (worker 0 preempted) on 2 of 2 workers"
    )


def test_a_preemption_that_made_no_progress_counts_as_a_failure():
    preempted = WorkerPreempted("worker 1 preempted")
    plan = _Moving(preempted, preempted, preempted, stuck=True)
    with pytest.raises(WorkerFailed, match=r"failed 2 times, more than max_restarts=1"):
        Controller(RestartPolicy(max_restarts=1), ScalingPolicy(2)).run(plan)
    assert len(plan.seen) == 3  # the first is free, the next two stopped where it did


def test_a_preemption_with_nowhere_to_restart_from_is_raised():
    with pytest.raises(WorkerPreempted):
        Controller(RestartPolicy(max_restarts=3), ScalingPolicy(2)).run(
            _Plan(WorkerPreempted("worker 1 preempted"), where=None)
        )

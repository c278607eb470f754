"""What a synchronous worker's communication seconds measure (the monitoring's data/compute/
communication split reads them)."""

from __future__ import annotations

import pytest

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(120)]


def test_waiting_for_the_process_groups_reduction_counts_as_communication():
    """Over gloo (no shared memory), the seconds backward waits for a bucket's all-reduce are
    communication: rank 0 waits about 0.15 s per step for the slower rank 1, rank 1 hardly at all."""
    from tests.helpers.dist import run_workers
    from tests.strategies.workers import train_one_rank_slow

    (fast, transport), (slow, _) = run_workers(train_one_rank_slow, 2, 6, 0.15, False)
    assert transport == "process-group"
    assert 6 * 0.15 * 0.8 < fast < 6 * 0.15 * 2, fast
    assert slow < 6 * 0.15 * 0.3, slow

"""strategy='zero1' (allreduce + ZeroRedundancyOptimizer's partition): one process's losses with
1/N of the optimizer state per worker, and whole states that resume on another worker count."""

import pytest
import torch

from sparkdp.comm import SingleProcessCollective
from sparkdp.errors import ConfigError
from sparkdp.strategies import STRATEGIES
from tests.helpers.dist import run_workers
from tests.strategies.sharded_workers import zero1_steps


def test_fp16_scaling_and_name_keyed_states_are_refused_with_what_to_use():
    strategy = STRATEGIES.create("zero1")
    with pytest.raises(ConfigError, match="fp16-mixed.*does not combine with strategy='zero1'.*bf16-mixed"):
        strategy.adopt_precision(torch.float16)
    strategy.adopt_precision(torch.bfloat16)
    model = torch.nn.Linear(2, 2)
    opt = torch.optim.AdamW(model.parameters())
    named = {"state": {}, "param_groups": [{"lr": 1.0, "params": ["weight", "bias"]}]}
    with pytest.raises(ConfigError, match="keyed by parameter name.*keyed by parameter index"):
        strategy.load_optimizer_state(opt, named)


def test_on_one_worker_zero1_is_the_plain_optimizer():
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    strategy = STRATEGIES.create("zero1")
    net = strategy.setup(model, opt, SingleProcessCollective())
    net(torch.ones(4, 3)).sum().backward()
    opt.step()
    assert strategy.optimizer_state(opt) == opt.state_dict()
    assert strategy.options()["optimizer_shards"] == 1


def _check_run(runs, world):
    """Every rank's losses are the reference's; each keeps about 1/world of AdamW's moments, and
    memory.py's model state counts whole parameters and gradients plus its own moments."""
    ref = runs[0]
    for rank, mine in enumerate(runs):
        torch.testing.assert_close(mine["losses"], ref["reference"], rtol=1e-5, atol=0)
        assert mine["optimizer_bytes"] <= (1 / world + 0.05) * ref["reference_optimizer_bytes"], rank
        whole = ref["reference_bytes"] - ref["reference_optimizer_bytes"]
        assert mine["state_bytes"] == whole + mine["optimizer_bytes"], rank
    # the partitions cover the state exactly once
    assert sum(m["optimizer_bytes"] for m in runs) == ref["reference_optimizer_bytes"]
    assert ref["options"]["optimizer_shards"] == world


def _check_gathered(runs):
    """Rank 0's gathered state is the reference optimizer's state_dict (the others get {})."""
    gathered, want = runs[0]["gathered"], runs[0]["reference_state"]
    assert sorted(gathered["state"]) == sorted(want["state"])
    assert [g["params"] for g in gathered["param_groups"]] == [g["params"] for g in want["param_groups"]]
    for index, moments in want["state"].items():  # gradient sums in another order: float32 rounding
        for key, value in moments.items():
            got = gathered["state"][index][key]
            torch.testing.assert_close(got, value, rtol=1e-3, atol=1e-3 * float(value.abs().max()), msg=key)
    assert all(run["gathered"] == {} for run in runs[1:])


@pytest.mark.distributed
@pytest.mark.timeout(240)
def test_zero1_on_2_workers_trains_like_one_process_with_half_the_optimizer_state(tmp_path):
    """20 AdamW steps, gradients clipped over the optimizer's parameters as the loop clips them,
    give one process's losses (1e-5): the clipping saw every gradient, not the rank's partition.
    The gathered whole state is the reference optimizer's state_dict."""
    two = run_workers(zero1_steps, 2, str(tmp_path), 20, 0, 0.5, timeout_s=200)
    assert min(two[0]["reference_norms"]) > 0.5  # the clipping changed every step
    _check_run(two, 2)
    _check_gathered(two)


@pytest.mark.distributed
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_zero1_on_4_workers_then_resumed_on_2_trains_like_one_process(tmp_path):
    """20 steps on 4 workers (a quarter of the moments each), then 2 workers resume from the
    gathered whole state: the next 4 steps are the reference's too, and need the moments."""
    four = run_workers(zero1_steps, 4, str(tmp_path), 20, timeout_s=250)
    _check_run(four, 4)
    _check_gathered(four)
    two = run_workers(zero1_steps, 2, str(tmp_path), 24, 20, timeout_s=250)
    _check_run(two, 2)
    assert float(two[0]["fresh_moments"][1]) != pytest.approx(float(two[0]["reference"][1]), rel=1e-5)

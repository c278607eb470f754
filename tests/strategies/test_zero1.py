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


@pytest.mark.distributed
@pytest.mark.timeout(240)
def test_zero1_on_4_then_2_workers_trains_like_one_process_with_a_quarter_of_the_optimizer_state(tmp_path):
    """20 AdamW steps on 4 workers give one process's losses (1e-5) while each worker keeps
    about a quarter of AdamW's moments; the gathered whole state is the reference optimizer's
    state_dict; 2 workers resume from it and the next 4 steps are the reference's too."""
    four = run_workers(zero1_steps, 4, str(tmp_path), 20, timeout_s=200)
    two = run_workers(zero1_steps, 2, str(tmp_path), 24, 20, timeout_s=200)
    for world, runs in ((4, four), (2, two)):
        ref = runs[0]
        for rank, mine in enumerate(runs):
            torch.testing.assert_close(mine["losses"], ref["reference"], rtol=1e-5, atol=0)
            assert mine["optimizer_bytes"] <= (1 / world + 0.05) * ref["reference_optimizer_bytes"], rank
            # memory.py's model state: whole parameters and gradients, this rank's optimizer state
            whole = ref["reference_bytes"] - ref["reference_optimizer_bytes"]
            assert mine["state_bytes"] == whole + mine["optimizer_bytes"], rank
        # the partitions cover the state exactly once
        assert sum(m["optimizer_bytes"] for m in runs) == ref["reference_optimizer_bytes"]
        assert runs[0]["options"]["optimizer_shards"] == world
    assert float(two[0]["fresh_moments"][1]) != pytest.approx(
        float(two[0]["reference"][1]), rel=1e-5
    )  # moments matter
    gathered, want = four[0]["gathered"], four[0]["reference_state"]
    assert sorted(gathered["state"]) == sorted(want["state"])
    assert [g["params"] for g in gathered["param_groups"]] == [g["params"] for g in want["param_groups"]]
    for index, moments in want["state"].items():  # gradient sums in another order: float32 rounding
        for key, value in moments.items():
            got = gathered["state"][index][key]
            torch.testing.assert_close(got, value, rtol=1e-3, atol=1e-3 * float(value.abs().max()), msg=key)
    assert four[1]["gathered"] == {}  # rank 0 alone holds the whole state

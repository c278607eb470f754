"""The per-worker memory figures: model-state bytes by hand, and how reports tabulate them."""

import torch
from torch import nn

from sparkdp.comm.single import SingleProcessCollective
from sparkdp.monitor.report import Run, memory_cell, summary_table
from sparkdp.train.memory import MemoryMeter, model_state_bytes, peak_rss_bytes


def test_model_state_counts_parameters_gradients_and_optimizer_state():
    model = nn.Linear(4, 3)  # 15 float32 values: 60 bytes
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    assert model_state_bytes(model, opt) == 60  # no gradient, no state yet
    model(torch.ones(2, 4)).sum().backward()
    opt.step()
    # parameters + gradients + exp_avg + exp_avg_sq (60 each) + one float32 step per tensor (2 x 4)
    assert model_state_bytes(model, opt) == 4 * 60 + 8


def test_the_meter_keeps_the_peak_and_reports_one_entry_per_worker():
    model = nn.Linear(4, 3)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    meter = MemoryMeter()
    model(torch.ones(2, 4)).sum().backward()
    meter.sample(model, opt)
    model.weight.grad = None
    meter.sample(model, opt)  # smaller now: the peak stays
    [entry] = meter.gather(SingleProcessCollective())
    assert entry["worker"] == 0 and entry["model_state_bytes"] == 120
    assert entry["peak_rss_bytes"] >= peak_rss_bytes() // 2 > 0


def test_the_report_table_shows_the_largest_workers_memory():
    memory = [
        {"worker": 0, "peak_rss_bytes": 300 * 2**20, "model_state_bytes": 2**20},
        {"worker": 1, "peak_rss_bytes": 200 * 2**20, "model_state_bytes": 3 * 2**19},
    ]
    assert memory_cell(memory) == "1.5 / 300"
    assert memory_cell(None) == memory_cell([]) == "–"
    run = Run(
        "r",
        {"config": {"strategy": "fsdp", "workers": 2, "epochs": 1}},
        [{"type": "summary", "wall_s": 1.0, "memory": memory}],
    )
    assert "| 1.5 / 300 | finished |" in summary_table([run])

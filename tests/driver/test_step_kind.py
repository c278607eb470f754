"""``fault_tolerance``: the setting through the flag and a job file, the kind it chooses, and one
clear line for what per-step fault tolerance does not cover."""

from __future__ import annotations

import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
import yaml

from sparkdp.cli.fields import effective_config, load_job_file
from sparkdp.cli.main import build_parser
from sparkdp.config import JobConfig, TrainingConfig
from sparkdp.data.base import WorkerData
from sparkdp.data.parquet import ParquetData
from sparkdp.data.tensors import TensorData
from sparkdp.driver.jobs import Barrier, StepFaultTolerant, kind_for
from sparkdp.driver.jobs.step import refuse_unsupported
from sparkdp.errors import ConfigError
from sparkdp.strategies import resolve_strategy
from sparkdp.train.loop import FitSpec
from sparkdp.train.optim import optimizer_factory

pytestmark = pytest.mark.timeout(60)


def test_the_setting_defaults_to_restart_and_reaches_the_flag_and_job_files(tmp_path) -> None:
    assert JobConfig().failures.fault_tolerance == "restart"
    args = build_parser().parse_args(["train", "--fault-tolerance", "step", "--print-config"])
    assert yaml.safe_load(effective_config(args, args.settings))["fault_tolerance"] == "step"
    job_file = tmp_path / "job.yaml"
    job_file.write_text("fault_tolerance: step\n")
    assert load_job_file(str(job_file), args.settings)["fault_tolerance"] == "step"
    with pytest.raises(ConfigError, match="fault_tolerance must be one of restart, step; got 'steps'"):
        JobConfig.of(fault_tolerance="steps")


def test_step_mode_chooses_its_own_kind_for_synchronous_strategies_only() -> None:
    allreduce = resolve_strategy("allreduce")
    assert isinstance(kind_for(allreduce, False), Barrier)
    assert isinstance(kind_for(allreduce, False, fault_tolerance="step"), StepFaultTolerant)
    with pytest.raises(ConfigError, match="synchronous strategies; 'hogwild' is asynchronous"):
        kind_for(resolve_strategy("hogwild"), False, fault_tolerance="step")
    assert isinstance(kind_for(allreduce, True, fault_tolerance="step"), StepFaultTolerant)  # (a DataFrame)
    with pytest.raises(ConfigError, match="quorum on the driver"):
        kind_for(allreduce, False, True, fault_tolerance="step")


class Unaddressable(WorkerData):
    """Data that cannot give rows by id (only whole epochs' batches)."""

    def batches(self, **kwargs):
        return iter(())


def _parquet(directory, **columns) -> ParquetData:
    path = os.path.join(directory, "d.parquet")
    pq.write_table(pa.table({"x": [0.0, 1.0], "y": [0, 1]}), path)
    return ParquetData(path, features="x", label="y", **columns)


def _spec(
    strategy: str = "allreduce", accumulate: int = 1, train: WorkerData | None = None, **options
) -> FitSpec:
    model = torch.nn.Linear(2, 2)
    return FitSpec(
        model=model,
        loss=torch.nn.functional.cross_entropy,
        optimizer=optimizer_factory("sgd", model),
        strategy=resolve_strategy(strategy, **options),
        train=train or TensorData(torch.zeros(4, 2), torch.zeros(4, dtype=torch.long)),
        eval=None,
        training=TrainingConfig(accumulate=accumulate),
    )


@pytest.mark.parametrize(
    ("spec", "job", "named"),
    [
        (_spec("fsdp"), JobConfig(), "strategy 'fsdp' (covered: allreduce, diloco, hsdp)"),
        (_spec("hsdp"), JobConfig(), "hsdp without shard_size"),
        (_spec("hsdp", shard_size=4), JobConfig(), "hsdp's shard_size=4 with 4 workers"),
        (_spec("hsdp", shard_size=3), JobConfig(), "at least 2 replica groups"),
        (_spec("hsdp", shard_size=2, param_dtype="bf16"), JobConfig(), "hsdp's param_dtype or reduce_dtype"),
        (
            _spec("hsdp", shard_size=2),
            JobConfig.of(checkpoint_dir="/tmp/x"),
            "hsdp's checkpoints in this mode",
        ),
        (_spec("diloco", fragments=2), JobConfig(), "diloco's fragments and overlap_steps"),
        (_spec("allreduce", compression="bf16"), JobConfig(), "allreduce's compression"),
        (_spec(accumulate=2), JobConfig(), "accumulate"),
        (_spec(train=Unaddressable()), JobConfig(), "data Unaddressable (covered: in-memory"),
        (lambda tmp: _spec(train=_parquet(tmp, drop_nulls=True)), JobConfig(), "drop_nulls (the row cursor"),
    ],
)
def test_what_step_mode_does_not_cover_is_one_line(spec, job: JobConfig, named: str, tmp_path) -> None:
    with pytest.raises(ConfigError) as info:
        refuse_unsupported(spec(tmp_path) if callable(spec) else spec, job, 4)
    assert named in str(info.value) and "\n" not in str(info.value)
    assert "fault_tolerance='restart'" in str(info.value)
    refuse_unsupported(_spec(), JobConfig(), 4)  # the covered cases pass
    refuse_unsupported(_spec("diloco", period=5), JobConfig(), 4)
    refuse_unsupported(_spec("hsdp", shard_size=2), JobConfig(), 4)
    refuse_unsupported(_spec("hsdp", shard_size=2, train=_parquet(tmp_path)), JobConfig(), 4)
    refuse_unsupported(
        _spec(train=_parquet(tmp_path)), JobConfig.of(checkpoint_dir="/tmp/x", resume="/tmp/y"), 4
    )

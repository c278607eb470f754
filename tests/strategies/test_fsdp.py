"""strategy='fsdp' (FSDP2 over gloo) against allreduce: the same losses, a fraction of the state."""

import pytest
import torch
from safetensors.torch import load as load_safetensors

from sparkdp.errors import ConfigError
from sparkdp.models.zoo import build_model
from sparkdp.state import join_parts, state_to_bytes
from sparkdp.strategies import STRATEGIES
from sparkdp.strategies.fsdp import FSDP, shard_units
from tests.helpers.dist import run_workers
from tests.strategies.fsdp_workers import (
    checkpoint_then_continue,
    fit,
    fit_resumed,
    resume_and_continue,
    shares_and_gathered,
    step_losses,
)

WORLD = 2


def test_the_blocks_of_a_transformer_are_its_shard_units():
    assert shard_units(build_model("gpt-tiny"), min_params=1) == ["blocks.1", "blocks.0"]


def test_without_blocks_submodules_over_min_params_are_units_innermost_first():
    model = torch.nn.Sequential(
        torch.nn.Linear(100, 100), torch.nn.Sequential(torch.nn.Linear(100, 50), torch.nn.Linear(50, 2))
    )
    # 10100 in "0"; "1.0" has 5050 and "1.1" 102, so "1" holds 5152
    assert shard_units(model, min_params=5000) == ["0", "1.0"]
    assert shard_units(model, min_params=100) == ["0", "1.0", "1.1"]
    assert shard_units(model, min_params=20000) == []


def test_hugging_face_blocks_are_found_by_no_split_modules():
    class Block(torch.nn.Linear):
        pass

    class Model(torch.nn.Module):
        _no_split_modules = ["Block"]

        def __init__(self):
            super().__init__()
            self.layers = torch.nn.ModuleList([Block(4, 4), Block(4, 4)])
            self.head = torch.nn.Linear(4, 2)

    assert shard_units(Model(), min_params=1) == ["layers.1", "layers.0"]


def test_bad_options_are_refused_with_what_is_allowed():
    with pytest.raises(ConfigError, match="param_dtype must be one of"):
        FSDP(param_dtype="int8")
    with pytest.raises(ConfigError, match="reshard_after_forward must be true or false"):
        FSDP(reshard_after_forward="yes")  # type: ignore[arg-type]
    strategy = STRATEGIES.create("fsdp", reshard_after_forward=False, min_params=10)
    strategy.mixed_precision(torch.bfloat16)
    assert (
        strategy.options()["param_dtype"] == "bf16" and strategy.options()["reshard_after_forward"] is False
    )


def test_the_jobs_mixed_precision_sets_the_gathered_dtype_unless_an_option_chose_one():
    from sparkdp.comm import SingleProcessCollective
    from sparkdp.config import TrainingConfig
    from sparkdp.data.tensors import TensorData
    from sparkdp.train.loop import FitSpec, fit_worker
    from sparkdp.train.optim import optimizer_factory, resolve_loss

    chosen = FSDP(param_dtype="fp32")
    chosen.adopt_precision(torch.bfloat16)
    assert chosen.gathered_dtype == "fp32"
    with pytest.raises(ConfigError, match="fp16-mixed.*does not combine with strategy='fsdp'.*bf16-mixed"):
        FSDP().adopt_precision(torch.float16)
    model = torch.nn.Linear(4, 2)
    strategy = FSDP()
    spec = FitSpec(
        model=model,
        loss=resolve_loss("mse"),
        optimizer=optimizer_factory("sgd", model, lr=0.1),
        strategy=strategy,
        train=TensorData(torch.randn(8, 4), torch.randn(8, 2)),
        eval=None,
        training=TrainingConfig(epochs=1, batch_size=4, precision="bf16-mixed"),
    )
    fit_worker(spec, SingleProcessCollective())
    assert strategy.gathered_dtype == "bf16" and strategy.options()["param_dtype"] is None  # the option stays


@pytest.mark.distributed
@pytest.mark.timeout(240)
@pytest.mark.parametrize("model", ["cnn-small", "gpt-tiny"])
def test_fsdp_gives_allreduce_losses_for_20_steps_with_a_fraction_of_the_state(model):
    ddp = run_workers(step_losses, WORLD, "allreduce", model, timeout_s=200)
    sharded = run_workers(step_losses, WORLD, "fsdp", model, timeout_s=200)
    for rank in range(WORLD):
        torch.testing.assert_close(sharded[rank]["losses"], ddp[rank]["losses"], rtol=1e-4, atol=1e-6)
        assert sharded[rank]["state_bytes"] <= (1 / WORLD + 0.1) * ddp[rank]["state_bytes"], (rank, model)
    for key, value in ddp[0]["state"].items():  # rank 0 gathers the whole model
        torch.testing.assert_close(sharded[0]["state"][key], value, rtol=1e-4, atol=1e-5, msg=key)
    assert sharded[1]["state"] == {}
    _assert_identical(join_parts([r["share"] for r in sharded]), sharded[0]["state"])  # fit's result


def _assert_identical(got: dict, want: dict) -> None:
    assert list(got) == list(want)
    for key, value in want.items():
        assert got[key].dtype == value.dtype and torch.equal(got[key], value), key


def _joined(reports: list) -> dict:
    """Rank 0's report (plain values) holding the whole model: every rank's share joined as the
    driver joins them."""
    return {**reports[0], "state": state_to_bytes(join_parts([r["state"] for r in reports if r is not None]))}


@pytest.mark.distributed
@pytest.mark.timeout(120)
def test_the_ranks_shares_of_the_result_join_into_exactly_the_gathered_model_and_none_holds_it_whole():
    """fit's result under fsdp: every rank sends its own shards (rank 0 the buffers too), never
    the whole model, and the shares joined are the gathered state dict bit for bit: rows that
    split unevenly, a one-row layer that rank 1 holds none of, tied weights, a buffer."""
    out = run_workers(shares_and_gathered, WORLD, "fsdp", timeout_s=100)
    want = out[0]["gathered"]
    assert out[1]["gathered"] == {}
    _assert_identical(join_parts([r["share"] for r in out]), want)
    params = [k for k in want if k.endswith(("weight", "bias"))]  # rank 0 adds the buffers
    assert sum(want[k].numel() for k in params) == 111  # the tied weight under both its names
    # rows by torch.chunk: rank 0 rows 0-2 of every 5-row tensor (layer 0: 18 + 3, the norm 3 + 3,
    # layers 3 and 5: 15 + 3 each) and all of the one-row layer (5 + 1): 69; rank 1 the other 42
    shares = [load_safetensors(r["share"]) for r in out]
    assert [sum(s[k].numel() for k in params if k in s) for s in shares] == [69, 42]
    assert "1.running_mean" in shares[0] and "1.running_mean" not in shares[1]  # buffers: rank 0's


@pytest.mark.distributed
@pytest.mark.timeout(240)
def test_fit_worker_with_fsdp_reports_the_whole_model_metrics_and_memory_like_allreduce():
    ddp_reports = run_workers(fit, WORLD, "allreduce", timeout_s=200)
    reports = run_workers(fit, WORLD, "fsdp", timeout_s=200)
    ddp, sharded = ddp_reports[0], _joined(reports)
    assert ddp_reports[1] is None  # allreduce: rank 0 returns the whole model
    for report in reports:  # fsdp: no rank returns more than about its share
        assert len(report["state"]) <= (1 / WORLD + 0.1) * len(ddp["state"])
    for mine, theirs in zip(sharded["history"], ddp["history"]):
        for key in ("loss", "test_loss", "test_accuracy"):
            assert mine[key] == pytest.approx(theirs[key], rel=1e-4), key
    want, got = load_safetensors(ddp["state"]), load_safetensors(sharded["state"])
    assert want.keys() == got.keys()
    for key in want:
        torch.testing.assert_close(got[key], want[key], rtol=1e-4, atol=1e-5, msg=key)
    assert [m["worker"] for m in sharded["memory"]] == list(range(WORLD))
    for mine, theirs in zip(sharded["memory"], ddp["memory"]):
        assert mine["peak_rss_bytes"] > 0
        assert 0 < mine["model_state_bytes"] <= (1 / WORLD + 0.1) * theirs["model_state_bytes"]


@pytest.mark.distributed
@pytest.mark.timeout(300)
def test_a_sharded_checkpoint_written_on_4_workers_resumes_on_2_with_the_same_next_losses(tmp_path):
    """Each of 4 ranks writes its own shards; 2 ranks load them into their own sharding (DCP
    reshards); the steps after the resume (the second one uses AdamW's restored moments) match
    the 4-worker run's continuation."""
    steps, rows = 3, 16
    four = run_workers(checkpoint_then_continue, 4, str(tmp_path), steps, rows, timeout_s=200)[0]
    [manifest] = [p.name for p in tmp_path.iterdir() if p.name.endswith(".manifest.json")]
    parts = sorted(p.name for p in (tmp_path / manifest.removesuffix(".manifest.json")).iterdir())
    assert parts == ["loop-state", *(f"shard-0000{r}-model-00001-of-00001.safetensors" for r in range(1, 5))]
    two, fresh = run_workers(resume_and_continue, 2, str(tmp_path), steps, rows, timeout_s=200)[0]
    assert two == pytest.approx(four, rel=1e-4)
    assert fresh[0] == pytest.approx(four[0], rel=1e-4)  # the weights came back
    assert fresh[1] != pytest.approx(four[1], rel=1e-4)  # the moments matter to the second step


@pytest.mark.distributed
@pytest.mark.timeout(240)
def test_with_sharded_checkpoints_off_the_loops_checkpoints_hold_the_whole_model_and_named_optimizer_state(
    tmp_path,
):
    from sparkdp import state as state_io
    from sparkdp.train.checkpoint import latest_checkpoint

    options = {"sharded_checkpoints": False}
    report = _joined(run_workers(fit, WORLD, "fsdp", str(tmp_path), 10, options, timeout_s=200))
    checkpoint = latest_checkpoint(tmp_path)
    assert checkpoint is not None and (checkpoint.epoch, checkpoint.step, checkpoint.workers) == (2, 0, WORLD)
    assert not checkpoint.shards
    final = load_safetensors(report["state"])
    assert checkpoint.model.keys() == final.keys()
    for key, value in final.items():  # the last epoch's checkpoint is the returned model
        torch.testing.assert_close(checkpoint.model[key], value, rtol=0, atol=0, msg=key)
    optimizer = state_io.from_bytes(checkpoint.optimizer)["optimizer"]
    assert sorted(optimizer["state"]) == sorted(final)  # whole moments, by parameter name
    for name, moments in optimizer["state"].items():
        assert moments["exp_avg"].shape == final[name].shape, name


@pytest.mark.distributed
@pytest.mark.timeout(300)
def test_the_loop_writes_sharded_checkpoints_and_an_uncommitted_one_is_never_resumed(tmp_path):
    """Under fsdp every rank writes its shards at each epoch end; an epoch whose manifest is
    missing (a crash before the commit) is not what resume picks: the job resumes from the
    epoch before, rewrites the lost one, and ends with the uninterrupted run's model."""
    from sparkdp.train.checkpoint import latest_checkpoint

    whole = _joined(run_workers(fit, WORLD, "fsdp", str(tmp_path), timeout_s=200))
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == [
        "shards-e00001-s00000000-fit-job",
        "shards-e00001-s00000000-fit-job.manifest.json",
        "shards-e00002-s00000000-fit-job",
        "shards-e00002-s00000000-fit-job.manifest.json",
    ]
    assert not list(tmp_path.rglob("*.metadata"))  # no pickled DCP metadata is written
    last = latest_checkpoint(tmp_path)
    assert last is not None and (last.epoch, last.step, last.workers) == (2, 0, WORLD) and last.shards
    (tmp_path / names[3]).unlink()  # epoch 2 written, never committed
    first = latest_checkpoint(tmp_path)
    assert first is not None and first.epoch == 1 and [h["epoch"] for h in first.history] == [1]
    resumed = _joined(run_workers(fit_resumed, WORLD, str(tmp_path), timeout_s=200))
    assert [h["epoch"] for h in resumed["history"]] == [2]
    assert resumed["history"][0]["loss"] == pytest.approx(whole["history"][1]["loss"], rel=1e-5)
    want, got = load_safetensors(whole["state"]), load_safetensors(resumed["state"])
    for key in want:
        torch.testing.assert_close(got[key], want[key], rtol=1e-5, atol=1e-6, msg=key)
    assert sorted(p.name for p in tmp_path.iterdir()) == names  # epoch 2 rewritten and committed


@pytest.mark.distributed
@pytest.mark.timeout(300)
def test_a_resume_refuses_a_manifest_whose_parts_reach_outside_and_resumes_the_one_before(
    tmp_path, monkeypatch, caplog
):
    """A real 2-rank fsdp job's newest manifest given an absolute and a ``../`` part name (their
    bytes planted, their SHA-256s right): resume refuses that checkpoint with one line naming the
    part, resumes the epoch before on every rank, ends with the uninterrupted run's model, and
    no rank writes the planted files."""
    import logging

    from sparkdp.train.checkpoint import latest_checkpoint
    from tests.helpers.manifests import plant_hostile_parts

    directory, scratch = tmp_path / "ckpts", tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setenv("TMPDIR", str(scratch))  # the workers' temporary directories: ../ lands here
    whole = _joined(run_workers(fit, WORLD, "fsdp", str(directory), timeout_s=200))
    newest = directory / "shards-e00002-s00000000-fit-job.manifest.json"
    planted = plant_hostile_parts(newest, tmp_path / "outside", scratch)
    with caplog.at_level(logging.WARNING, logger="sparkdp"):
        first = latest_checkpoint(directory)
    assert first is not None and first.epoch == 1
    [line] = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert newest.name in line and "planted" in line and "\n" not in line
    resumed = _joined(run_workers(fit_resumed, WORLD, str(directory), timeout_s=200))
    assert not any(p.exists() for p in planted)
    assert [h["epoch"] for h in resumed["history"]] == [2]
    assert resumed["history"][0]["loss"] == pytest.approx(whole["history"][1]["loss"], rel=1e-5)
    want, got = load_safetensors(whole["state"]), load_safetensors(resumed["state"])
    for key in want:
        torch.testing.assert_close(got[key], want[key], rtol=1e-5, atol=1e-6, msg=key)


@pytest.mark.distributed
@pytest.mark.timeout(240)
def test_bf16_parameters_train_like_fp32_while_the_shards_stay_fp32():
    """param_dtype=bf16 computes and gathers in bf16 (8 significant bits: losses within 2%),
    the optimizer keeps float32 shards, and the gathers' bytes on the wire halve."""
    full = run_workers(step_losses, WORLD, "fsdp", "gpt-tiny", 5, timeout_s=200)
    half = run_workers(step_losses, WORLD, "fsdp", "gpt-tiny", 5, 4, {"param_dtype": "bf16"}, timeout_s=200)
    for rank in range(WORLD):
        torch.testing.assert_close(half[rank]["losses"], full[rank]["losses"], rtol=2e-2, atol=0)
        assert half[rank]["losses"].tolist() != full[rank]["losses"].tolist()  # bf16 did compute
        assert half[rank]["dtypes"] == ["torch.float32"] and half[rank]["options"]["param_dtype"] == "bf16"
        # per step: two fp32 gathers + an fp32 reduce-scatter (12 bytes/value) against 2 + 2 + 4
        assert half[rank]["sent"] * 12 == pytest.approx(full[rank]["sent"] * 8, rel=1e-3)

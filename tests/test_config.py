"""The settings are defined once (sparkdp.config): fit's keywords, the flags and job files derive from them."""

from __future__ import annotations

import dataclasses
import inspect
from dataclasses import dataclass

import pytest
import torch
import yaml

import sparkdp
from sparkdp import config
from sparkdp.cli.fields import effective_config, load_job_file
from sparkdp.cli.main import build_parser
from sparkdp.cli.train_cmd import optimizer_choice
from sparkdp.config import GROUPS, JOB_DEFAULTS, Columns, JobConfig, MonitorConfig, field_docs, setting
from sparkdp.errors import ConfigError
from sparkdp.train.optim import optimizer_factory

pytestmark = pytest.mark.timeout(60)


def test_fit_and_run_take_settings_only_through_the_config():
    fit_keywords = set(inspect.signature(sparkdp.fit).parameters)
    settings = set(JobConfig.of().settings())
    assert not fit_keywords & settings  # no second copy of a setting's name or default
    with pytest.raises(ConfigError, match="fit has no setting 'epoch'.*Did you mean 'epochs'"):
        sparkdp.fit(torch.nn.Linear(2, 2), (torch.zeros(4, 2), torch.zeros(4, dtype=torch.long)), epoch=2)
    with pytest.raises(ConfigError, match="run has no setting 'epochs'; allowed: .*workers"):
        sparkdp.run(print, epochs=2)


def test_every_setting_has_help_text_and_one_owner():
    names = [f.name for cls in GROUPS.values() for f in dataclasses.fields(cls)]
    assert len(names) == len(set(names)) >= 30
    for cls in GROUPS.values():
        docs = field_docs(cls)
        assert set(docs) == {f.name for f in dataclasses.fields(cls)}, cls.__name__
        assert all(len(text) > 10 for text in docs.values()), cls.__name__


@dataclass(frozen=True)
class _MonitorWithAKnob(MonitorConfig):
    """What the job shows and records while it runs.

    Attributes:
        flush_every: a setting added to a group, to see it reach every way in.
    """

    flush_every: int = setting(5, metavar="N")


def test_a_new_setting_reaches_the_flags_job_files_and_keywords_without_cli_changes(
    monkeypatch, tmp_path, capsys
):
    monkeypatch.setitem(GROUPS, "monitor", _MonitorWithAKnob)
    parser = build_parser()
    train = parser._subparsers._group_actions[0].choices["train"]
    assert "--flush-every N" in train.format_help() and "a setting added to a group" in train.format_help()
    args = parser.parse_args(["train", "--flush-every", "7", "--print-config"])
    assert yaml.safe_load(effective_config(args, args.settings))["flush_every"] == 7
    job_file = tmp_path / "job.yaml"
    job_file.write_text("flush_every: 9\n")
    assert load_job_file(str(job_file), args.settings)["flush_every"] == 9
    job_file.write_text("flush_every: nine\n")
    with pytest.raises(ConfigError, match="flush_every is 'nine' \\(str\\); expected an integer"):
        load_job_file(str(job_file), args.settings)
    assert JobConfig.of(flush_every=3, epochs=2).monitor.flush_every == 3
    assert JobConfig.of(epochs=2).monitor.flush_every == 5


def test_groups_can_be_given_whole_and_settings_read_back_flat():
    job = JobConfig.of(scaling=config.ScalingConfig(workers=4), threads=2, epochs=3)
    assert (job.scaling.workers, job.scaling.threads, job.training.epochs) == (4, 2, 3)
    assert JobConfig.of(job.settings()) == job
    with pytest.raises(ConfigError, match="scaling must be a ScalingConfig; got dict"):
        JobConfig.of(scaling={"workers": 4})


def _train_args(*argv: str):
    return build_parser().parse_args(["train", "--dataset", "fashion-mnist", "--model", "linear", *argv])


def test_command_line_defaults_are_the_configs():
    args = _train_args("--print-config")
    printed = yaml.safe_load(effective_config(args, args.settings))
    for name, value in JOB_DEFAULTS.settings().items():
        assert printed[name] == (dict(value) if name == "strategy_options" else value), name
    assert (
        args.epochs is None and args.batch_size is None
    )  # not given: a script's own values, else the config's


def test_command_line_and_api_build_the_same_default_optimizer():
    model = torch.nn.Linear(3, 2)
    name, options = optimizer_choice(_train_args())
    from_cli = optimizer_factory(name, model, **options).build(model)
    from_api = optimizer_factory("sgd", model).build(model)
    assert type(from_cli) is type(from_api) is torch.optim.SGD
    assert from_cli.defaults == from_api.defaults
    assert from_api.defaults["lr"] == 0.01 and from_api.defaults["momentum"] == 0.9
    name, options = optimizer_choice(_train_args("--lr", "0.05"))
    assert optimizer_factory(name, model, **options).build(model).defaults["lr"] == 0.05


def test_command_line_optimizer_flag_errors():
    with pytest.raises(ConfigError, match="adam has no momentum"):
        optimizer_choice(_train_args("--optimizer", "adam", "--momentum", "0.5"))
    with pytest.raises(ConfigError, match="script already builds its own optimizer"):
        optimizer_choice(_train_args("--lr", "0.1"), script_optimizer=torch.optim.SGD)


def test_mapping_flags_reach_the_job_config_through_the_parser(tmp_path):
    from sparkdp.cli.fields import job_settings

    job_file = tmp_path / "job.yaml"
    job_file.write_text("checkpoint_storage_options: {endpoint_url: 'http://old:9000', region: eu}\n")
    argv = [
        "--checkpoint-storage-options",
        "endpoint_url=http://minio:9000",
        "--checkpoint-storage-options",
        "anon=false",
        "--checkpoint-storage-options",
        'client_kwargs={"region_name": "eu-west-1"}',
        "--checkpoint-storage-options",
        "secret=a=b/c",  # the value keeps every '=' after the first
        "--checkpoint-storage-options",
        'key="0123"',  # JSON quotes keep digits a string
        "--strategy-option",
        "period=4",
    ]
    parser = build_parser()
    args = parser.parse_args(["train", "--dataset", "fashion-mnist", *argv])
    args.parser.set_defaults(**load_job_file(str(job_file), args.settings))  # as main() reads a job file
    args = parser.parse_args(["train", "--dataset", "fashion-mnist", *argv])
    job = JobConfig.of(job_settings(args))
    assert job.checkpoints.checkpoint_storage_options == {
        "endpoint_url": "http://minio:9000",  # the flag over the job file
        "region": "eu",  # the job file's other options kept
        "anon": False,
        "client_kwargs": {"region_name": "eu-west-1"},
        "secret": "a=b/c",
        "key": "0123",
    }
    assert job.training.strategy_options == {"period": 4}
    model = build_parser().parse_args(["train", "--dataset", "fashion-mnist", "--model-option", "hidden=8"])
    assert model.model_options == {"hidden": 8}


@pytest.mark.parametrize("flag", ["--checkpoint-storage-options", "--strategy-option", "--model-option"])
@pytest.mark.parametrize("text", ["endpoint_url", "=http://h:9000", ""])
def test_a_malformed_mapping_flag_is_one_argparse_error_line(flag, text, capsys):
    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args(["train", "--dataset", "fashion-mnist", flag, text])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert (
        f"argument {flag}: expected KEY=VALUE (e.g. period=4 or endpoint_url=http://host:9000); got {text!r}."
        in err
    )


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"epochs": 0}, "epochs must be a positive integer; got 0"),
        ({"batch_size": 2.5}, "batch_size must be a positive integer"),
        ({"workers": True}, "workers must be a positive integer"),
        ({"eval_every": -1}, "eval_every must be a positive integer"),
        ({"seed": "1"}, "seed must be an integer"),
        ({"memory_format": "nhwc"}, "memory_format must be one of auto, channels_last, contiguous"),
        ({"pg_timeout_s": 0}, "pg_timeout_s must be a number of seconds > 0"),
        ({"strategy_options": [1]}, "strategy_options must be a mapping"),
    ],
)
def test_bad_settings_say_what_is_allowed(settings, message):
    with pytest.raises(ConfigError, match=message):
        JobConfig.of(**settings)


def test_flat_settings_make_a_config_and_unknown_names_are_refused():
    job = JobConfig.of({"epochs": 3, "strategy": "average", "strategy_options": {"period": 4}})
    assert (
        job.training.epochs,
        job.training.strategy,
        dict(job.training.strategy_options),
        job.training.batch_size,
    ) == (3, "average", {"period": 4}, 64)
    assert JobConfig.of(job.settings()) == job
    with pytest.raises(ConfigError, match="has no setting 'epoch'.*Did you mean 'epochs'"):
        JobConfig.of(epoch=3)
    with pytest.raises(dataclasses.FrozenInstanceError):
        job.training.epochs = 4  # type: ignore[misc]


def test_columns_need_features_when_a_label_is_named():
    with pytest.raises(ConfigError, match="label= was given without features="):
        Columns(label="y")
    assert not Columns().given and Columns(features="x", label="y").given


def test_refused_storage_options_are_quoted_without_their_credentials():
    with pytest.raises(ConfigError, match="expected a mapping of option names") as refused:
        JobConfig.of(checkpoint_storage_options={1: "x", "secret": "S3CR3T", "endpoint_url": "http://h:9000"})
    assert "S3CR3T" not in str(refused.value) and "'secret': '***'" in str(refused.value)
    assert "http://h:9000" in str(refused.value)


def test_resume_job_is_a_flag_and_a_job_file_key():
    args = _train_args("--resume", "runs/a", "--resume-job", "job-a", "--print-config")
    printed = yaml.safe_load(effective_config(args, args.settings))
    assert (printed["resume"], printed["resume_job"]) == ("runs/a", "job-a")
    job = JobConfig.of({"resume": "runs/a", "resume_job": "job-b"})
    assert job.checkpoints.resume_job == "job-b"

"""JobConfig is the one source of a job's defaults: fit, run and the command line agree with it."""

from __future__ import annotations

import dataclasses
import inspect

import pytest
import torch

import sparkdp
from sparkdp.cli.main import build_parser
from sparkdp.cli.train_cmd import optimizer_choice
from sparkdp.config import COLUMN_DEFAULTS, JOB_DEFAULTS, Columns, JobConfig
from sparkdp.errors import ConfigError
from sparkdp.train.optim import optimizer_factory

pytestmark = pytest.mark.timeout(60)


def _defaults(fn) -> dict:
    return {name: p.default for name, p in inspect.signature(fn).parameters.items()
            if p.default is not inspect.Parameter.empty}


@pytest.mark.parametrize("fn", [sparkdp.fit, sparkdp.run])
def test_fit_and_run_signature_defaults_are_the_configs(fn):
    given = _defaults(fn)
    shared = {f.name for f in dataclasses.fields(JobConfig)} & set(given)
    assert len(shared) >= (13 if fn is sparkdp.fit else 8)
    for name in shared:
        want = getattr(JOB_DEFAULTS, name)
        assert given[name] == (None if want == {} else want), name  # options: None stands for {}
    for field in dataclasses.fields(Columns):
        if field.name in given:
            assert given[field.name] == getattr(COLUMN_DEFAULTS, field.name), field.name


def _train_args(*argv: str):
    return build_parser().parse_args(["train", "--dataset", "fashion-mnist", "--model", "linear", *argv])


def test_command_line_defaults_are_the_configs():
    args = _train_args()
    assert (args.strategy, args.seed, args.eval_every, args.memory_format) == (
        JOB_DEFAULTS.strategy, JOB_DEFAULTS.seed, JOB_DEFAULTS.eval_every, JOB_DEFAULTS.memory_format)
    assert args.epochs is None and args.batch_size is None  # a script's own values, else JobConfig's


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


@pytest.mark.parametrize(("settings", "message"), [
    ({"epochs": 0}, "epochs must be a positive integer; got 0"),
    ({"batch_size": 2.5}, "batch_size must be a positive integer"),
    ({"workers": True}, "workers must be a positive integer"),
    ({"eval_every": -1}, "eval_every must be a positive integer"),
    ({"seed": "1"}, "seed must be an integer"),
    ({"memory_format": "nhwc"}, "memory_format must be one of auto, channels_last, contiguous"),
    ({"pg_timeout_s": 0}, "pg_timeout_s must be a number of seconds > 0"),
    ({"strategy_options": [1]}, "strategy_options must be a mapping"),
])
def test_bad_settings_say_what_is_allowed(settings, message):
    with pytest.raises(ConfigError, match=message):
        JobConfig(**settings)


def test_from_mapping_takes_a_job_file_and_names_unknown_keys():
    job = JobConfig.from_mapping({"epochs": 3, "strategy": "average", "strategy_options": {"period": 4}})
    assert (job.epochs, job.strategy, dict(job.strategy_options), job.batch_size) == (3, "average", {"period": 4}, 64)
    assert JobConfig.from_mapping(job.defaults()) == job
    with pytest.raises(ConfigError, match="unknown job setting 'epoch'.*Did you mean 'epochs'"):
        JobConfig.from_mapping({"epoch": 3})
    with pytest.raises(dataclasses.FrozenInstanceError):
        job.epochs = 4  # type: ignore[misc]


def test_columns_need_features_when_a_label_is_named():
    with pytest.raises(ConfigError, match="label= was given without features="):
        Columns(label="y")
    assert not COLUMN_DEFAULTS.given and Columns(features="x", label="y").given

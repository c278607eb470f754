"""``sparkdp train``: a user script, or a built-in dataset + model, trained on Spark."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..config import GROUPS, JobConfig, LoraSettings, key_value, setting
from ..errors import ConfigError
from .caffe_cmd import CaffeOptions
from .fields import add_job_settings, given, job_settings


@dataclass(frozen=True)
class TrainInputs:
    """What to train: a script, or a built-in or Parquet dataset with a built-in model.

    Attributes:
        script: a single-machine training script defining model, train_data and optionally test_data, optimizer, loss_fn, batch_size, epochs (optional with dataset and model).
        dataset: built-in dataset: fashion-mnist, or the text corpus fortunes (with --model gpt or gpt-tiny).
        model: built-in model: cnn, cnn-small, mlp, linear, or the language models gpt and gpt-tiny (sparkdp.models).
        model_options: the built-in model's settings, e.g. n_layer=4 for gpt (KEY=VALUE, the value read as JSON).
        hf_model: a local Hugging Face causal language model directory (what save_pretrained writes: config.json and safetensors weights) to train, e.g. with --data token blocks, --features input_ids,labels --dict-batches --loss model.
        loss: the loss: cross_entropy, mse, l1, nll, bce_with_logits, or model (the model computes its own loss from the batch's labels; the default with --hf-model and a text corpus, else cross_entropy).
        data: training data: a Parquet file or directory (with features and label).
        eval_data: held-out Parquet data evaluated after every eval_every-th epoch.
        limit: use only the first N training and test rows (of a text corpus: its first N documents; quick runs; also of a Caffe net's own LMDB/LevelDB/HDF5 sources).
        optimizer: sgd, adam, adamw, rmsprop or adagrad (default: the script's, else sgd).
        lr: learning rate (default 0.01 for sgd).
        momentum: SGD or RMSprop momentum (default 0.9 for sgd).
        json_out: write a JSON summary of the run to this file.
    """

    script: str | None = setting(None, positional=True)
    dataset: str | None = setting(None)
    model: str | None = setting(None)
    model_options: Mapping[str, Any] = setting(
        factory=dict, flag="--model-option", metavar="KEY=VALUE", parse=key_value
    )
    hf_model: str | None = setting(None, metavar="DIR")
    loss: str | None = setting(None, metavar="NAME")
    data: str | None = setting(None, metavar="PATH")
    eval_data: str | None = setting(None, metavar="PATH")
    limit: int | None = setting(None, metavar="N")
    optimizer: str | None = setting(None)
    lr: float | None = setting(None)
    momentum: float | None = setting(None)
    json_out: str | None = setting(None, metavar="FILE")


def settings_classes() -> tuple[tuple[type, Any], ...]:
    """Every settings class ``sparkdp train`` takes, as (class, the fields it takes or None for all)."""
    return (
        (TrainInputs, None),
        *((cls, None) for cls in GROUPS.values()),
        (LoraSettings, None),
        (CaffeOptions, None),
    )


def add_parser(sub) -> None:
    p = sub.add_parser(
        "train",
        help="train a script's model, or a built-in model on a built-in dataset",
        description="Train data-parallel on Spark. SCRIPT.py defines model, train_data and "
        "optionally test_data, optimizer, loss_fn (see `sparkdp.cli.script`). Every "
        "flag is also a job-file key (--batch-size: batch_size) and a keyword of "
        "sparkdp.fit.",
    )
    add_job_settings(p, settings_classes(), run)


def optimizer_choice(args, script_optimizer: object = None) -> tuple[object, dict]:
    """(optimizer, options) for ``fit``: the script's own, or a name with the flags over its defaults.

    A name's defaults are ``train.optim.DEFAULT_OPTIMIZER_ARGS``, the same table ``fit`` uses.
    """
    if script_optimizer is not None and not args.optimizer:
        if args.lr is not None or args.momentum is not None:
            raise ConfigError(
                "--lr/--momentum apply to --optimizer; the script already builds its own optimizer. "
                "Change it in the script or pass --optimizer too."
            )
        return script_optimizer, {}
    name = args.optimizer or "sgd"
    options = {k: v for k, v in (("lr", args.lr), ("momentum", args.momentum)) if v is not None}
    if "momentum" in options and name not in ("sgd", "rmsprop"):
        raise ConfigError(
            f"--momentum applies to --optimizer sgd or rmsprop; {name} has no momentum setting."
        )
    return name, options


@dataclass(frozen=True)
class Prepared:
    """A ``sparkdp train`` job ready to run: the model, its data, settings, loss and optimizer."""

    model: Any
    data: Any
    eval_data: Any
    job: JobConfig
    loss: Any
    optimizer: Any
    optimizer_options: dict
    model_desc: dict[str, Any]
    caffe: Any

    def fit(self, job: JobConfig, spark: Any, **more: Any) -> Any:
        """Train with ``job`` (this one's settings, or a trial's) on ``spark``."""
        from ..driver.api import fit_job

        return fit_job(
            self.model,
            self.data,
            job,
            eval_data=self.eval_data,
            loss=self.loss,
            optimizer=self.optimizer,
            optimizer_options=self.optimizer_options,
            spark=spark,
            **more,
        )


def prepare(args) -> Prepared:
    """Everything ``sparkdp train`` trains, from its flags, checked before Spark starts (``sparkdp
    tune`` prepares each trial this way)."""
    import torch

    from ..data.datasets import dataset_tensors, load_dataset
    from ..data.text_datasets import TEXT_DATASETS
    from ..models import build_model
    from .text_job import text_job

    settings = job_settings(args)
    columns = {name: settings.pop(name) for name in list(settings) if name in given(args, GROUPS["columns"])}
    job = JobConfig.of(settings)
    caffe_run = bool(args.caffe_net or args.caffe_solver or args.caffe_weights)
    optimizer = None
    loss: Any = "cross_entropy"  # a loss name, the script's callable, or a Caffe net's loss layer
    eval_data = None
    model_desc: dict[str, Any]
    text = None  # a built-in text corpus, packed for a language model
    batch_size = args.batch_size
    epochs = args.epochs
    if args.model_options and (args.script or caffe_run or args.hf_model):
        raise ConfigError(
            "--model-option applies to a built-in --model; a script, a Caffe net or --hf-model "
            "(its config.json) builds its own model."
        )
    if args.dataset in TEXT_DATASETS and (args.script or caffe_run):
        raise ConfigError(
            f"the text corpus {args.dataset!r} trains a built-in language model: "
            f"`sparkdp train --dataset {args.dataset} --model gpt`."
        )
    _check_model_source(args, caffe_run)
    lora = LoraSettings(**given(args, LoraSettings))
    if lora.enabled and not args.hf_model:
        raise ConfigError(
            "--lora-r wraps a Hugging Face model in LoRA adapters: give it with --hf-model DIR "
            "(a script builds its own model; wrap it with peft.get_peft_model there)."
        )
    if args.script:
        from .script import load_script

        script = load_script(args.script)
        model, data, eval_data = script.model, script.train_data, script.test_data
        optimizer, loss = script.optimizer, script.loss or "cross_entropy"
        batch_size = script.batch_size if batch_size is None else batch_size
        epochs = script.epochs if epochs is None else epochs
        model_desc = {"script": str(Path(args.script).resolve())}
    elif caffe_run:
        model, model_desc, data = None, {}, None  # built below, once the data's row shape is known
    elif args.hf_model:
        from ..models.hf import load_hf_model, with_lora

        model, loss, data = load_hf_model(args.hf_model), "model", None
        model_desc = {"hf_model": str(Path(args.hf_model).resolve())}
        if lora.enabled:
            model = with_lora(model, lora)
            model_desc["lora"] = given(args, LoraSettings)
    else:
        if not args.model:
            raise ConfigError(
                "give a training script, or --model (and --dataset) for a built-in job, e.g. "
                "`sparkdp train --dataset fashion-mnist --model cnn`."
            )
        torch.manual_seed(job.training.seed)
        model_args = dict(args.model_options or {})
        if args.dataset and args.dataset in TEXT_DATASETS:
            text = text_job(args.dataset, args.model, model_args, args.limit)
            model_args, loss = text.model_args, "model"
            settings.update(text.columns)
        model = build_model(args.model, **model_args)
        model_desc = {"model": args.model, "model_args": model_args}
        data = None
    if text is not None:
        data, eval_data = text.data, text.eval_data
        model_desc["dataset"] = args.dataset
    elif args.dataset:
        ds = load_dataset(args.dataset, limit=args.limit)
        data, eval_data = dataset_tensors(ds)
        model_desc["dataset"] = args.dataset
    if args.data:
        if not args.features or not (args.label or args.dict_batches):
            raise ConfigError(
                "--data needs --features COLS and --label COL (which columns are inputs and target), "
                "or --features COLS --dict-batches for a model whose batch holds its own labels "
                "(e.g. --features input_ids,labels --dict-batches --loss model)."
            )
        data, eval_data = args.data, args.eval_data
        settings.update(columns)
        model_desc["data"] = str(args.data)
    if data is None and not caffe_run:  # (a Caffe net without data reads its own data layers' sources)
        raise ConfigError(
            "no training data: give --dataset, --data PATH.parquet, or a script defining `train_data`."
        )
    caffe = None
    if caffe_run:
        from .caffe_job import cli_job

        caffe = cli_job(args, job, data, model_desc)
        model, loss, optimizer, batch_size, epochs = (
            caffe.model,
            caffe.loss,
            caffe.optimizer,
            caffe.batch_size,
            caffe.epochs,
        )
        if data is None:
            data, eval_data = caffe.data, caffe.eval_data
    if args.loss is not None:
        loss = args.loss  # (over a script's loss_fn; _check_model_source refused it with a Caffe net)
    optimizer, opt_options = optimizer_choice(args, optimizer)
    # a script's or Caffe solver's batch size and epochs count when no flag or job file set them
    job = JobConfig.of(
        settings,
        **({"epochs": epochs} if epochs is not None else {}),
        **({"batch_size": batch_size} if batch_size is not None else {}),
    )
    _check_before_spark(job)
    assert model is not None  # the script, --model or (caffe_run) cli_job built it
    return Prepared(model, data, eval_data, job, loss, optimizer, opt_options, model_desc, caffe)


def run(args) -> int:
    started = time.perf_counter()
    import sparkdp

    prepared = prepare(args)
    job = prepared.job
    run_dir, quiet = job.monitor.run_dir, not job.monitor.show_progress
    # Spark's own console log stays off unless -v: failures end in sparkdp's one-line message
    spark = sparkdp.session(
        job.scaling.master, log_level="OFF" if not getattr(args, "verbose", 0) else "WARN"
    )
    result = prepared.fit(job, spark, started=started)
    caffe, model_desc = prepared.caffe, prepared.model_desc
    model_path = None
    if run_dir:
        model_path = str(result.save(Path(run_dir) / "model.safetensors", **model_desc))
        if caffe is not None:
            caffe_path = caffe.save(run_dir, result.model)
            if not quiet:
                print(f"Caffe weights saved to {caffe_path}")
    print(final_line(result.history[-1]))  # (kept under -q: the live display showed the epochs)
    whole = result.summary()
    summary = {
        "strategy": result.strategy,
        "strategy_options": result.strategy_options,
        "workers": result.workers,
        "epochs": result.epochs,
        "test_accuracy": result.test_accuracy,
        "wall_s": time.perf_counter() - started,
        "samples_per_s": result.samples_per_s,
        "model_path": model_path,
        "train_time_s": result.train_time_s,
        "history": result.history,
        "failed_attempts_s": whole["failed_attempts_s"],
        **result.details,
    }  # details: the restarts, listed
    if not quiet:
        failures = (
            f"; {whole['restarts']} restart(s) after failures, whose attempts ran "
            f"{whole['failed_attempts_s']:.1f} s (their work after the checkpoint resumed from was redone)"
            if whole["restarts"]
            else ""
        )
        kept = " (the work kept)" if whole["restarts"] else ""
        print(
            f"{result.samples_per_s:,.0f} samples/s over {result.train_time_s:.1f} s of training{kept}; "
            f"{summary['wall_s']:.1f} s in all"
            + failures
            + (f"; model saved to {model_path}" if model_path else "")
        )
    if args.json_out:
        from ..files import atomic_write

        atomic_write(
            args.json_out, lambda tmp: Path(tmp).write_text(json.dumps(summary, indent=2, default=_described))
        )
    return 0


def final_line(final: Mapping[str, Any]) -> str:
    """The run's result in one line: the last epoch's training loss and its test metrics."""
    shown = [f"loss {final['loss']:.4f}"]
    for key in ("test_loss", "test_perplexity", "test_accuracy"):
        if isinstance(final.get(key), (int, float)):
            shown.append(f"{key} {final[key]:.4f}")
    return "final: " + "  ".join(shown)


def _check_model_source(args, caffe_run: bool) -> None:
    """--hf-model alone as the model source (a script, a Caffe net or --model build their own),
    and no --loss for a Caffe net, whose loss layer is its loss."""
    others = [
        flag
        for flag, value in (("a script", args.script), ("--caffe-net", caffe_run), ("--model", args.model))
        if value
    ]
    if args.hf_model and others:
        raise ConfigError(
            f"--hf-model DIR is the model to train; {' and '.join(others)} cannot be given with it. "
            "Pass one model source."
        )
    if args.loss is not None and caffe_run:
        raise ConfigError("--loss does not apply to a Caffe net: its loss layer is the loss.")


def _check_before_spark(job: JobConfig) -> None:
    """Refuse an unknown strategy or an output directory that cannot be written before Spark
    starts (several seconds): a typo fails at once, not after the JVM is up."""
    from ..monitor.sinks import writable_dir
    from ..strategies import STRATEGIES

    if isinstance(job.training.strategy, str):
        STRATEGIES.get(job.training.strategy)
    if job.monitor.run_dir:
        writable_dir(job.monitor.run_dir, "run log")


def _described(value: object) -> str:
    """A tensor in the summary (a strategy's state, e.g. diloco's outer momentum) by its type and
    shape: the values belong in checkpoints, not in a JSON report."""
    import torch

    if isinstance(value, torch.Tensor):
        return f"tensor({str(value.dtype).removeprefix('torch.')}, shape={list(value.shape)})"
    raise TypeError(f"{type(value).__name__} is not JSON serializable")

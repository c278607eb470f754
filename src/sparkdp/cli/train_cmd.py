"""``sparkdp train``: a user script, or a built-in dataset + model, trained on Spark."""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Any

from ..config import JOB_DEFAULTS, MEMORY_FORMATS, Columns, JobConfig
from ..errors import ConfigError
from .caffe_cmd import InputShapes, input_shape_arg


def key_value(text: str) -> tuple[str, object]:
    if "=" not in text:
        raise ConfigError(f"--strategy-option expects KEY=VALUE; got {text!r}.")
    key, value = text.split("=", 1)
    try:
        return key, json.loads(value)
    except json.JSONDecodeError:
        return key, value


def add_parser(sub) -> None:
    from ..models import MODELS
    from ..strategies import STRATEGIES
    from ..train.optim import DEFAULT_OPTIMIZER_ARGS

    job, sgd = JOB_DEFAULTS, DEFAULT_OPTIMIZER_ARGS["sgd"]

    p = sub.add_parser("train", help="train a script's model, or a built-in model on a built-in dataset",
                       description="Train data-parallel on Spark. SCRIPT.py defines model, train_data and "
                                   "optionally test_data, optimizer, loss_fn (see `sparkdp.cli.script`).")
    p.add_argument("script", nargs="?", help="a single-machine training script (optional with --dataset/--model)")
    p.add_argument("--dataset", help="built-in dataset: fashion-mnist")
    p.add_argument("--model", help=f"built-in model: {', '.join(MODELS.available())}")
    p.add_argument("--strategy", default=job.strategy, help=f"one of {', '.join(STRATEGIES.available())}")
    p.add_argument("--strategy-option", action="append", default=[], type=key_value, metavar="KEY=VALUE",
                   help="strategy setting, e.g. period=4 (repeatable)")
    p.add_argument("--workers", type=int, help="Spark tasks to train on (default: all task slots)")
    p.add_argument("--epochs", type=int, help=f"passes over the training data (default {job.epochs})")
    p.add_argument("--batch-size", type=int, help=f"rows per worker per step (default {job.batch_size})")
    p.add_argument("--optimizer", help="sgd, adam, adamw, rmsprop, adagrad (default: the script's, else sgd)")
    p.add_argument("--lr", type=float, help=f"learning rate (default {sgd['lr']} for sgd)")
    p.add_argument("--momentum", type=float, help=f"SGD momentum (default {sgd['momentum']})")
    p.add_argument("--seed", type=int, default=job.seed, help="seed of the data shuffles and the workers' random streams")
    p.add_argument("--limit", type=int, help="use only the first N training and test rows (quick runs; also of "
                                             "a Caffe net's own LMDB/LevelDB/HDF5 sources)")
    p.add_argument("--data", help="training data: a Parquet file or directory (with --features/--label)")
    p.add_argument("--eval-data", help="held-out Parquet data evaluated after every epoch")
    p.add_argument("--eval-every", type=int, default=job.eval_every, metavar="K",
                   help=f"evaluate after every K-th epoch and after the last (default {job.eval_every})")
    p.add_argument("--features", help="feature column(s), comma-separated")
    p.add_argument("--label", help="label column")
    p.add_argument("--feature-shape", help="reshape each row's features, e.g. 1,28,28")
    p.add_argument("--drop-nulls", action="store_true", help="drop rows with nulls instead of failing")
    p.add_argument("--master", help="Spark master URL (default: embedded local[N])")
    p.add_argument("--threads", type=int, help="torch threads per worker (default: spark.task.cpus)")
    p.add_argument("--memory-format", choices=MEMORY_FORMATS, default=job.memory_format,
                   help="layout of conv weights and image batches: auto (channels_last for conv nets on CPU), "
                        "channels_last, contiguous")
    rel = p.add_argument_group("checkpoints and recovery (synchronous strategies)")
    rel.add_argument("--checkpoint-dir", metavar="DIR", help="save checkpoints here (a directory or an hdfs:// or "
                                                             "s3:// URL); every epoch end at least")
    rel.add_argument("--checkpoint-every", type=int, metavar="STEPS", help="also save every STEPS steps of an epoch")
    rel.add_argument("--keep-checkpoints", type=int, default=job.keep_checkpoints, metavar="K",
                     help=f"keep the newest K checkpoints (default {job.keep_checkpoints})")
    rel.add_argument("--resume", metavar="DIR", help="continue from the newest valid checkpoint in DIR")
    rel.add_argument("--max-restarts", type=int, default=job.max_restarts, metavar="N",
                     help=f"restart a failed stage from the latest checkpoint up to N times (default {job.max_restarts})")
    rel.add_argument("--min-workers", type=int, metavar="N",
                     help="after a failure that took task slots away, continue on fewer workers, down to N")
    p.add_argument("--out", help="directory for model.safetensors, model.json and the run log run.jsonl "
                                 "(sparkdp report draws it)")
    p.add_argument("--json-out", help="write a JSON summary of the run here")
    mon = p.add_argument_group("monitoring")
    mon.add_argument("-q", "--quiet", action="store_true", help="no live progress display and no output but errors")
    mon.add_argument("--tensorboard", action="store_true", help="also write TensorBoard event files to OUT/tensorboard")
    mon.add_argument("--mlflow", metavar="URI", help="log the run to MLflow at this tracking URI "
                                                     "(e.g. sqlite:///runs/mlflow.db or http://host:5000)")
    mon.add_argument("--metrics-interval", type=float, default=job.metrics_interval_s, metavar="S",
                     help=f"seconds between two metrics reports of a worker (default {job.metrics_interval_s})")
    p.add_argument("--config", metavar="JOB.yaml", help="read settings from a YAML job file (flags override it); "
                                                        "its keys are these flags' names, e.g. batch_size: 64")
    p.add_argument("--print-config", action="store_true", help="print the effective configuration as YAML and exit")
    caffe = p.add_argument_group("Caffe model", "train a Caffe net with its own solver (instead of --model/SCRIPT); "
                                                "without --dataset/--data, from the sources its Data/HDF5Data "
                                                "layers name (TRAIN phase: training, TEST phase: evaluation)")
    caffe.add_argument("--caffe-net", metavar="NET.prototxt",
                       help="the train/test net; takes precedence over the solver's net: path")
    caffe.add_argument("--caffe-solver", metavar="SOLVER.prototxt",
                       help="sets optimizer, lr_policy, weight decay; max_iter sets the epochs unless --epochs "
                            "is given; the Data layer's batch_size is the per-worker batch unless --batch-size")
    caffe.add_argument("--caffe-input-shape", action=InputShapes, type=input_shape_arg, metavar="NAME=N,C,H,W",
                       help="the shape of a fed top the data does not tell (repeatable), e.g. an HDF5Data "
                            "layer's second dataset")
    caffe.add_argument("--caffe-weights", metavar="W.caffemodel", help="initial weights (with --out, the trained "
                                                                         "ones go to OUT/model.caffemodel)")
    p.set_defaults(func=run, parser=p)  # main() re-parses with a job file's values as defaults


def optimizer_choice(args, script_optimizer: object = None) -> tuple[object, dict]:
    """(optimizer, options) for ``fit``: the script's own, or a name with the flags over its defaults.

    A name's defaults are ``train.optim.DEFAULT_OPTIMIZER_ARGS``, the same table ``fit`` uses.
    """
    if script_optimizer is not None and not args.optimizer:
        if args.lr is not None or args.momentum is not None:
            raise ConfigError("--lr/--momentum apply to --optimizer; the script already builds its own optimizer. "
                              "Change it in the script or pass --optimizer too.")
        return script_optimizer, {}
    name = args.optimizer or "sgd"
    options = {k: v for k, v in (("lr", args.lr), ("momentum", args.momentum)) if v is not None}
    if "momentum" in options and name not in ("sgd", "rmsprop"):
        raise ConfigError(f"--momentum applies to --optimizer sgd or rmsprop; {name} has no momentum setting.")
    return name, options


def run(args) -> int:
    started = time.perf_counter()
    if args.print_config:
        from .job_file import effective_config

        print(effective_config(args, args.parser), end="")
        return 0
    import torch

    import sparkdp

    from ..data.datasets import dataset_tensors, load_dataset
    from ..models import build_model

    caffe_run = bool(args.caffe_net or args.caffe_solver or args.caffe_weights)
    optimizer = None
    loss: Any = "cross_entropy"  # a loss name, the script's callable, or a Caffe net's loss layer
    eval_data = None
    model_desc: dict[str, Any]
    batch_size = args.batch_size
    epochs = args.epochs
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
    else:
        if not args.model:
            raise ConfigError("give a training script, or --model (and --dataset) for a built-in job, e.g. "
                              "`sparkdp train --dataset fashion-mnist --model cnn`.")
        torch.manual_seed(args.seed)
        model = build_model(args.model)
        model_desc = {"model": args.model, "model_args": {}}
        data = None
    if args.dataset:
        ds = load_dataset(args.dataset, limit=args.limit)
        data, eval_data = dataset_tensors(ds)
        model_desc["dataset"] = args.dataset
    columns = Columns()
    if args.data:
        if not args.features or not args.label:
            raise ConfigError("--data needs --features COLS and --label COL (which columns are inputs and target).")
        data = args.data
        eval_data = args.eval_data
        feature_list = [c.strip() for c in args.features.split(",") if c.strip()]
        shape = tuple(int(v) for v in args.feature_shape.split(",")) if args.feature_shape else None
        columns = Columns(features=feature_list[0] if len(feature_list) == 1 else feature_list, label=args.label,
                          feature_shape=shape, drop_nulls=args.drop_nulls)
        model_desc["data"] = str(args.data)
    if data is None and not caffe_run:  # (a Caffe net without data reads its own data layers' sources)
        raise ConfigError("no training data: give --dataset, --data PATH.parquet, or a script defining `train_data`.")
    caffe = None
    if caffe_run:
        from .caffe_job import cli_job

        caffe = cli_job(args, data, model_desc)
        model, loss, optimizer, batch_size, epochs = (caffe.model, caffe.loss, caffe.optimizer, caffe.batch_size,
                                                      caffe.epochs)
        if data is None:
            data, eval_data = caffe.data, caffe.eval_data
    optimizer, opt_options = optimizer_choice(args, optimizer)
    # flags named like JobConfig's fields pass as they are; these four are spelled for the command line
    flags = {**vars(args), "strategy_options": dict(args.strategy_option), "run_dir": args.out,
             "show_progress": not args.quiet, "metrics_interval_s": args.metrics_interval,
             "epochs": JOB_DEFAULTS.epochs if epochs is None else epochs,
             "batch_size": JOB_DEFAULTS.batch_size if batch_size is None else batch_size}
    job = JobConfig(**{f.name: flags[f.name] for f in dataclasses.fields(JobConfig) if f.name in flags})
    # Spark's own console log stays off unless -v: failures end in sparkdp's one-line message
    spark = sparkdp.session(args.master, log_level="OFF" if not getattr(args, "verbose", 0) else "WARN")
    assert model is not None  # the script, --model or (caffe_run) cli_job built it
    result = sparkdp.fit_job(model, data, job, eval_data=eval_data, columns=columns, loss=loss, optimizer=optimizer,
                             optimizer_options=opt_options, spark=spark, started=started)
    model_path = None
    if args.out:
        model_path = str(result.save(Path(args.out) / "model.safetensors", **model_desc))
        if caffe is not None:
            caffe_path = caffe.save(args.out, result.model)
            if not args.quiet:
                print(f"Caffe weights saved to {caffe_path}")
    if not args.quiet:  # (the live display showed every epoch as it ended)
        final = result.history[-1]
        print("final: loss {loss:.4f}".format(**final)
              + (f"  test_accuracy {final['test_accuracy']:.4f}" if "test_accuracy" in final else ""))
    summary = {"strategy": result.strategy, "workers": result.workers, "epochs": result.epochs,
               "test_accuracy": result.test_accuracy, "wall_s": time.perf_counter() - started,
               "samples_per_s": result.samples_per_s, "model_path": model_path,
               "train_time_s": result.train_time_s, "history": result.history, **result.details}
    if not args.quiet:
        print(f"{result.samples_per_s:,.0f} samples/s over {result.train_time_s:.1f} s of training; "
              f"{summary['wall_s']:.1f} s in all" + (f"; model saved to {model_path}" if model_path else ""))
    if args.json_out:
        from ..files import atomic_write

        atomic_write(args.json_out, lambda tmp: Path(tmp).write_text(json.dumps(summary, indent=2)))
    return 0

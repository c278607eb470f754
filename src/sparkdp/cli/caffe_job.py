"""``sparkdp train --caffe-net/--caffe-solver``: the Caffe model, loss and optimizer for a CLI run.

Without ``--dataset``/``--data`` the data is the net's own: the TRAIN-phase Data/HDF5Data
layer's source for training and the TEST-phase one's for evaluation, read on the workers
with ``transform_param`` applied there (``caffe/sources/``); the model is then built
without applying the transform itself.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from torch import nn

from ..caffe.classifier import CaffeClassifier
from ..caffe.solver import CaffeOptimizerFactory
from ..caffe.solver_spec import SolverSpec, read_solver_spec
from ..caffe.train import (
    build_model,
    data_sample_shape,
    effective_batch_size,
    net_sources,
    plan_run,
    solver_net_source,
)
from ..config import JobConfig
from ..errors import ConfigError


class CaffeCLIJob:
    """What ``sparkdp train --caffe-net/--caffe-solver`` adds to a run (see :func:`cli_job`)."""

    def __init__(
        self,
        model: CaffeClassifier,
        spec: SolverSpec,
        batch_size: int,
        epochs: int,
        data: Any = None,
        eval_data: Any = None,
    ) -> None:
        self.model, self.batch_size, self.epochs = model, batch_size, epochs
        #: the net's own sources when the run gave no data (else None)
        self.data, self.eval_data = data, eval_data
        self.loss = model.caffe_loss()
        self.optimizer = CaffeOptimizerFactory(spec, model)

    def save(self, out_dir: str | os.PathLike[str], model: nn.Module | None = None) -> Path:
        """Write ``OUT/model.caffemodel`` (atomically)."""
        from ..caffe.weights import save_weights

        directory = Path(out_dir)
        directory.mkdir(parents=True, exist_ok=True)
        return save_weights(
            model if model is not None else self.model,
            directory / "model.caffemodel",
            name=self.model.net.name,
        )


def cli_job(args: Any, job: JobConfig, data: Any, model_desc: dict[str, Any]) -> CaffeCLIJob:
    """Build the Caffe model, loss, optimizer, batch size and epochs for ``sparkdp train``.

    ``args`` are ``sparkdp train``'s flags, ``job`` its settings; ``data`` is the training WorkerData, or None to read
    the sources the net's data layers name (then in ``job.data``/``job.eval_data``). What the
    run was built from is added to ``model_desc`` (``model.json``).
    """
    if not args.caffe_solver:
        raise ConfigError(
            "--caffe-net/--caffe-weights need --caffe-solver SOLVER.prototxt: the solver sets "
            "the optimizer, learning-rate policy and iterations."
        )
    clashes = [
        flag
        for flag, value in (
            ("a training script", args.script),
            ("--model", args.model),
            ("--optimizer", args.optimizer),
            ("--lr", args.lr),
            ("--momentum", args.momentum),
        )
        if value
    ]
    if clashes:
        raise ConfigError(
            f"--caffe-net/--caffe-solver define the model and optimizer, so {', '.join(clashes)} "
            "cannot be used with them; change the prototxt files instead."
        )
    spec = read_solver_spec(Path(args.caffe_solver))
    net = Path(args.caffe_net) if args.caffe_net else solver_net_source(spec, args.caffe_solver)
    if isinstance(net, Path) and not net.is_file():
        raise ConfigError(f"Caffe net prototxt {str(net)!r} does not exist.")
    sources = None
    if data is None:
        sources = net_sources(net, args.caffe_solver, limit=getattr(args, "limit", None))
        data = sources.train
    # sparkdp's built-in datasets hold images scaled to [0, 1]; Caffe's data layers see raw pixels.
    raw_scale = 255.0 if args.dataset else 1.0
    given = dict(getattr(args, "caffe_input_shape", None) or {})
    if None in given:
        raise ConfigError("--caffe-input-shape needs the top's name: NAME=N,C,H,W (e.g. label=64).")
    model = build_model(
        net,
        spec,
        sample_shape=data_sample_shape(data) if sources is None else None,
        raw_scale=raw_scale,
        weights=args.caffe_weights,
        seed=job.training.seed,
        input_shapes=given or None,
        sources=sources,
    )
    batch = effective_batch_size(model, spec, args.batch_size)
    epochs = args.epochs
    if epochs is None:
        num_samples = getattr(data, "num_samples", None)  # None for a Parquet path
        rows = num_samples() if callable(num_samples) else None
        _, epochs, _ = plan_run(spec, batch, job.scaling.workers, rows, master=job.scaling.master)
    model_desc["caffe_net"] = str(Path(net).resolve()) if isinstance(net, Path) else "(inline in solver)"
    model_desc["caffe_solver"] = str(Path(args.caffe_solver).resolve())
    if args.caffe_weights:
        model_desc["caffe_weights"] = str(Path(args.caffe_weights).resolve())
    if sources is not None:
        model_desc["caffe_data"] = sources.train.describe()
        if sources.eval is not None:
            model_desc["caffe_eval_data"] = sources.eval.describe()
        return CaffeCLIJob(model, spec, batch, epochs, sources.train, sources.eval)
    return CaffeCLIJob(model, spec, batch, epochs)

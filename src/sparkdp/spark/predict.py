"""Batched inference on a DataFrame: ``sparkdp.predict(model, df, features=...)``.

Built on an Arrow UDF (``pyspark.sql.functions.arrow_udf``, the same idea as
``pyspark.ml.functions.predict_batch_udf``): Spark hands each Python worker Arrow
record batches of the feature columns; they go through the same
:class:`~sparkdp.data.arrow.ArrowConverter` as training and through the model in
chunks of ``batch_size`` rows under ``torch.no_grad()``, on the GPU Spark assigned the
task (``spark.task.resource.gpu.amount``) or the CPU. No row-at-a-time UDF.

Integer feature columns (token ids) stay int64, for an embedding; ``output="loss"`` scores a
language model's rows: each row's mean next-token cross entropy and the number of tokens it
covers, so ``exp(sum(loss * tokens) / sum(tokens))`` is the perplexity of the whole column.
One row goes through the model on the driver first, so a wrong column or output kind fails
there in one line; an error on an executor comes back as one sparkdp line too
(:func:`~sparkdp.spark.worker_errors.udf_error`).

The model travels as its architecture on the ``meta`` device (no weights) plus
its state as safetensors bytes; each Python worker materialises it once and
keeps it in a small cache keyed by a hash of architecture and state, so later
tasks (and later calls with the same model) skip the loading.
"""

from __future__ import annotations

import copy
import hashlib
import logging
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any, cast

import numpy as np
import pyarrow as pa
import torch
import torch.nn.functional as F
from torch import nn

from ..config import check_int
from ..data.arrow import ArrowConverter
from ..errors import ConfigError, DataError
from ..state import state_from_bytes, state_to_bytes
from .task import task_resources
from .worker_errors import udf_error

log = logging.getLogger(__name__)

OUTPUTS = ("auto", "class", "value", "raw", "loss")
#: labels that no loss counts (Hugging Face's and torch's ignore_index)
IGNORE_INDEX = -100
_CACHE: OrderedDict[tuple[str, str], nn.Module] = OrderedDict()
_CACHE_SIZE = 4
_EXTRA = "__nonpersistent__."


class PackedModel:
    """A picklable model: architecture on the meta device + safetensors state (no pickled tensors)."""

    def __init__(self, model: nn.Module) -> None:
        state = dict(model.state_dict())
        persistent = set(state)
        for name, buf in model.named_buffers():
            if name not in persistent:  # buffers that state_dict leaves out still shape outputs
                state[_EXTRA + name] = buf
        self.state = state_to_bytes(state)
        self.skeleton = copy.deepcopy(model).to("meta").eval()
        self.key = hashlib.sha256(self.state + repr(self.skeleton).encode()).hexdigest()

    def load(self, device: torch.device | None = None) -> nn.Module:
        """The model with its weights on ``device`` (the CPU by default), once per Python worker."""
        where = torch.device("cpu") if device is None else device
        cached = _CACHE.get((self.key, str(where)))
        if cached is not None:
            _CACHE.move_to_end((self.key, str(where)))
            return cached
        model = copy.deepcopy(self.skeleton).to_empty(device="cpu")
        state = state_from_bytes(self.state)
        extra = {k[len(_EXTRA) :]: state.pop(k) for k in list(state) if k.startswith(_EXTRA)}
        model.load_state_dict(state)
        for name, value in extra.items():
            owner, _, leaf = name.rpartition(".")
            model.get_submodule(owner).register_buffer(leaf, value, persistent=False)
        model.to(where).eval()
        _CACHE[(self.key, str(where))] = model
        while len(_CACHE) > _CACHE_SIZE:
            _CACHE.popitem(last=False)
        return model


class Inputs:
    """How a batch's feature columns reach the model: one tensor (integer columns as int64 when
    every feature column is integer and one is given, floats otherwise), or, for ``output="loss"``
    with several columns, keyword arguments named by the columns (``labels`` is kept back: it is
    the target, not an input)."""

    def __init__(self, schema: pa.Schema, names: list[str], feature_shape, output: str) -> None:
        probe = ArrowConverter(schema, names, None, feature_shape=feature_shape)
        self.integer = set(names) <= probe.integer and feature_shape is None
        self.keywords = output == "loss" and len(names) > 1
        first = schema.field(names[0]).type
        arrays = (
            pa.types.is_list(first) or pa.types.is_large_list(first) or pa.types.is_fixed_size_list(first)
        )
        if output == "loss" and not (self.integer and arrays):
            raise ConfigError(
                f"output='loss' scores token ids: the feature column(s) {names} must be integer arrays "
                "(input_ids first, optionally attention_mask and labels); got "
                f"{', '.join(str(schema.field(n).type) for n in names)}."
            )
        dict_batches = self.integer and (len(names) == 1 or self.keywords)
        self.converter = (
            ArrowConverter(schema, names, None, dict_batches=True)
            if dict_batches
            else ArrowConverter(schema, names, None, feature_shape=feature_shape)
        )
        self.names = names

    def tensors(self, batch: pa.RecordBatch) -> dict[str, torch.Tensor]:
        """The batch's tensors by column; concatenated columns under the first one's name."""
        converted = self.converter.convert(batch)
        if not self.converter.dict_batches:
            return {self.names[0]: converted[0]}
        return dict(zip(self.names, converted, strict=True))

    def call(self, model: nn.Module, cols: dict[str, torch.Tensor], rows: slice, device) -> Any:
        if not self.keywords:
            return model(cols[self.names[0]][rows].to(device))
        return model(**{n: t[rows].to(device) for n, t in cols.items() if n != "labels"})

    def targets(self, cols: dict[str, torch.Tensor]) -> torch.Tensor:
        """What ``output="loss"`` scores: ``labels``, else the input ids with padding (attention_mask 0) ignored."""
        if "labels" in cols:
            return cols["labels"]
        ids = cols[self.names[0]].clone()
        if "attention_mask" in cols:
            ids[cols["attention_mask"] == 0] = IGNORE_INDEX
        return ids


def _logits(out: Any) -> torch.Tensor:
    """The tensor a model returned: itself, a Hugging Face output's ``logits``, or a tuple's first."""
    if isinstance(out, torch.Tensor):
        return out
    if getattr(out, "logits", None) is not None:
        return out.logits
    if isinstance(out, (tuple, list)) and out and isinstance(out[0], torch.Tensor):
        return out[0]
    raise ConfigError(
        f"the model returned {type(out).__name__}; predict needs a tensor, a tuple starting with one, "
        "or an output with .logits."
    )


def row_losses(logits: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's mean next-token cross entropy (position t predicts target t + 1, targets of
    -100 ignored) and the count of tokens it averages; NaN where a row has none."""
    shifted = targets[:, 1:].to(logits.device)
    ce = F.cross_entropy(
        logits[:, :-1].float().transpose(1, 2), shifted, ignore_index=IGNORE_INDEX, reduction="none"
    )
    tokens = (shifted != IGNORE_INDEX).sum(1)
    loss = ce.double().sum(1) / tokens.clamp(min=1)
    return loss.masked_fill(tokens == 0, float("nan")), tokens


def _check_shape(out: torch.Tensor, output: str, cols: dict[str, torch.Tensor], names: list[str]) -> None:
    """One row's output (on the driver) fits the output kind, with what to use instead."""
    shape = tuple(out.shape)
    lm_like = out.dim() == 3
    if output == "class" and out.dim() != 2:
        hint = " (a language model's logits: use output='loss' or 'raw')" if lm_like else ""
        raise ConfigError(
            f"output='class' needs (rows, classes) scores; the model gives {shape} for one row{hint}."
        )
    if output == "value" and out[0].numel() != 1:
        raise ConfigError(
            f"output='value' needs one number per row; the model gives {shape} for one row: use 'raw' or 'class'."
        )
    if output == "loss" and (not lm_like or out.shape[1] != cols[names[0]].shape[1]):
        raise ConfigError(
            f"output='loss' needs a language model's (rows, positions, vocabulary) logits over "
            f"{names[0]!r}; the model gives {shape} for one row of {tuple(cols[names[0]].shape)}."
        )


def _probe(model: nn.Module, inputs: Inputs, df: Any, output: str) -> str:
    """Run one row on the driver: the output kind for ``"auto"``, and errors here, in one line."""
    sample = df.select(*inputs.names).limit(1).toArrow()
    if sample.num_rows == 0:
        return "raw" if output == "auto" else output
    probe = copy.deepcopy(model).cpu().eval()  # leave the caller's model (mode, device) untouched
    try:
        cols = inputs.tensors(sample.to_batches()[0])
        with torch.no_grad():
            out = _logits(inputs.call(probe, cols, slice(None), "cpu"))
    except (ConfigError, DataError):
        raise
    except Exception as exc:  # the model's own error: one line naming what it was given
        given = (
            ", ".join(f"{n} {t.dtype} {tuple(t.shape)}" for n, t in cols.items())
            if "cols" in locals()
            else ""
        )
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ConfigError(
            f"the model failed on one row ({given}): {type(exc).__name__}: {first}. Check features= and "
            "the model's input (integer columns arrive as int64: cast them to double for a model that takes floats)."
        ) from None
    if output == "auto":
        if out.dim() == 2 and out.shape[1] > 1:
            output = "class"
        elif out.dim() == 1 or (out.dim() == 2 and out.shape[1] == 1):
            output = "value"
        else:
            output = "raw"
    _check_shape(out, output, cols, inputs.names)
    return output


def _check(df: Any, names: list[str], output: str, batch_size: int) -> None:
    if output not in OUTPUTS:
        raise ConfigError(f"output must be one of {', '.join(OUTPUTS)}; got {output!r}.")
    check_int("batch_size", batch_size)
    missing = [c for c in names if c not in df.columns]
    if missing:
        raise ConfigError(
            f"column(s) {missing} not in the DataFrame. Available columns: {', '.join(df.columns)}."
        )


def predict(
    model: nn.Module,
    df: Any,
    *,
    features: str | Sequence[str],
    output_col: str | None = None,
    batch_size: int = 1024,
    feature_shape: Sequence[int] | None = None,
    output: str = "auto",
    probability_col: str | None = None,
    tokens_col: str = "tokens",
):
    """Return ``df`` with the model's predictions in ``output_col``.

    Args:
        model: a trained ``torch.nn.Module`` (run in eval mode, on the task's GPU when Spark
            assigned one, else on CPU).
        df: the Spark DataFrame to score; all its columns are kept.
        features: the feature column(s), as in ``fit`` (scalars, arrays, ML vectors, images).
            One integer column (token ids) reaches the model as int64; with ``output="loss"``
            several columns go in as keyword arguments named by the columns (``input_ids``,
            ``attention_mask``), except ``labels``, the targets.
        output_col: the name of the prediction column (``"prediction"``; ``"loss"`` for ``output="loss"``).
        batch_size: rows per forward pass (Spark's Arrow batches,
            ``spark.sql.execution.arrow.maxRecordsPerBatch``, cap it from above).
        feature_shape: per-row shape the model expects, as in ``fit``.
        output: ``"class"`` (argmax index, ``long``) for classifiers, ``"value"`` (``double``)
            for one output per row, ``"raw"`` (``array<float>``, flattened per row);
            ``"loss"`` for language models: each row's mean next-token cross entropy
            (``double``; labels of -100 ignored; without a ``labels`` column the input ids are
            the targets, padding where ``attention_mask`` is 0 ignored) and its token count in
            ``tokens_col``; ``"auto"`` decides from the model's output on one row of ``df``.
        probability_col: with ``output="class"``, also a softmax probabilities column.
        tokens_col: with ``output="loss"``, the column of each row's token count.

    Examples:
        >>> import torch, sparkdp
        >>> spark = sparkdp.session()
        >>> df = spark.createDataFrame([([0.0, 1.0],), ([2.0, -1.0],)], ["features"])
        >>> scored = sparkdp.predict(torch.nn.Linear(2, 3), df, features="features")
        >>> scored.columns, scored.count()
        (['features', 'prediction'], 2)
    """
    import pyspark.sql.functions as F

    names = [features] if isinstance(features, str) else list(features)
    _check(df, names, output, batch_size)
    inputs = Inputs(df.select(*names).limit(0).toArrow().schema, names, feature_shape, output)
    output = _probe(model, inputs, df, output)
    if probability_col and output != "class":
        raise ConfigError(f"probability_col needs output='class' (a classifier); the output is {output!r}.")
    column = output_col or ("loss" if output == "loss" else "prediction")
    log.info("predict: %s -> %r (%s)", inputs.converter.describe(), column, output)
    packed = PackedModel(model)

    def score(cols: pa.Array) -> pa.Array:  # exactly pa.Array: PySpark infers the UDF kind from these hints
        try:
            batch = pa.RecordBatch.from_struct_array(
                cast(pa.StructArray, cols)
            )  # the argument is F.struct(...)
            return _score(packed, inputs, batch, batch_size, output, bool(probability_col))
        except Exception as exc:  # one line on the driver, not the model's stack (worker_errors.udf_error)
            raise udf_error(exc, "predict") from None

    # the hinted form (no functionType) is PySpark's documented one, but its stubs overload only the others
    udf = F.arrow_udf(score, _return_type(output, bool(probability_col)))  # type: ignore[call-overload]
    scored = udf(F.struct(*[F.col(c) for c in names]))
    split = {"class": ("prediction", probability_col), "loss": ("loss", tokens_col)}.get(output)
    if split is None or split[1] is None:
        return df.withColumn(column, scored)
    tmp = f"__sparkdp_{column}"
    return (
        df.withColumn(tmp, scored)
        .withColumn(column, F.col(f"{tmp}.{split[0]}"))
        .withColumn(split[1], F.col(f"{tmp}.{'probability' if output == 'class' else 'tokens'}"))
        .drop(tmp)
    )


def _return_type(output: str, with_probs: bool) -> str:
    if output == "class":
        return "struct<prediction: long, probability: array<float>>" if with_probs else "long"
    if output == "loss":
        return "struct<loss: double, tokens: long>"
    return "double" if output == "value" else "array<float>"


def _score(
    packed: PackedModel, inputs: Inputs, batch: pa.RecordBatch, batch_size: int, output: str, with_probs: bool
) -> pa.Array:
    """One Arrow batch through the model on the task's device, as the UDF's return type."""
    from ..train.jobs import task_device

    gpus, cpus = task_resources()
    device = task_device(gpus)
    if device.type == "cpu":
        torch.set_num_threads(cpus)
    net = packed.load(device)
    cols = inputs.tensors(batch)
    targets = inputs.targets(cols) if output == "loss" else None
    outs, losses, counts = [], [], []
    with torch.no_grad():
        for i in range(0, batch.num_rows, batch_size):
            out = _logits(inputs.call(net, cols, slice(i, i + batch_size), device))
            if output == "loss":
                loss, tokens = row_losses(out, cast(torch.Tensor, targets)[i : i + batch_size])
                losses.append(loss.cpu())
                counts.append(tokens.cpu())
            else:
                outs.append(out.float().cpu())
    if output == "loss":
        loss_arr = pa.array(torch.cat(losses).numpy() if losses else np.zeros(0), pa.float64())
        count_arr = pa.array(torch.cat(counts).numpy() if counts else np.zeros(0, np.int64), pa.int64())
        return pa.StructArray.from_arrays([loss_arr, count_arr], names=["loss", "tokens"])
    out = torch.cat(outs) if outs else torch.empty(0)
    return _as_arrow(out, output, with_probs)


def _as_arrow(out: torch.Tensor, output: str, with_probs: bool) -> pa.Array:
    if output == "class":
        pred = pa.array(out.argmax(1).numpy().astype(np.int64)) if len(out) else pa.array([], pa.int64())
        if not with_probs:
            return pred
        probs = torch.softmax(out, 1).numpy() if len(out) else np.zeros((0, 1), np.float32)
        prob_arr = pa.FixedSizeListArray.from_arrays(pa.array(probs.reshape(-1)), probs.shape[1])
        return pa.StructArray.from_arrays(
            [pred, prob_arr.cast(pa.list_(pa.float32()))], names=["prediction", "probability"]
        )
    if output == "value":
        return pa.array(out.reshape(len(out)).double().numpy())
    flat = out.reshape(len(out), -1).numpy()
    return pa.FixedSizeListArray.from_arrays(pa.array(flat.reshape(-1)), flat.shape[1]).cast(
        pa.list_(pa.float32())
    )


__all__ = ["IGNORE_INDEX", "OUTPUTS", "PackedModel", "predict", "row_losses"]

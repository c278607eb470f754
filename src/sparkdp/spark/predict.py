"""Batched inference on a DataFrame: ``sparkdp.predict(model, df, features=...)``.

Built on an Arrow UDF (``pyspark.sql.functions.arrow_udf``, the same idea as
``pyspark.ml.functions.predict_batch_udf``): Spark hands each Python worker Arrow
record batches of the feature columns; they go through the same
:class:`~sparkdp.data.arrow.ArrowConverter` as training and through the model in
chunks of ``batch_size`` rows under ``torch.no_grad()``. No row-at-a-time UDF.

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
from torch import nn

from ..config import check_int
from ..data.arrow import ArrowConverter
from ..errors import ConfigError
from ..state import state_from_bytes, state_to_bytes

log = logging.getLogger(__name__)

OUTPUTS = ("auto", "class", "value", "raw")
_CACHE: OrderedDict[str, nn.Module] = OrderedDict()
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

    def load(self) -> nn.Module:
        """The model with its weights, once per Python worker process."""
        cached = _CACHE.get(self.key)
        if cached is not None:
            _CACHE.move_to_end(self.key)
            return cached
        model = copy.deepcopy(self.skeleton).to_empty(device="cpu")
        state = state_from_bytes(self.state)
        extra = {k[len(_EXTRA) :]: state.pop(k) for k in list(state) if k.startswith(_EXTRA)}
        model.load_state_dict(state)
        for name, value in extra.items():
            owner, _, leaf = name.rpartition(".")
            model.get_submodule(owner).register_buffer(leaf, value, persistent=False)
        model.eval()
        _CACHE[self.key] = model
        while len(_CACHE) > _CACHE_SIZE:
            _CACHE.popitem(last=False)
        return model


def _infer_output(model: nn.Module, converter: ArrowConverter, df) -> str:
    sample = df.select(*converter.columns).limit(1).toArrow()
    if sample.num_rows == 0:
        return "raw"
    (x,) = converter.preview(sample.to_batches()[0])
    probe = copy.deepcopy(model).cpu().eval()  # leave the caller's model (mode, device) untouched
    with torch.no_grad():
        out = probe(x)
    if out.dim() == 2 and out.shape[1] > 1:
        return "class"
    if out.dim() == 1 or (out.dim() == 2 and out.shape[1] == 1):
        return "value"
    return "raw"


def _outputs(
    model: nn.Module, converter: ArrowConverter, batch: pa.RecordBatch, batch_size: int
) -> torch.Tensor:
    (x,) = converter.convert(batch)
    with torch.no_grad():
        parts = [model(x[i : i + batch_size]) for i in range(0, len(x), batch_size)]
    return torch.cat(parts) if parts else torch.empty(0)


def predict(
    model: nn.Module,
    df: Any,
    *,
    features: str | Sequence[str],
    output_col: str = "prediction",
    batch_size: int = 1024,
    feature_shape: Sequence[int] | None = None,
    output: str = "auto",
    probability_col: str | None = None,
):
    """Return ``df`` with the model's predictions in ``output_col``.

    Args:
        model: a trained ``torch.nn.Module`` (run in eval mode on CPU).
        df: the Spark DataFrame to score; all its columns are kept.
        features: the feature column(s), as in ``fit`` (scalars, arrays, ML vectors, images).
        output_col: the name of the prediction column.
        batch_size: rows per forward pass (Spark's Arrow batches,
            ``spark.sql.execution.arrow.maxRecordsPerBatch``, cap it from above).
        feature_shape: per-row shape the model expects, as in ``fit``.
        output: ``"class"`` (argmax index, ``long``) for classifiers, ``"value"`` (``double``)
            for one output per row, ``"raw"`` (``array<float>``, flattened per row);
            ``"auto"`` decides from the model's output on one row of ``df``.
        probability_col: with ``output="class"``, also a softmax probabilities column.

    Examples:
        >>> import torch, sparkdp
        >>> spark = sparkdp.session()
        >>> df = spark.createDataFrame([([0.0, 1.0],), ([2.0, -1.0],)], ["features"])
        >>> scored = sparkdp.predict(torch.nn.Linear(2, 3), df, features="features")
        >>> scored.columns, scored.count()
        (['features', 'prediction'], 2)
    """
    import pyspark.sql.functions as F

    if output not in OUTPUTS:
        raise ConfigError(f"output must be one of {', '.join(OUTPUTS)}; got {output!r}.")
    check_int("batch_size", batch_size)
    names = [features] if isinstance(features, str) else list(features)
    missing = [c for c in names if c not in df.columns]
    if missing:
        raise ConfigError(
            f"column(s) {missing} not in the DataFrame. Available columns: {', '.join(df.columns)}."
        )
    schema = df.select(*names).limit(0).toArrow().schema
    converter = ArrowConverter(schema, names, None, feature_shape=feature_shape)
    if output == "auto":
        output = _infer_output(model, converter, df)
    if probability_col and output != "class":
        raise ConfigError(f"probability_col needs output='class' (a classifier); the output is {output!r}.")
    log.info("predict: %s -> %r (%s)", converter.describe(), output_col, output)
    packed = PackedModel(model)
    with_probs = bool(probability_col)
    if output == "class":
        ret = "struct<prediction: long, probability: array<float>>" if with_probs else "long"
    else:
        ret = "double" if output == "value" else "array<float>"

    def score(cols: pa.Array) -> pa.Array:  # exactly pa.Array: PySpark infers the UDF kind from these hints
        from pyspark import TaskContext

        ctx = TaskContext.get()
        torch.set_num_threads(max(1, int(ctx.cpus())) if ctx is not None else 1)
        net = packed.load()
        batch = pa.RecordBatch.from_struct_array(cast(pa.StructArray, cols))  # the argument is F.struct(...)
        out = _outputs(net, converter, batch, batch_size)
        if output == "class":
            pred = pa.array(out.argmax(1).numpy().astype(np.int64))
            if not with_probs:
                return pred
            probs = torch.softmax(out, 1).float().numpy()
            prob_arr = pa.FixedSizeListArray.from_arrays(pa.array(probs.reshape(-1)), probs.shape[1])
            return pa.StructArray.from_arrays(
                [pred, prob_arr.cast(pa.list_(pa.float32()))], names=["prediction", "probability"]
            )
        if output == "value":
            return pa.array(out.reshape(len(out)).double().numpy())
        flat = out.reshape(len(out), -1).float().numpy()
        return pa.FixedSizeListArray.from_arrays(pa.array(flat.reshape(-1)), flat.shape[1]).cast(
            pa.list_(pa.float32())
        )

    # the hinted form (no functionType) is PySpark's documented one, but its stubs overload only the others
    udf = F.arrow_udf(score, ret)  # type: ignore[call-overload]
    scored = udf(F.struct(*[F.col(c) for c in names]))
    if not with_probs:
        return df.withColumn(output_col, scored)
    tmp = f"__sparkdp_{output_col}"
    return (
        df.withColumn(tmp, scored)
        .withColumn(output_col, F.col(f"{tmp}.prediction"))
        .withColumn(probability_col, F.col(f"{tmp}.probability"))
        .drop(tmp)
    )


__all__ = ["OUTPUTS", "PackedModel", "predict"]

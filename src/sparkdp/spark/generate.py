"""Text generation over a DataFrame: ``sparkdp.generate(model_or_dir, df, prompt="prompt")``.

An Arrow UDF (as :mod:`sparkdp.spark.predict`): each Python worker receives Arrow batches of the
prompt column, opens the model once (:class:`~sparkdp.models.hf_package.HFPackage`: the
``save_pretrained`` files and the tokenizer's JSON travel in the closure, never a pickled model)
on the GPU Spark assigned its task, or on the CPU, and generates in batches of ``batch_size``
left-padded prompts of similar length (:mod:`sparkdp.models.generation`). The tasks fork from
a worker daemon that has ``transformers`` imported already (:mod:`sparkdp.spark.worker_preload`),
so a task's start-up is opening the model. The result is ``df`` with one more string column:
each row's completion, without its prompt.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, cast

import pyarrow as pa
import torch

from ..config import GenerationConfig
from ..errors import ConfigError
from ..models.generation import generate_texts
from ..models.hf_package import HFPackage
from .task import task_resources
from .worker_errors import udf_error
from .worker_preload import preloading

log = logging.getLogger(__name__)


def generate(
    model_or_dir: Any,
    df: Any,
    prompt: str = "prompt",
    *,
    max_new_tokens: int = 32,
    do_sample: bool = False,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float = 1.0,
    seed: int = 0,
    seed_col: str | None = None,
    batch_size: int = 16,
    tokenizer: Any = None,
    output_col: str = "generated",
):
    """Return ``df`` with each row's generated continuation of ``df[prompt]`` in ``output_col``.

    Args:
        model_or_dir: a Hugging Face model directory (``save_pretrained``'s: config.json and
            safetensors weights; its tokenizer too unless ``tokenizer`` is given), or an in-memory
            ``transformers`` causal LM with ``tokenizer`` (a PEFT model ships as a copy with its
            adapters merged).
        df: the Spark DataFrame; all its columns are kept.
        prompt: the string column of prompts. A null prompt gives a null completion.
        max_new_tokens: tokens generated after each prompt at most.
        do_sample: sample the next tokens; False: greedy, as Hugging Face's ``generate(do_sample=False)``.
        temperature: divide the logits by this before sampling.
        top_k: sample among the k most likely tokens only; None: all.
        top_p: sample among the most likely tokens whose probabilities add up to top_p.
        seed: the seed of each row's generator (with the row's key, see ``seed_col``).
        batch_size: prompts per generate call on an executor
            (:class:`~sparkdp.config.GenerationConfig` holds the checks of these seven).
        seed_col: with ``do_sample``, the column whose value keys each row's generator (with
            ``seed``); by default the prompt, so equal prompts draw equal text.
        tokenizer: a Hugging Face fast tokenizer, a ``tokenizers.Tokenizer`` or a tokenizer.json path.
        output_col: the name of the completion column (the text after the prompt, up to the
            model's end-of-text token or ``max_new_tokens``).

    Examples:
        >>> scored = sparkdp.generate("out/my-gpt2", spark.read.parquet("prompts"), max_new_tokens=64)  # doctest: +SKIP
    """
    import pyspark.sql.functions as F

    config = GenerationConfig(max_new_tokens, do_sample, temperature, top_k, top_p, seed, batch_size)
    _check_columns(df, prompt, seed_col, output_col)
    package = HFPackage.of(Path(model_or_dir) if isinstance(model_or_dir, str) else model_or_dir, tokenizer)
    log.info("generate: %r -> %r (%s)", prompt, output_col, config)
    key_col = seed_col or prompt

    def complete(cols: pa.Array) -> pa.Array:  # exactly pa.Array: PySpark infers the UDF kind from the hints
        try:
            return _complete(package, config, cast(pa.StructArray, cols))
        except Exception as exc:  # one line on the driver, not the model's stack (worker_errors.udf_error)
            raise udf_error(exc, "generate") from None

    # the hinted form (no functionType) is PySpark's documented one, but its stubs overload only the others
    udf = F.arrow_udf(complete, "string")  # type: ignore[call-overload]
    columns = F.struct(F.col(prompt).alias("prompt"), F.col(key_col).cast("string").alias("key"))
    with preloading(df.sparkSession, "transformers"):  # its tasks fork with transformers imported
        completed = udf(columns)
    return df.withColumn(output_col, completed)


def _check_columns(df: Any, prompt: str, seed_col: str | None, output_col: str) -> None:
    fields = {f.name: f for f in df.schema.fields}
    for name in [prompt] + ([seed_col] if seed_col else []):
        if name not in fields:
            raise ConfigError(
                f"generate: the DataFrame has no column {name!r}; its columns: {', '.join(fields) or 'none'}."
            )
    if fields[prompt].dataType.typeName() != "string":
        raise ConfigError(
            f"generate: the prompt column {prompt!r} holds {fields[prompt].dataType.simpleString()}, "
            "not text; give a string column."
        )
    if output_col in fields:
        raise ConfigError(
            f"generate: the DataFrame already has a column {output_col!r}; name another with output_col=."
        )


def _complete(package: HFPackage, config: GenerationConfig, cols: pa.StructArray) -> pa.Array:
    """One Arrow batch's completions (nulls for null prompts), on the task's device."""
    from ..train.jobs import task_device

    gpus, cpus = task_resources()
    device = task_device(gpus)
    if device.type == "cpu":
        torch.set_num_threads(cpus)
    model, tokenizer = package.load(device)
    prompts = cols.field("prompt").to_pylist()
    keys = cols.field("key").to_pylist()
    rows = [i for i, p in enumerate(prompts) if p is not None]
    texts = generate_texts(
        model, tokenizer, [str(prompts[i]) for i in rows], config, [str(keys[i]) for i in rows]
    )
    out: list[str | None] = [None] * len(prompts)
    for i, text in zip(rows, texts, strict=True):
        out[i] = text
    return pa.array(out, type=pa.string())


__all__ = ["generate"]

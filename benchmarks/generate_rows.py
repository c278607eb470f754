"""Generation throughput in rows/s: ``sparkdp.generate`` on 2 Spark workers vs one process running
Hugging Face's ``generate`` on the same prompts.

A Hugging Face GPT-2 built from a config (``--layers`` layers of width ``--width``, a byte-level BPE
tokenizer of 1,024 tokens trained on the prompts' text, random weights from seed 0: throughput does
not depend on what the weights say) is saved with ``save_pretrained`` to a temporary directory.
``--rows`` prompts of 4 to 40 words each get ``--new-tokens`` greedy tokens, two ways:

  single    one Python process with ``--threads`` torch threads, the way Hugging Face documents it:
            the prompts in their order, in batches left-padded by the Hugging Face tokenizer,
            ``model.generate``. Its batch is its best: each of ``--single-batches`` is timed once on
            the prompts before the repeats and the fastest is used
  sparkdp   ``sparkdp.generate(directory, df, batch_size=--batch)`` on ``local[2]``, the prompts in
            a cached DataFrame of 2 partitions (both ways start from prompts in memory), forced by
            a ``noop`` write; each task opens the model from the shipped files

``--stages`` also times a task's stages outside Spark: children forked from a parent that
imported what generate's worker daemon imports (``sparkdp.spark.daemon``, the ``transformers``
preload) open the model from the package's files, generate one batch, then one partition's share
of the prompts (``--rows`` / 2) at 1 torch thread, as a task on ``local[2]`` does (the model's
own module, ``modeling_gpt2``, is already imported there: about 0.07 s a real task pays). And the
"1 new token" figure is ``sparkdp.generate`` of 1 token per row on the same table (median of
the repeats): the Spark job, the tasks starting, opening the model and the prompts' prefill.

Every greedy token is generated in both (``eos_token_id`` is unset, so no row stops early). Rows/s
is rows over the wall time of the way (sparkdp's includes its Spark job, shipping the files and
opening the model in each task; the single process's model is open before its clock starts). One
warm-up run of each way is not counted (sparkdp's, the session's first generate, is reported as
"first call": it starts the worker daemon that has transformers preloaded), then ``--repeats``
paired runs (single, sparkdp, single, sparkdp, ...); the table gives the medians and the median of
the paired ratios. Target: sparkdp >= 1.5x one process.

Run:  python benchmarks/generate_rows.py --rows 4096 --repeats 3 --batch 64   # docs/benchmarks.md
      python benchmarks/generate_rows.py --rows 1024 --repeats 3 --batch 64
      python benchmarks/generate_rows.py --rows 64 --repeats 1      # a quick check that it works
      python benchmarks/generate_rows.py --rows 1024 --repeats 3 --batch 64 --stages
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import machine_info, markdown_table, median, pass_fail  # noqa: E402

TARGET = 1.5
WORDS = (
    "data spark table model token train worker batch layer query column partition executor driver "
    "memory network gradient update cluster stream schema record value result output input"
).split()


def prompts(rows: int) -> list[str]:
    import numpy as np

    rng = np.random.default_rng(0)
    return [" ".join(rng.choice(WORDS, size=int(rng.integers(4, 41)))) for _ in range(rows)]


def build_model(directory: str, texts: list[str], layers: int, width: int):
    import torch
    import transformers

    from sparkdp.data.text import EOS_TOKEN, train_bpe_tokenizer

    raw = train_bpe_tokenizer(texts, 1024)
    eos = raw.token_to_id(EOS_TOKEN)
    config = transformers.GPT2Config(
        vocab_size=raw.get_vocab_size(), n_positions=256, n_embd=width, n_layer=layers, n_head=4
    )
    # no end-of-text token: every row runs to max_new_tokens in both ways
    config.bos_token_id, config.eos_token_id, config.pad_token_id = eos, None, eos
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(config).eval()
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = eos
    tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_object=raw, pad_token=EOS_TOKEN)
    tokenizer.padding_side = "left"
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return model, tokenizer


def run_single(model, tokenizer, texts: list[str], batch: int, new_tokens: int) -> float:
    import torch

    start = time.perf_counter()
    with torch.no_grad():
        for i in range(0, len(texts), batch):
            enc = tokenizer(texts[i : i + batch], return_tensors="pt", padding=True)
            model.generate(
                input_ids=enc["input_ids"],
                attention_mask=enc["attention_mask"],
                max_new_tokens=new_tokens,
                do_sample=False,
                pad_token_id=tokenizer.pad_token_id,
            )
    return time.perf_counter() - start


def best_single_batch(model, tokenizer, texts: list[str], batches: list[int], new_tokens: int) -> int:
    """The batch at which the single process generates ``texts`` fastest (each timed once)."""
    timed = {b: run_single(model, tokenizer, texts, b, new_tokens) for b in batches}
    print("single process, s per batch size: " + ", ".join(f"{b}: {t:.1f}" for b, t in timed.items()))
    return min(timed, key=lambda b: timed[b])


def prompts_df(spark, texts: list[str]):
    """The prompts as a cached DataFrame of 2 partitions (materialized before any clock starts)."""
    df = spark.createDataFrame([(t,) for t in texts], "prompt string").repartition(2).cache()
    df.count()
    return df


def run_sparkdp(df, directory: str, batch: int, new_tokens: int) -> float:
    import sparkdp

    start = time.perf_counter()
    out = sparkdp.generate(directory, df, max_new_tokens=new_tokens, batch_size=batch)
    out.write.format("noop").mode("overwrite").save()
    return time.perf_counter() - start


def task_stages(directory: str, texts: list[str], batch: int, new_tokens: int, children: int = 2) -> None:
    """Print a task's stages (see the module docstring), timed in ``children`` forked children."""
    import torch

    import sparkdp.spark.daemon  # noqa: F401  (what the worker daemon imports before it forks)
    from sparkdp.config import GenerationConfig
    from sparkdp.models.generation import generate_texts
    from sparkdp.models.hf_package import HFPackage
    from sparkdp.spark.worker_preload import preload

    preload("transformers")
    package = HFPackage.of(directory)  # (on the driver; the children open its files, as tasks do)
    share = texts[: max(1, len(texts) // 2)]
    config = GenerationConfig(new_tokens, batch_size=batch)
    for _ in range(children):
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                torch.set_num_threads(1)
                start = time.perf_counter()
                model, tokenizer = package.load(torch.device("cpu"))
                opened = time.perf_counter()
                generate_texts(model, tokenizer, share[:batch], config, share[:batch])
                first = time.perf_counter()
                generate_texts(model, tokenizer, share, config, share)
                done = time.perf_counter()
                print(
                    f"task stages: open the model {opened - start:.2f} s, its first batch of {batch} "
                    f"{first - opened:.2f} s, then {len(share)} rows {done - first:.2f} s "
                    f"({len(share) / (done - first):.1f} rows/s at 1 thread)",
                    flush=True,
                )
                code = 0
            finally:
                os._exit(code)
        os.waitpid(pid, 0)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=256)
    parser.add_argument("--batch", type=int, default=None, help="sparkdp's batch_size (default: its own)")
    parser.add_argument("--single-batches", default="16,32,64,128,256")
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--stages", action="store_true", help="also time a task's stages outside Spark")
    args = parser.parse_args()

    import torch

    import sparkdp
    from sparkdp.config import GenerationConfig

    batch = args.batch or GenerationConfig().batch_size
    torch.set_num_threads(args.threads)
    threads = torch.get_num_threads()  # what the one process really runs with
    texts = prompts(args.rows)
    with tempfile.TemporaryDirectory(prefix="sparkdp-bench-gen-") as directory:
        model, tokenizer = build_model(directory, texts, args.layers, args.width)
        if args.stages:
            task_stages(directory, texts, batch, args.new_tokens)
        spark = sparkdp.session("local[2]")
        run_single(model, tokenizer, texts[:16], 16, args.new_tokens)  # warm-up
        candidates = [int(b) for b in args.single_batches.split(",")]
        single_batch = best_single_batch(model, tokenizer, texts[:256], candidates, args.new_tokens)
        first_call = run_sparkdp(prompts_df(spark, texts[: 2 * batch]), directory, batch, args.new_tokens)
        df = prompts_df(spark, texts)
        single, spark_s, ratios = [], [], []
        for _ in range(args.repeats):
            single.append(run_single(model, tokenizer, texts, single_batch, args.new_tokens))
            spark_s.append(run_sparkdp(df, directory, batch, args.new_tokens))
            ratios.append(single[-1] / spark_s[-1])
            print(f"single {single[-1]:.1f} s, sparkdp {spark_s[-1]:.1f} s", flush=True)
        fixed = median(run_sparkdp(df, directory, batch, 1) for _ in range(args.repeats))
        spark.stop()
    one, two, gain = median(single), median(spark_s), median(ratios)
    assert one is not None and two is not None and gain is not None
    rows = [
        [
            f"one process, HF generate ({threads} threads, batch {single_batch})",
            args.rows / one,
            one,
            1.0,
        ],
        [f"sparkdp.generate, 2 workers (batch {batch})", args.rows / two, two, gain],
    ]
    print(machine_info())
    print(
        f"{args.rows} prompts, {args.new_tokens} new tokens, GPT-2 {args.layers} x {args.width}, medians "
        f"of {args.repeats} paired repeats; sparkdp's first call (its worker daemon starting): "
        f"{first_call:.1f} s for {2 * batch} rows; 1 new token per row: {fixed:.2f} s"
    )
    print(markdown_table(["way", "rows/s", "wall s", "/ one process"], rows))
    print(f"target >= {TARGET}x: {pass_fail(gain >= TARGET)}")


if __name__ == "__main__":
    main()

"""Train a small GPT on text held in a Spark DataFrame: ``tokenize_blocks`` + ``fit(loss="model")``.

The text is the fortune-cookie corpus of Debian's ``fortunes`` package, one cookie per row
(stand-in for your own table of documents). A byte-level BPE tokenizer is trained on the
training rows; ``sparkdp.spark.text.tokenize_blocks`` tokenizes the column on the executors and
packs it into 128-token blocks of ``input_ids`` and ``labels``. ``fit`` streams those blocks to
the workers; each batch reaches the model as ``model(input_ids=..., labels=...)`` and the
model's own next-token loss is what is minimised. At the end the trained model continues a
prompt, greedily.

Run (every cookie by default; a few minutes on 2 cores):
    python examples/language_model.py
    SPARKDP_EXAMPLE_ROWS=2000 python examples/language_model.py   # a quick smoke run: 2,000 cookies
"""

import os
import sys
import tempfile

import torch

import sparkdp
from sparkdp.data.text import train_bpe_tokenizer
from sparkdp.data.text_datasets import FORTUNES_DIR, read_fortunes, split_documents
from sparkdp.models import build_model
from sparkdp.spark.text import tokenize_blocks

ROWS = int(os.environ.get("SPARKDP_EXAMPLE_ROWS", "0")) or None
BLOCK = 128


@torch.no_grad()
def continue_text(model, tokenizer, prompt: str, tokens: int = 24) -> str:
    ids = torch.tensor([tokenizer.encode(prompt).ids])
    for _ in range(tokens):
        logits = model(ids[:, -BLOCK:]).logits
        ids = torch.cat([ids, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    return tokenizer.decode(ids[0].tolist())


def main() -> None:
    spark = sparkdp.session()  # the embedded local[N] session fit() would start anyway
    train_docs, validation_docs = split_documents(read_fortunes(FORTUNES_DIR)[:ROWS])
    tokenizer = train_bpe_tokenizer(train_docs, vocab_size=2048)  # offline, on the training split only
    train_df = spark.createDataFrame([(d,) for d in train_docs], "text string")
    validation_df = spark.createDataFrame([(d,) for d in validation_docs], "text string")

    # lazy DataFrames of input_ids / labels (array<bigint>), tokenized and packed on the executors
    train_blocks = tokenize_blocks(train_df, "text", tokenizer, block_size=BLOCK)
    with tempfile.TemporaryDirectory() as tmp:
        validation_path = os.path.join(tmp, "validation.parquet")
        tokenize_blocks(validation_df, "text", tokenizer, block_size=BLOCK).write.parquet(validation_path)

        torch.manual_seed(0)
        model = build_model(
            "gpt", vocab_size=tokenizer.get_vocab_size(), block_size=BLOCK, n_layer=2, n_head=4, d_model=128
        )
        result = sparkdp.fit(
            model,
            train_blocks,
            eval_data=validation_path,
            features=["input_ids", "labels"],
            dict_batches=True,
            loss="model",
            optimizer="adamw",
            optimizer_options={"lr": 3e-3},
            workers=2,
            epochs=2,
            batch_size=16,
            show_progress=False,
        )
    first, last = result.history[0]["loss"], result.history[-1]["loss"]
    print(f"trained on {result.samples} blocks of {BLOCK} tokens in {result.train_time_s:.1f} s")
    print("sample:", repr(continue_text(result.model.eval(), tokenizer, "The")))
    print(f"language_model: loss {first:.3f} -> {last:.3f}")
    if not last < first:
        sys.exit(f"language_model: the loss did not fall ({first:.3f} -> {last:.3f}), training is broken")


if __name__ == "__main__":
    main()

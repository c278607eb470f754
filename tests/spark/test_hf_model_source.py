"""``fit(model="hf:DIR")`` on a DataFrame of token blocks with ``loss="model"`` and no label column:
the columns reach the model by name (dict batches inferred), and it learns against Hugging Face's
own loss of the untrained directory."""

from __future__ import annotations

import pytest

import sparkdp
from tests.helpers.hf_dirs import counting_blocks, hf_loss, tiny_gpt2_dir

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.timeout(240)


def test_a_local_hf_model_trains_on_a_dataframe_without_dict_batches_given(spark, tmp_path):
    where = tiny_gpt2_dir(tmp_path / "gpt2")
    blocks = counting_blocks(64)
    df = spark.createDataFrame(
        [(row.tolist(), row.tolist()) for row in blocks], "input_ids array<bigint>, labels array<bigint>"
    )
    result = sparkdp.fit(
        f"hf:{where}",
        df,
        features=["input_ids", "labels"],
        loss="model",
        optimizer="adamw",
        optimizer_options={"lr": 0.01},
        workers=2,
        batch_size=8,
        epochs=3,
        spark=spark,
        show_progress=False,
    )
    assert isinstance(result.model, transformers.GPT2LMHeadModel)
    untrained = hf_loss(transformers.AutoModelForCausalLM.from_pretrained(where), blocks)
    assert hf_loss(result.model, blocks) < untrained - 1.0, (result.history, untrained)

"""The fast sibling of tests/spark/test_hf_gpt2_dataframe.py: the same Hugging Face GPT-2, built
from a config, trained by sparkdp's worker loop in this process (one worker, batch 8,
accumulate 2, bf16-mixed, loss="model" on dict batches of the fortunes slice) against the plain
PyTorch loop of tests/helpers/gpt2_reference.py at 16 blocks a step. Validation losses within 5 %."""

from __future__ import annotations

import pytest
import torch

from sparkdp.comm.single import SingleProcessCollective
from sparkdp.config import TrainingConfig
from sparkdp.data.tensors import DictData
from sparkdp.data.text_datasets import FORTUNES_DIR
from sparkdp.strategies import resolve_strategy
from sparkdp.train.loop import FitSpec, fit_worker
from sparkdp.train.optim import optimizer_factory, resolve_loss
from tests.helpers.gpt2_reference import LR, fortunes_slice, gpt2, single_process, validation_loss

pytest.importorskip("transformers")

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(not FORTUNES_DIR.is_dir(), reason="the Debian package `fortunes` is not installed"),
]

BATCH, ACCUMULATE, EPOCHS, ROWS = 8, 2, 2, 128


@pytest.fixture
def one_thread():
    """One torch thread, as a worker on one Spark task core has (on 2 busy cores more only contend)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_gpt2_from_a_config_trains_in_the_worker_loop_like_one_process(one_thread):
    corpus = fortunes_slice()
    blocks = corpus.train_blocks()[:ROWS]
    model = gpt2(corpus.tokenizer.get_vocab_size())
    reference = single_process(model, blocks, BATCH * ACCUMULATE, EPOCHS)
    initial = validation_loss(model, corpus.validation)

    spec = FitSpec(
        model=model,
        loss=resolve_loss("model"),
        optimizer=optimizer_factory("adamw", model, lr=LR),
        strategy=resolve_strategy("allreduce"),
        train=DictData({"input_ids": blocks, "labels": blocks}),
        eval=None,
        training=TrainingConfig(
            epochs=EPOCHS, batch_size=BATCH, precision="bf16-mixed", accumulate=ACCUMULATE
        ),
    )
    report = fit_worker(spec, SingleProcessCollective())
    assert [h["samples"] for h in report.history] == [ROWS] * EPOCHS

    got, expected = validation_loss(model, corpus.validation), validation_loss(reference, corpus.validation)
    assert expected < initial - 0.5  # the reference learned: not a comparison of two untrained models
    assert abs(got - expected) <= 0.05 * expected, (got, expected, initial)

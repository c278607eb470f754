"""A small Hugging Face GPT-2 built from a config (nothing downloaded), a slice of the fortunes
corpus with the project's own BPE tokenizer, and the independent reference the language-model
tests compare ``fit`` with: a plain PyTorch loop on one process.

The reference takes one AdamW step per ``step_rows`` blocks under the same bfloat16 autocast as
``precision="bf16-mixed"``, so a job of W workers x batch B x accumulate A meets it at
``step_rows = W * B * A``: the same steps of the same number of tokens. Validation loss is the
mean next-token cross entropy of ``torch.nn.functional.cross_entropy``, in float32.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from sparkdp.data.text import EOS_TOKEN, encode_texts, pack_documents, train_bpe_tokenizer
from sparkdp.data.text_datasets import FORTUNES_DIR, read_fortunes, split_documents

VOCAB, BLOCK, LR = 512, 32, 1e-2


@dataclass(frozen=True)
class Slice:
    """The first ``docs`` cookies: training texts, their tokenizer, packed validation blocks."""

    train_texts: tuple[str, ...]
    tokenizer: object
    validation: torch.Tensor

    def train_blocks(self) -> torch.Tensor:
        """The training texts packed in document order (what ``tokenize_blocks`` gives on one partition)."""
        eos = self.tokenizer.token_to_id(EOS_TOKEN)
        return torch.from_numpy(pack_documents(encode_texts(self.tokenizer, self.train_texts), BLOCK, eos))


def fortunes_slice(docs: int = 600) -> Slice:
    train, validation = split_documents(read_fortunes(FORTUNES_DIR)[:docs])
    tokenizer = train_bpe_tokenizer(train, VOCAB)
    eos = tokenizer.token_to_id(EOS_TOKEN)
    return Slice(
        train, tokenizer, torch.from_numpy(pack_documents(encode_texts(tokenizer, validation), BLOCK, eos))
    )


def gpt2(vocab_size: int) -> torch.nn.Module:
    import transformers

    config = transformers.GPT2Config(
        vocab_size=vocab_size,
        n_positions=BLOCK,
        n_embd=64,
        n_layer=2,
        n_head=2,
        resid_pdrop=0.0,  # no dropout: the runs compared differ in data order only
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        bos_token_id=0,  # <|endoftext|>, the project's tokenizers' id 0
        eos_token_id=0,
    )
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(config)


@torch.no_grad()
def validation_loss(model: torch.nn.Module, blocks: torch.Tensor) -> float:
    model = copy.deepcopy(model).eval()
    logits = model(input_ids=blocks).logits.float()
    return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), blocks[:, 1:].reshape(-1)).item()


def single_process(
    model: torch.nn.Module, blocks: torch.Tensor, step_rows: int, epochs: int
) -> torch.nn.Module:
    """A copy of ``model`` trained by the plain loop: every epoch a fresh permutation of the blocks,
    ``len(blocks) // step_rows`` AdamW steps of ``step_rows`` blocks each, bf16 autocast."""
    model = copy.deepcopy(model).train()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as one worker (a Spark task's core); on 2 busy cores more threads only contend
    try:
        torch.manual_seed(1)
        optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
        for _ in range(epochs):
            order = torch.randperm(len(blocks))
            for step in range(len(blocks) // step_rows):
                batch = blocks[order[step * step_rows : (step + 1) * step_rows]]
                optimizer.zero_grad(set_to_none=True)
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    logits = model(input_ids=batch).logits
                loss = F.cross_entropy(
                    logits[:, :-1].float().reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1)
                )
                loss.backward()
                optimizer.step()
    finally:
        torch.set_num_threads(threads)
    return model

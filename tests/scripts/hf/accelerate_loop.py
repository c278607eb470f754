"""An ``accelerate`` training loop, unmodified for sparkdp: ``Accelerator()``, ``prepare``, a few
steps. Usage: accelerate_loop.py TOKENIZER_DIR TEXT_FILE OUT_DIR STEPS"""

import sys

import torch
from accelerate import Accelerator
from common import Blocks, tiny_model, tokenized, write_view
from transformers import PreTrainedTokenizerFast


def main() -> None:
    tokenizer_dir, text, out, steps = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    accelerator = Accelerator(cpu=True)
    tokenizer = PreTrainedTokenizerFast.from_pretrained(tokenizer_dir)
    with accelerator.local_main_process_first():
        ids = tokenized(tokenizer, text, f"{out}/tokens.json")
    model = tiny_model(tokenizer)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loader = torch.utils.data.DataLoader(Blocks(ids), batch_size=2, shuffle=True)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    model.train()
    done = 0
    while done < steps:
        for batch in loader:
            loss = model(**batch).loss
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            done += 1
            if done == steps:
                break
    mean = accelerator.reduce(loss.detach(), reduction="mean").item()
    write_view(
        out,
        hf_local_rank=accelerator.local_process_index,
        hf_world_size=accelerator.num_processes,
        local_zero=accelerator.is_local_main_process,
        world_zero=accelerator.is_main_process,
        steps=done,
        loss=mean,
        distributed=str(accelerator.distributed_type),
    )


if __name__ == "__main__":
    main()

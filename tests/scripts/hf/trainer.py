"""A Hugging Face ``Trainer`` script, unmodified for sparkdp: a causal LM from a config, a local
tokenizer and a local text file. Usage: trainer.py TOKENIZER_DIR TEXT_FILE OUT_DIR STEPS"""

import sys

from common import Blocks, tiny_model, tokenized, write_view
from transformers import PreTrainedTokenizerFast, Trainer, TrainingArguments


def main() -> None:
    tokenizer_dir, text, out, steps = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    args = TrainingArguments(
        output_dir=f"{out}/trainer",
        max_steps=steps,
        per_device_train_batch_size=2,
        learning_rate=1e-3,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
        dataloader_num_workers=0,
        seed=0,
    )
    tokenizer = PreTrainedTokenizerFast.from_pretrained(tokenizer_dir)
    with args.main_process_first(desc="tokenize"):
        ids = tokenized(tokenizer, text, f"{out}/tokens.json")
    trainer = Trainer(model=tiny_model(tokenizer), args=args, train_dataset=Blocks(ids))
    result = trainer.train()
    write_view(
        out,
        hf_local_rank=args.local_process_index,
        hf_world_size=args.world_size,
        local_zero=trainer.is_local_process_zero(),
        world_zero=trainer.is_world_process_zero(),
        steps=result.global_step,
        loss=result.training_loss,
        distributed=str(args.parallel_mode),
    )


if __name__ == "__main__":
    main()

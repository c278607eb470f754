"""``sparkdp export CHECKPOINT_DIR OUT``: a job's newest checkpoint as a Hugging Face directory."""

from __future__ import annotations

from ..export.pretrained import DEFAULT_MAX_SHARD_SIZE


def add_parser(sub) -> None:
    p = sub.add_parser(
        "export",
        help="write a job's newest checkpoint as a Hugging Face model directory",
        description=(
            "Write the newest checkpoint in CHECKPOINT_DIR that reads and verifies (whole or sharded, "
            "as fsdp and hsdp write them) to the new directory OUT, in the format Hugging Face's "
            "from_pretrained opens: the built-in gpt as GPT-2, a Hugging Face model as itself, a "
            "PEFT model as its adapter. No training rank is involved: the driver reads the shards."
        ),
    )
    p.add_argument("checkpoint_dir", metavar="CHECKPOINT_DIR", help="the job's checkpoint_dir")
    p.add_argument("out", metavar="OUT", help="the directory to write; it must not exist or be empty")
    p.add_argument(
        "--tokenizer",
        metavar="PATH",
        help="a tokenizer.json or a Hugging Face tokenizer directory to save beside",
    )
    p.add_argument(
        "--merge-adapters",
        action="store_true",
        help="for a PEFT model: write the base model with the adapters merged in, not the adapter",
    )
    p.add_argument(
        "--hf-config",
        metavar="PATH",
        help="the model's Hugging Face config.json (or its directory), for a checkpoint that does "
        "not record its model",
    )
    p.add_argument(
        "--base",
        metavar="DIR",
        help="for a PEFT model's checkpoint, which holds the adapters only: the local Hugging Face "
        "directory it was fine-tuned from, needed with --merge-adapters",
    )
    p.add_argument(
        "--max-shard-size",
        default=DEFAULT_MAX_SHARD_SIZE,
        help=f"largest weights file before the weights are split (default {DEFAULT_MAX_SHARD_SIZE})",
    )
    p.set_defaults(func=run)


def run(args) -> int:
    from ..export.from_checkpoint import export_checkpoint

    out = export_checkpoint(
        args.checkpoint_dir,
        args.out,
        tokenizer=args.tokenizer,
        merge_adapters=args.merge_adapters,
        hf_config=args.hf_config,
        base=args.base,
        max_shard_size=args.max_shard_size,
    )
    print(f"exported to {out}")
    return 0

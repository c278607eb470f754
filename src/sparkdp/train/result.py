"""What ``fit`` returns."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torch import nn

from ..export.record import model_record
from ..frozen import base_identity, trainable_state
from ..state import save_state


@dataclass
class TrainResult:
    """The trained model and how training went.

    Attributes:
        model: the model passed to ``fit``, now holding the trained parameters.
        history: one dict per epoch (loss, samples, epoch_time_s, and test_loss /
            test_accuracy when evaluation data was given).
        wall_s: seconds of the whole call, Spark start-up included.
        train_time_s: seconds inside the training loops (start-up and evaluation excluded).
        samples_per_s: training rows per second of ``train_time_s``.
    """

    model: nn.Module
    history: list[dict[str, float]]
    strategy: str
    workers: int
    epochs: int
    wall_s: float
    train_time_s: float
    samples: int
    strategy_options: dict[str, Any] = field(default_factory=dict)
    #: strategy-specific figures, e.g. the parameter server's pushes, bytes and staleness histogram
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def samples_per_s(self) -> float:
        return self.samples / self.train_time_s if self.train_time_s > 0 else 0.0

    @property
    def test_accuracy(self) -> float | None:
        return self.history[-1].get("test_accuracy") if self.history else None

    def state_dict(self) -> dict[str, Any]:
        """What training changed: the model's state dict, less a frozen base (LoRA adapters on a
        pretrained model: the adapters and buffers only; ``sparkdp.frozen``)."""
        return trainable_state(self.model, self.model.state_dict())

    def save(self, path: str | Path, **metadata: Any) -> Path:
        """Save the trained state dict (:meth:`state_dict`) as safetensors (atomically), with a
        JSON sidecar; a model with a frozen base records the base it needs
        (:func:`sparkdp.frozen.base_identity`) there.

        Load it back in plain PyTorch with
        ``model.load_state_dict(safetensors.torch.load_file(path))``. The sidecar (``model.json``
        beside ``model.safetensors``) holds the job's strategy, workers and epochs and, under
        ``"model"``, which model the weights belong to: the built-in gpt's constructor arguments,
        or a Hugging Face model's class and ``config.to_dict()`` (null for other models).
        A model with a frozen base saves its adapters only: load them with ``strict=False`` into the
        same base, or with :func:`sparkdp.frozen.load_model_state`, which checks that.
        """
        base = base_identity(self.model)
        return save_state(
            self.state_dict(),
            path,
            {
                "strategy": self.strategy,
                "workers": self.workers,
                "epochs": self.epochs,
                "model": model_record(self.model),
                **({"frozen_base": base} if base else {}),
                **metadata,
            },
        )

    def save_pretrained(
        self,
        path: str | Path,
        tokenizer: Any = None,
        merge_adapters: bool = False,
        max_shard_size: int | str = "5GB",
    ) -> Path:
        """Write the trained model as a new directory that Hugging Face's ``from_pretrained`` opens.

        A Hugging Face model: ``config.json`` and safetensors weights (in files of at most
        ``max_shard_size`` with an index above it). A PEFT model: its adapter
        (``adapter_config.json``, ``adapter_model.safetensors``), or with ``merge_adapters`` the
        base model with the adapters merged in. The built-in ``gpt``: a ``GPT2LMHeadModel``.
        ``tokenizer`` (a ``tokenizers.Tokenizer``, a Hugging Face tokenizer, or the path of
        either) is saved beside it, returning no ``token_type_ids`` unless the model takes them.
        The directory is written under a temporary name and renamed into place.

        Raises:
            ConfigError: ``path`` exists and is not empty, or the model or tokenizer is of no
                kind Hugging Face opens.
        """
        from ..export.pretrained import save_pretrained

        return save_pretrained(
            self.model,
            path,
            tokenizer=tokenizer,
            merge_adapters=merge_adapters,
            max_shard_size=max_shard_size,
        )

    def summary(self) -> dict[str, Any]:
        """What a run's ``summary`` record holds (``sparkdp report`` tabulates it)."""
        restarts = self.details.get("restarts", [])
        return {
            "strategy": self.strategy,
            "workers": self.workers,
            "epochs": self.epochs,
            "test_accuracy": self.test_accuracy,
            "wall_s": self.wall_s,
            "train_time_s": self.train_time_s,
            "samples": self.samples,
            "samples_per_s": self.samples_per_s,
            "history": self.history,
            "restarts": len(restarts),
            "failed_attempts_s": sum(r["attempt_s"] for r in restarts),
            # per worker: peak RSS and peak model-state bytes (train.memory)
            "memory": list(self.details.get("memory", [])),
            # per-step fault tolerance: one record per leave and per join (driver.quorum)
            **({"membership": list(self.details["membership"])} if "membership" in self.details else {}),
        }

"""Hugging Face causal language models shipped to Spark executors as files, never pickled.

:class:`HFPackage` holds what ``save_pretrained`` writes for a model (``config.json``,
``generation_config.json``, the safetensors weights and their index) as bytes, plus the
tokenizer as its ``tokenizers`` JSON. An executor writes the files into a temporary directory
and opens it with ``AutoModelForCausalLM.from_pretrained(local_files_only=True,
use_safetensors=True)``: no pickled ``pytorch_model.bin`` is read and no remote code runs
(design rule 7). Each Python worker keeps the last few models it opened, keyed by a hash of
the files and the device.
"""

from __future__ import annotations

import copy
import hashlib
import tempfile
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..data.text import require_tokenizers, tokenizer_json
from ..errors import ConfigError

#: the files of a ``save_pretrained`` directory that travel; everything else is left behind
_SHIPPED = ("config.json", "generation_config.json", "model.safetensors.index.json")
_CACHE: OrderedDict[tuple[str, str], Any] = OrderedDict()
_CACHE_SIZE = 2


def require_transformers() -> Any:
    try:
        import transformers
    except ImportError as err:  # an optional dependency
        raise ConfigError(
            "generating text needs Hugging Face `transformers`: pip install 'sparkdp[hf]'."
        ) from err
    return transformers


def _model_files(directory: Path) -> dict[str, bytes]:
    """The shipped files of a ``save_pretrained`` directory, checked on the driver."""
    if not (directory / "config.json").is_file():
        raise ConfigError(
            f"{str(directory)!r} is not a Hugging Face model directory (no config.json); give the "
            "directory save_pretrained wrote, or an in-memory model with tokenizer=."
        )
    weights = sorted(p.name for p in directory.glob("*.safetensors"))
    if not weights:
        raise ConfigError(
            f"{str(directory)!r} holds no safetensors weights; sparkdp does not load pickled "
            "pytorch_model.bin files. Re-save the model with save_pretrained (safetensors is its default)."
        )
    names = [n for n in _SHIPPED if (directory / n).is_file()] + weights
    return {name: (directory / name).read_bytes() for name in names}


def _open_tokenizer(source: Any, directory: Path | None) -> str:
    """The tokenizer's JSON: from ``source`` when given, else from the model's directory (through
    AutoTokenizer, whose post-processor may add the model's BOS token)."""
    if source is not None:
        return tokenizer_json(source)
    if directory is None:
        raise ConfigError(
            "an in-memory model needs its tokenizer: pass tokenizer= (a Hugging Face fast tokenizer, "
            "a tokenizers.Tokenizer or a tokenizer.json path)."
        )
    try:
        auto = require_transformers().AutoTokenizer.from_pretrained(str(directory), local_files_only=True)
    except (OSError, ValueError) as err:
        if (directory / "tokenizer.json").is_file():
            return tokenizer_json(directory / "tokenizer.json")
        raise ConfigError(
            f"no tokenizer could be opened from {str(directory)!r} ({err}); pass tokenizer=."
        ) from None
    return tokenizer_json(auto)


def _check_causal_lm(files: dict[str, bytes]) -> None:
    """The config names a causal language model transformers knows (built on the meta device: no weights)."""
    transformers = require_transformers()
    with tempfile.TemporaryDirectory(prefix="sparkdp-hf-") as tmp:
        (Path(tmp) / "config.json").write_bytes(files["config.json"])
        try:
            config = transformers.AutoConfig.from_pretrained(tmp, local_files_only=True)
            with torch.device("meta"):
                transformers.AutoModelForCausalLM.from_config(config)
        except (ValueError, KeyError, OSError) as err:
            first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            raise ConfigError(
                f"the model's config.json is not a causal language model transformers can build: {first}"
            ) from None


def _merged(model: Any) -> Any:
    """A PEFT model's copy with its adapters merged into the base (its own ``save_pretrained``
    writes the adapter alone, which no executor could open without the base); any other model
    as it is."""
    if isinstance(getattr(model, "peft_config", None), dict) and hasattr(model, "merge_and_unload"):
        return copy.deepcopy(model).merge_and_unload()
    return model


@dataclass(frozen=True)
class HFPackage:
    """A causal LM's ``save_pretrained`` files and its tokenizer, as plain bytes and text."""

    files: dict[str, bytes]
    tokenizer_json: str
    key: str

    @classmethod
    def of(cls, model_or_dir: Any, tokenizer: Any = None) -> HFPackage:
        """From a ``save_pretrained`` directory (its tokenizer too, unless ``tokenizer`` is given)
        or an in-memory ``transformers`` model, PEFT-wrapped ones included (then ``tokenizer`` is
        needed)."""
        if isinstance(model_or_dir, (str, Path)):
            directory = Path(model_or_dir)
            if not directory.is_dir():
                raise ConfigError(
                    f"model directory {str(directory)!r} does not exist; give a directory "
                    "save_pretrained wrote, or an in-memory Hugging Face model."
                )
            files = _model_files(directory)
            _check_causal_lm(files)
            tok = _open_tokenizer(tokenizer, directory)
        elif hasattr(model_or_dir, "save_pretrained") and hasattr(model_or_dir, "generate"):
            tok = _open_tokenizer(tokenizer, None)
            with tempfile.TemporaryDirectory(prefix="sparkdp-hf-") as tmp:
                _merged(model_or_dir).save_pretrained(tmp)
                files = _model_files(Path(tmp))
        else:
            raise ConfigError(
                f"generate needs a Hugging Face causal language model (a directory save_pretrained "
                f"wrote, or a transformers model with .generate); got {type(model_or_dir).__name__}."
            )
        digest = hashlib.sha256(tok.encode())
        for name in sorted(files):
            digest.update(name.encode() + b"\0" + files[name])
        return cls(files, tok, digest.hexdigest())

    def load(self, device: torch.device) -> tuple[Any, Any]:
        """``(model, tokenizer)`` on ``device``, opened once per Python worker and device."""
        cached = _CACHE.get((self.key, str(device)))
        if cached is not None:
            _CACHE.move_to_end((self.key, str(device)))
            return cached
        transformers = require_transformers()
        with tempfile.TemporaryDirectory(prefix="sparkdp-hf-") as tmp:
            for name, data in self.files.items():
                (Path(tmp) / name).write_bytes(data)
            model = transformers.AutoModelForCausalLM.from_pretrained(
                tmp, local_files_only=True, use_safetensors=True, trust_remote_code=False
            )
        model.to(device).eval()
        tokenizer = require_tokenizers().Tokenizer.from_str(self.tokenizer_json)
        tokenizer.no_padding()  # generation pads on the left itself; a saved padding rule would pad right
        tokenizer.no_truncation()
        _CACHE[(self.key, str(device))] = (model, tokenizer)
        while len(_CACHE) > _CACHE_SIZE:
            _CACHE.popitem(last=False)
        return model, tokenizer


__all__ = ["HFPackage", "require_transformers"]

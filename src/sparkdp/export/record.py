"""Which model a state dict belongs to, as JSON: written into ``model.json`` beside a saved
result and into every checkpoint, so an export can rebuild the architecture without the
training script.

Three kinds of record (:func:`model_record`):

- ``{"type": "sparkdp-gpt", "arguments": {...}}``: the built-in ``gpt`` and its constructor's
  arguments;
- ``{"type": "transformers", "class": "GPT2LMHeadModel", "config": {...}}``: a Hugging Face
  model, its class and ``config.to_dict()``;
- ``{"type": "peft", "base": <a transformers record>, "adapter": {...}}``: a model wrapped by
  ``peft.get_peft_model``, its base model and its adapter's ``PeftConfig.to_dict()``.

:func:`build_model` makes a fresh model from a record. The record is data read from a file: a
Hugging Face class is looked up by name among ``transformers``' own model classes only (as
``from_pretrained`` does with ``architectures``), and nothing from the record is imported or
run (docs/guide/security.md).
"""

from __future__ import annotations

import json
from typing import Any

from torch import nn

from ..errors import ConfigError
from ..models.gpt import GPT

BUILTIN_GPT = "sparkdp-gpt"
TRANSFORMERS = "transformers"
PEFT = "peft"


def _json_safe(value: dict[str, Any]) -> dict[str, Any]:
    """``value`` through JSON: sets (PEFT's target_modules) become sorted lists, dtypes strings."""

    def plain(obj: Any) -> Any:
        return sorted(obj) if isinstance(obj, (set, frozenset)) else str(obj)

    return dict(json.loads(json.dumps(value, default=plain)))


def _transformers_class(model: nn.Module) -> type | None:
    """The Hugging Face model class ``model`` is (or, wrapped by FSDP2, derives from)."""
    for cls in type(model).__mro__:
        if cls.__module__.startswith("transformers.models."):
            return cls
    return None


def model_record(model: nn.Module) -> dict[str, Any] | None:
    """What rebuilds ``model``'s architecture (module docstring), or None for any other model."""
    if isinstance(model, GPT):
        return {"type": BUILTIN_GPT, "arguments": dict(model.arguments)}
    peft_config = getattr(model, "peft_config", None)
    if isinstance(peft_config, dict) and hasattr(model, "get_base_model"):
        base = model_record(model.get_base_model())  # type: ignore[operator]
        adapter = peft_config.get("default")
        if base is None or adapter is None or len(peft_config) != 1:
            return None  # one adapter named "default" on a Hugging Face base: what export handles
        return {"type": PEFT, "base": base, "adapter": _json_safe(adapter.to_dict())}
    cls = _transformers_class(model)
    config = getattr(model, "config", None)
    if cls is None or config is None or not hasattr(config, "to_dict"):
        return None
    return {"type": TRANSFORMERS, "class": cls.__name__, "config": _json_safe(config.to_dict())}


def build_model(record: dict[str, Any]) -> nn.Module:
    """A freshly initialised model of the architecture ``record`` describes.

    Raises:
        ConfigError: the record is not one :func:`model_record` writes, or names a class
            ``transformers`` does not have.
    """
    kind = record.get("type") if isinstance(record, dict) else None
    if kind == BUILTIN_GPT and isinstance(record.get("arguments"), dict):
        from ..models.gpt import gpt

        return gpt(**record["arguments"])
    if kind == TRANSFORMERS and isinstance(record.get("config"), dict):
        return _build_transformers(str(record.get("class")), record["config"])
    if kind == PEFT and isinstance(record.get("base"), dict) and isinstance(record.get("adapter"), dict):
        import peft

        adapter = peft.PeftConfig.from_peft_type(**record["adapter"])
        return peft.get_peft_model(build_model(record["base"]), adapter)
    raise ConfigError(
        f"the model record {str(record)[:200]!r} is not one sparkdp writes: expected type "
        f"{BUILTIN_GPT!r}, {TRANSFORMERS!r} or {PEFT!r} with its fields. Pass the model's Hugging "
        "Face config instead (--hf-config)."
    )


def _build_transformers(class_name: str, config: dict[str, Any]) -> nn.Module:
    import transformers

    cls = getattr(transformers, class_name, None)
    if not (isinstance(cls, type) and issubclass(cls, transformers.PreTrainedModel)):
        raise ConfigError(
            f"{class_name!r} is not a Hugging Face model class of transformers "
            f"{transformers.__version__}; export needs one of its model classes "
            "(e.g. GPT2LMHeadModel). Upgrade transformers or pass --hf-config."
        )
    settings = {k: v for k, v in config.items() if k not in ("model_type", "transformers_version")}
    model_type = config.get("model_type")
    if not isinstance(model_type, str):
        raise ConfigError("the recorded Hugging Face config has no model_type; pass --hf-config instead.")
    hf_config = transformers.AutoConfig.for_model(model_type, **settings)
    return cls(hf_config)


__all__ = ["BUILTIN_GPT", "PEFT", "TRANSFORMERS", "build_model", "model_record"]

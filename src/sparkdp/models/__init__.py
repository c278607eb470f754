"""Built-in models, chosen by name (``--model``)."""

from .zoo import MODELS, build_model

__all__ = ["MODELS", "build_model"]

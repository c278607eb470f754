"""A few standard models for the built-in image datasets.

``cnn`` is the classic 2-conv network of the TensorFlow tutorial and the
Fashion-MNIST benchmark (conv5x5x32 -> pool -> conv5x5x64 -> pool -> fc1024 -> 10,
3,274,634 parameters for 28x28x1 input); ``cnn-small`` is the 16/32/fc128 variant
used in ENVIRONMENT.md's reference timings. ``gpt`` is a decoder-only transformer language
model (:mod:`sparkdp.models.gpt`): the default 6 layers x 384 wide over an 8192-token
vocabulary and 256-token contexts (13.9M parameters), ``gpt-tiny`` a 2 x 32 one for tests.
"""

from __future__ import annotations

from torch import nn

from ..registry import Registry
from .gpt import gpt

MODELS: Registry[nn.Module] = Registry("model")


def _two_conv(
    c1: int, c2: int, hidden: int, in_channels: int, image_size: int, num_classes: int, dropout: float
) -> nn.Module:
    side = image_size // 4  # two 2x2 poolings after 'same' 5x5 convolutions
    return nn.Sequential(
        nn.Conv2d(in_channels, c1, 5, padding=2),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(c1, c2, 5, padding=2),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(c2 * side * side, hidden),
        nn.ReLU(),
        nn.Dropout(dropout),
        nn.Linear(hidden, num_classes),
    )


@MODELS("cnn", description="2-conv CNN 32/64 + fc1024 (3.27M params on 28x28)")
def cnn(in_channels: int = 1, image_size: int = 28, num_classes: int = 10, dropout: float = 0.0) -> nn.Module:
    return _two_conv(32, 64, 1024, in_channels, image_size, num_classes, dropout)


@MODELS("cnn-small", description="2-conv CNN 16/32 + fc128 (215K params on 28x28)")
def cnn_small(
    in_channels: int = 1, image_size: int = 28, num_classes: int = 10, dropout: float = 0.0
) -> nn.Module:
    return _two_conv(16, 32, 128, in_channels, image_size, num_classes, dropout)


@MODELS("mlp", description="MLP 784-256-10")
def mlp(in_channels: int = 1, image_size: int = 28, num_classes: int = 10, hidden: int = 256) -> nn.Module:
    return nn.Sequential(
        nn.Flatten(),
        nn.Linear(in_channels * image_size * image_size, hidden),
        nn.ReLU(),
        nn.Linear(hidden, num_classes),
    )


@MODELS("linear", description="multinomial logistic regression")
def linear(in_channels: int = 1, image_size: int = 28, num_classes: int = 10) -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(in_channels * image_size * image_size, num_classes))


MODELS.register(
    "gpt", gpt, description="decoder-only transformer LM, 6x384, vocab 8192, block 256 (13.9M params)"
)
MODELS.register(
    "gpt-tiny",
    gpt,
    description="decoder-only transformer LM, 2x32, vocab 256, block 64 (tests)",
    vocab_size=256,
    block_size=64,
    n_layer=2,
    n_head=2,
    d_model=32,
)


def build_model(name: str, **kwargs) -> nn.Module:
    return MODELS.create(name, **kwargs)

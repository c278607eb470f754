"""Load a user's single-machine training script for ``sparkdp train SCRIPT.py``.

The convention: the script defines, at module level, the same objects a
single-machine loop uses —

* ``model``       a ``torch.nn.Module`` (required; or ``make_model()`` returning one)
* ``train_data``  ``(features, labels)`` arrays, a map-style ``Dataset`` or a ``DataLoader``
                  (required unless ``--dataset`` is given)
* ``test_data``   optional, the same kinds, evaluated after every epoch
* ``optimizer``   optional ``torch.optim.Optimizer`` over ``model.parameters()`` (default SGD)
* ``loss_fn``     optional ``(outputs, labels) -> loss`` (or ``loss``; default cross-entropy)
* ``batch_size``, ``epochs``  optional defaults for the flags of the same name

Its own loop goes under ``if __name__ == "__main__":``, which sparkdp does not run,
so ``python SCRIPT.py`` still trains on one machine.
"""

from __future__ import annotations

import runpy
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import nn
from torch.utils.data import DataLoader

from ..errors import ConfigError


@dataclass
class UserScript:
    path: Path
    model: nn.Module
    train_data: Any
    test_data: Any
    optimizer: Any
    loss: Any
    batch_size: int | None
    epochs: int | None


def load_script(path: str | Path) -> UserScript:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"training script {str(path)!r} does not exist.")
    try:
        ns = runpy.run_path(str(path), run_name="__sparkdp__")
    except SyntaxError as exc:
        raise ConfigError(f"{path}:{exc.lineno}: syntax error in the training script: {exc.msg}") from exc
    model = ns.get("model")
    if model is None and callable(ns.get("make_model")):
        model = ns["make_model"]()
    if not isinstance(model, nn.Module):
        raise ConfigError(
            f"{path} must define `model` (a torch.nn.Module) or `make_model()`; "
            f"found {type(model).__name__ if model is not None else 'nothing'}."
        )
    train = ns.get("train_data")
    batch_size = ns.get("batch_size")
    if isinstance(train, DataLoader):
        batch_size = batch_size or train.batch_size
        train = train.dataset
    test = ns.get("test_data")
    if isinstance(test, DataLoader):
        test = test.dataset
    return UserScript(
        path,
        model,
        train,
        test,
        ns.get("optimizer"),
        ns.get("loss_fn", ns.get("loss")),
        batch_size,
        ns.get("epochs"),
    )

"""In-memory data (numpy arrays, tensors, torch Datasets) sharded by rank.

Every rank draws its share of a seeded per-epoch permutation of all rows, like
``torch.utils.data.DistributedSampler``: the permutation is padded by wrapping
around so every rank gets the same number of rows and hence of batches, which
keeps the synchronous collectives in step even when rows % workers != 0.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from ..errors import DataError
from .base import WorkerData
from .shared import MappedTensor, SharedTensorDir


class TensorData(WorkerData):
    """Features and labels held in memory and shipped to the workers.

    Args:
        features: array-like of shape (rows, ...).
        labels: array-like of shape (rows,) or (rows, ...).
        divisor: if given, batches yield ``features.float() / divisor`` — lets 8-bit images
            travel to the workers as uint8 (4x fewer bytes than float32) and become
            floats one batch at a time.
    """

    equal_batches = True
    _handles: tuple[MappedTensor, MappedTensor]  # set on the copies shared() makes only

    def __init__(self, features: Any, labels: Any, *, divisor: float | None = None) -> None:
        self.divisor = divisor
        self.features = _as_tensor(features, "features")
        self.labels = _as_tensor(labels, "labels")
        if self.features.dtype == torch.float64:
            self.features = self.features.float()
        if len(self.features) != len(self.labels):
            raise DataError(
                f"features have {len(self.features)} rows but labels have {len(self.labels)}; "
                "they must have one label per row."
            )
        if len(self.features) == 0:
            raise DataError("the dataset is empty (0 rows); give at least one row per worker.")

    def num_samples(self) -> int:
        return len(self.features)

    def shareable_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.features, self.labels))

    def shared(self, store: SharedTensorDir) -> TensorData:
        """This data written once to ``store``; its pickle then carries file handles, not bytes."""
        copy = TensorData.__new__(TensorData)
        copy.__dict__.update(self.__dict__)
        copy._handles = (store.share(self.features), store.share(self.labels))
        return copy

    def __reduce_ex__(self, protocol):
        handles = self.__dict__.get("_handles")
        if handles is None:
            return super().__reduce_ex__(protocol)
        return _mapped_tensor_data, (handles, self.divisor)

    def shard_indices(
        self, *, rank: int, world_size: int, epoch: int, seed: int, shuffle: bool
    ) -> torch.Tensor:
        return shard_indices(
            len(self.features), rank=rank, world_size=world_size, epoch=epoch, seed=seed, shuffle=shuffle
        )

    def batches(
        self, *, rank: int, world_size: int, epoch: int, batch_size: int, seed: int, shuffle: bool = True
    ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        idx = self.shard_indices(rank=rank, world_size=world_size, epoch=epoch, seed=seed, shuffle=shuffle)
        for start in range(0, len(idx), batch_size):
            take = idx[start : start + batch_size]
            yield self._x(take), self.labels[take]

    def rows_at(self, take: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The rows ``take`` (indices into the whole dataset) as one batch (``train.row_cursor``)."""
        return self._x(take), self.labels[take]

    def _x(self, take: torch.Tensor) -> torch.Tensor:
        x = self.features[take]
        return x.float().div_(self.divisor) if self.divisor is not None else x

    def eval_batches(
        self, *, rank: int, world_size: int, batch_size: int
    ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        # No wrap-around padding here: metrics must count every row exactly once.
        idx = torch.arange(len(self.features))[rank::world_size]
        for start in range(0, len(idx), batch_size):
            take = idx[start : start + batch_size]
            yield self._x(take), self.labels[take]

    def describe(self) -> str:
        return (
            f"{len(self.features)} rows in memory: features {tuple(self.features.shape[1:])} "
            f"{self.features.dtype}, labels {tuple(self.labels.shape[1:])} {self.labels.dtype}"
        )


def shard_indices(
    n: int, *, rank: int, world_size: int, epoch: int, seed: int, shuffle: bool
) -> torch.Tensor:
    """Rank ``rank``'s rows of ``n`` in ``epoch``: a seeded permutation (or storage order), padded by
    wrapping around so every rank holds ``ceil(n / world_size)`` rows."""
    if shuffle:
        gen = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
        order = torch.randperm(n, generator=gen)
    else:
        order = torch.arange(n)
    per_rank = math.ceil(n / world_size)
    total = per_rank * world_size
    if total > n:  # wrap around so all ranks hold the same number of rows
        order = order.repeat(math.ceil(total / n))[:total]
    return order[rank:total:world_size]


class DictData(WorkerData):
    """Named arrays in memory (``{"input_ids": ..., "attention_mask": ..., "labels": ...}``), each
    with one row per example, batched as dicts of tensors: ``(batch_dict, labels or None)``.

    A model that computes its own loss takes such a batch as ``model(**batch)`` (``loss="model"``);
    sharding, shuffling and padding are :class:`TensorData`'s.

    Args:
        columns: a mapping of name -> array/tensor, all with the same first dimension.
        labels: optional labels kept apart from the dict (for a loss ``(outputs, labels)``).
    """

    equal_batches = True
    _handles: dict[str, MappedTensor]  # set on the copies shared() makes only

    def __init__(self, columns: Mapping[str, Any], labels: Any = None) -> None:
        if not columns:
            raise DataError("the data dict is empty; give at least one named array, e.g. {'input_ids': ...}.")
        bad = [k for k in columns if not isinstance(k, str)]
        if bad:
            raise DataError(
                f"the data dict's keys must be strings (the model's argument names); got {bad!r}."
            )
        self.columns = {k: _as_tensor(v, f"data[{k!r}]") for k, v in columns.items()}
        self.columns = {k: v.float() if v.dtype == torch.float64 else v for k, v in self.columns.items()}
        self.labels = None if labels is None else _as_tensor(labels, "labels")
        scalars = [k for k, v in self.columns.items() if not v.dim()]
        if scalars:
            raise DataError(
                f"data[{scalars[0]!r}] is a single value; a data dict maps each name to an array with one "
                "row per example (its first dimension), e.g. {'input_ids': ids of shape (rows, length)}."
            )
        rows = {k: len(v) for k, v in self.columns.items()}
        if self.labels is not None:
            rows["labels="] = len(self.labels)
        if len(set(rows.values())) > 1:
            raise DataError(
                f"the arrays of a data dict must have the same number of rows (first dimension); got "
                f"{rows}. Pad or cut them to one row count."
            )
        if next(iter(rows.values())) == 0:
            raise DataError("the dataset is empty (0 rows); give at least one row per worker.")

    def _tensors(self) -> dict[str, torch.Tensor]:
        return {**self.columns, **({"": self.labels} if self.labels is not None else {})}

    def num_samples(self) -> int:
        return len(next(iter(self.columns.values())))

    def shareable_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self._tensors().values())

    def shared(self, store: SharedTensorDir) -> DictData:
        """This data written once to ``store``; its pickle then carries file handles, not bytes."""
        copy = DictData.__new__(DictData)
        copy.__dict__.update(self.__dict__)
        copy._handles = {k: store.share(t) for k, t in self._tensors().items()}
        return copy

    def __reduce_ex__(self, protocol):
        handles = self.__dict__.get("_handles")
        if handles is None:
            return super().__reduce_ex__(protocol)
        return _mapped_dict_data, (handles,)

    def rows_at(self, take: torch.Tensor) -> tuple[dict[str, torch.Tensor], torch.Tensor | None]:
        """The rows ``take`` (indices into the whole dataset) as one batch (``train.row_cursor``)."""
        return self._batch(take)

    def _batch(self, take: torch.Tensor) -> tuple[dict[str, torch.Tensor], torch.Tensor | None]:
        return (
            {k: v[take] for k, v in self.columns.items()},
            None if self.labels is None else self.labels[take],
        )

    def batches(
        self, *, rank: int, world_size: int, epoch: int, batch_size: int, seed: int, shuffle: bool = True
    ) -> Iterator[Any]:
        idx = shard_indices(
            self.num_samples(), rank=rank, world_size=world_size, epoch=epoch, seed=seed, shuffle=shuffle
        )
        for start in range(0, len(idx), batch_size):
            yield self._batch(idx[start : start + batch_size])

    def eval_batches(self, *, rank: int, world_size: int, batch_size: int) -> Iterator[Any]:
        idx = torch.arange(self.num_samples())[rank::world_size]  # every row once over all ranks
        for start in range(0, len(idx), batch_size):
            yield self._batch(idx[start : start + batch_size])

    def describe(self) -> str:
        parts = ", ".join(
            f"{k} {tuple(v.shape[1:])} {str(v.dtype).replace('torch.', '')}" for k, v in self.columns.items()
        )
        return f"{self.num_samples()} rows in memory as a dict: {parts}" + (
            "" if self.labels is None else f"; labels {tuple(self.labels.shape[1:])} {self.labels.dtype}"
        )


def _mapped_dict_data(handles: dict[str, MappedTensor]) -> DictData:
    """Unpickle a shared :class:`DictData` by mapping its files (see ``data.shared``)."""
    data = DictData.__new__(DictData)
    loaded = {k: h.load() for k, h in handles.items()}
    data.labels = loaded.pop("", None)
    data.columns = loaded
    return data


def _mapped_tensor_data(handles: tuple[MappedTensor, MappedTensor], divisor: float | None) -> TensorData:
    """Unpickle a shared :class:`TensorData` by mapping its files (see ``data.shared``)."""
    data = TensorData.__new__(TensorData)
    data.divisor = divisor
    data.features, data.labels = (h.load() for h in handles)
    return data


def _as_tensor(value: Any, what: str) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if isinstance(value, np.ndarray):
        return torch.from_numpy(np.ascontiguousarray(value))
    try:
        return torch.as_tensor(np.asarray(value))
    except (TypeError, ValueError) as exc:
        raise DataError(
            f"{what} cannot become a tensor ({type(value).__name__}: {exc}); "
            "pass numpy arrays, tensors or a torch Dataset."
        ) from exc


def _from_torch_dataset(ds: Dataset) -> TensorData:
    try:
        n = len(ds)  # type: ignore[arg-type]  # torch's Dataset declares no __len__; map-style ones have it
    except TypeError as exc:
        raise DataError(
            "a torch Dataset must have a length (map-style) to be sharded; "
            "wrap an IterableDataset's output in arrays first."
        ) from exc
    if n == 0:
        raise DataError("the torch Dataset is empty (len 0).")
    xs, ys = zip(*(ds[i] for i in range(n)))
    return TensorData(torch.stack([torch.as_tensor(x) for x in xs]), torch.as_tensor(np.asarray(ys)))


def as_worker_data(data: Any, labels: Any = None) -> WorkerData:
    """Turn what a user passes as data into a :class:`WorkerData`.

    Accepts a WorkerData, a ``(features, labels)`` pair, features plus ``labels=``,
    a map-style torch Dataset of ``(x, y)`` items, or a dict of named arrays (dict batches,
    :class:`DictData`; as ``(dict, labels)`` or with ``labels=`` for labels kept apart).
    """
    if isinstance(data, WorkerData):
        return data
    if isinstance(data, Mapping):
        return DictData(data, labels)
    if isinstance(data, tuple) and len(data) == 2 and isinstance(data[0], Mapping) and labels is None:
        return DictData(*data)
    if labels is not None:
        return TensorData(data, labels)
    if isinstance(data, tuple) and len(data) == 2:
        return TensorData(*data)
    if isinstance(data, Dataset):
        return _from_torch_dataset(data)
    raise DataError(
        f"cannot use {type(data).__name__} as training data. Pass (features, labels) arrays or tensors, "
        "features with labels=..., a dict of named arrays, a map-style torch Dataset of (x, y) pairs, or a "
        "built-in dataset name."
    )

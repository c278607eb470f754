"""Training data as per-worker batch streams; trainers never know where data came from."""

from .base import WorkerData
from .datasets import DATASETS, load_dataset
from .idx import read_idx
from .tensors import TensorData, as_worker_data

__all__ = ["DATASETS", "TensorData", "WorkerData", "as_worker_data", "load_dataset", "read_idx"]

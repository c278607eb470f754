"""Reader for the IDX format of MNIST and Fashion-MNIST (optionally gzip-compressed).

Format (LeCun et al.): 2 zero bytes, a dtype code, the number of dimensions, then
one big-endian uint32 per dimension, then the values in row-major order.
"""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import numpy.typing as npt

from ..errors import DataError

_DTYPES: dict[int, npt.DTypeLike] = {
    0x08: np.uint8,
    0x09: np.int8,
    0x0B: ">i2",
    0x0C: ">i4",
    0x0D: ">f4",
    0x0E: ">f8",
}


def read_idx(path: str | Path) -> np.ndarray:
    """Read an IDX file (``.gz`` or raw) into a numpy array of its stored shape."""
    path = Path(path)
    if not path.exists():
        raise DataError(f"IDX file {str(path)!r} does not exist.")
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as fh:
            raw = fh.read()
    except (OSError, EOFError) as exc:
        raise DataError(f"cannot read IDX file {str(path)!r}: {exc}") from exc
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] not in _DTYPES:
        raise DataError(f"{str(path)!r} is not an IDX file (bad magic {raw[:4].hex()}).")
    ndim = raw[3]
    header_end = 4 + 4 * ndim
    shape = tuple(int(d) for d in np.frombuffer(raw[4:header_end], dtype=">u4"))
    dtype = np.dtype(_DTYPES[raw[2]])
    expected = int(np.prod(shape)) * dtype.itemsize
    if len(raw) - header_end != expected:
        raise DataError(
            f"IDX file {str(path)!r} is truncated or corrupt: header says shape {shape} "
            f"({expected} bytes of data) but it holds {len(raw) - header_end} bytes."
        )
    return np.frombuffer(raw, dtype=dtype, offset=header_end).reshape(shape).astype(dtype.newbyteorder("="))

"""Caffe's ``DataTransformer`` on Datum records: crop, mean (file or values), scale, mirror.

Applied on the workers by :class:`~sparkdp.caffe.sources.DatumDBSource`, in float32 and in
Caffe's order (``Transform(const Datum&, ...)``): an optional crop (random offset in the
TRAIN phase, centre in TEST), ``(pixel - mean) * scale`` with a ``mean_file`` image indexed
at the cropped position (Caffe's ``data_index``) or per-channel ``mean_value``s, then a
random horizontal flip when ``mirror`` is set.  Caffe draws the flip in whichever phase's
layer sets ``mirror`` (it does not look at the phase), and so does this.  The random
numbers come from the generator the caller passes, seeded by (seed, epoch, rank).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ...errors import ConfigError, DataError
from ..spec import LayerSpec
from .backends import resolve_path


def read_mean_file(path: str | os.PathLike[str]) -> np.ndarray:
    """A ``mean_file`` (serialized ``BlobProto``, e.g. ``compute_image_mean``'s output) as C×H×W float32."""
    from ..caffemodel import read_blob_proto

    blob = read_blob_proto(path)
    if blob.ndim < 3 or int(np.prod(blob.shape[:-3], dtype=np.int64)) != 1:
        raise ConfigError(
            f"mean_file {os.fspath(path)!r} holds a blob of shape {blob.shape}; a mean image is 1×C×H×W "
            "(as compute_image_mean writes it)."
        )
    return np.ascontiguousarray(blob.reshape(blob.shape[-3:]), dtype=np.float32)


@dataclass(eq=False)
class DatumTransform:
    """Caffe's ``DataTransformer`` for Datum records (see the module docstring for the order).

    Attributes:
        scale: multiplies ``pixel - mean``.
        mean_values: ``mean_value`` entries (one, or one per channel).
        mean: the ``mean_file`` image, C×H×W of the records' full size.
        crop_size: 0 for no crop.
        mirror: flip each record horizontally with probability 1/2.
        train: TRAIN phase (random crops) or TEST (centre crops).
        color: ``force_color`` (True) / ``force_gray`` (False) for encoded records.
    """

    scale: float = 1.0
    mean_values: tuple[float, ...] = ()
    mean: np.ndarray | None = None
    crop_size: int = 0
    mirror: bool = False
    train: bool = True
    color: bool | None = None
    mean_file: str = ""

    @classmethod
    def from_layer(cls, layer: LayerSpec, phase: str, base_dirs: Sequence[Path] = ()) -> DatumTransform:
        param = layer.sub("transform_param")
        mean_file = str(param.get("mean_file", "") or "")
        means = tuple(float(v) for v in param.getall("mean_value"))
        if mean_file and means:
            raise ConfigError(
                f"{layer.where}: {layer.describe()}: transform_param has both mean_file and mean_value; Caffe "
                "refuses that. Keep one of them."
            )
        force_color, force_gray = bool(param.get("force_color", False)), bool(param.get("force_gray", False))
        if force_color and force_gray:
            raise ConfigError(
                f"{layer.where}: {layer.describe()}: transform_param sets both force_color and force_gray; "
                "Caffe refuses that. Keep one of them."
            )
        crop = int(param.get("crop_size", 0))
        if crop < 0:
            raise ConfigError(f"{layer.where}: {layer.describe()}: crop_size must be >= 0; got {crop}.")
        mean = None
        if mean_file:
            path = resolve_path(
                mean_file,
                base_dirs,
                "transform_param mean_file",
                layer.where,
                "Give the path of the mean image (a .binaryproto from compute_image_mean).",
            )
            mean = read_mean_file(path)
            mean_file = str(path)
        return cls(
            scale=float(param.get("scale", 1.0)),
            mean_values=means,
            mean=mean,
            crop_size=crop,
            mirror=bool(param.get("mirror", False)),
            train=str(phase).upper() == "TRAIN",
            color=True if force_color else False if force_gray else None,
            mean_file=mean_file,
        )

    def output_shape(self, chw: Sequence[int]) -> tuple[int, ...]:
        c, h, w = chw
        return (c, self.crop_size, self.crop_size) if self.crop_size else (c, h, w)

    def check(self, chw: Sequence[int], where: str) -> None:
        """Raise DataError unless records of shape ``chw`` can be transformed (Caffe's CHECKs)."""
        c, h, w = (int(d) for d in chw)
        if self.crop_size and (h < self.crop_size or w < self.crop_size):
            raise DataError(
                f"{where}: records are {c}×{h}×{w} but transform_param crop_size is {self.crop_size}; the crop "
                "must fit in the image. Lower crop_size or store larger images."
            )
        if self.mean is not None and tuple(self.mean.shape) != (c, h, w):
            raise DataError(
                f"{where}: mean_file {self.mean_file!r} is {'×'.join(map(str, self.mean.shape))} but the records "
                f"are {c}×{h}×{w}; Caffe needs the mean image of the records' full (uncropped) size. Recompute "
                "it with compute_image_mean, or use mean_value."
            )
        if self.mean_values and len(self.mean_values) not in (1, c):
            raise DataError(
                f"{where}: transform_param has {len(self.mean_values)} mean_value entries for {c}-channel "
                "records; give 1 or one per channel."
            )

    def describe(self) -> str:
        parts = [f"scale {self.scale:g}"] if self.scale != 1.0 else []
        if self.mean_values:
            parts.append("mean_value " + ",".join(f"{v:g}" for v in self.mean_values))
        if self.mean is not None:
            parts.append(f"mean_file {Path(self.mean_file).name}")
        if self.crop_size:
            parts.append(f"{'random' if self.train else 'centre'} crop {self.crop_size}")
        if self.mirror:
            parts.append("mirror")
        return ", ".join(parts) or "none"

    def __call__(self, x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Transform a batch ``x`` (N×C×H×W uint8 or float) into N×C×h×w float32."""
        n, c, height, width = x.shape
        scale = np.float32(self.scale)
        values = None
        if self.mean_values:
            values = np.asarray(self.mean_values, dtype=np.float32)
            values = values.reshape(-1, 1, 1) if len(values) > 1 else values.reshape(1, 1, 1)
        flips = rng.integers(0, 2, n).astype(bool) if self.mirror else np.zeros(n, dtype=bool)
        cs = self.crop_size
        if not cs:
            out, mean = x.astype(np.float32), self.mean
        else:
            if self.train:
                hoff = rng.integers(0, height - cs + 1, n)
                woff = rng.integers(0, width - cs + 1, n)
            else:
                hoff = np.full(n, (height - cs) // 2)
                woff = np.full(n, (width - cs) // 2)
            crops = [(slice(h, h + cs), slice(w, w + cs)) for h, w in zip(hoff.tolist(), woff.tolist())]
            out = np.empty((n, c, cs, cs), dtype=np.float32)
            for i, (rows, cols) in enumerate(crops):
                out[i] = x[i, :, rows, cols]
            mean = None
            if self.mean is not None:  # indexed at the cropped position, as Caffe's data_index
                mean = np.empty((n, c, cs, cs), dtype=self.mean.dtype)
                for i, (rows, cols) in enumerate(crops):
                    mean[i] = self.mean[:, rows, cols]
        if mean is not None:
            out -= mean
        elif values is not None:
            out -= values
        if flips.any():
            out[flips] = out[flips][..., ::-1]
        out *= scale
        return out

"""Training checkpoints: everything a synchronous job needs to continue where it stopped.

One checkpoint is one file of the job's :class:`~sparkdp.train.checkpoint_store.CheckpointStore`
(series ``ckpt``, named ``ckpt-e{epoch:05d}-s{step:08d}-{job}.safetensors``: ``epoch`` 0-based,
``step`` the optimizer steps done in that epoch, an epoch-end checkpoint is ``e{epoch+1}-s0``)
holding the model, the optimizer and scheduler state, the strategy's state, every rank's RNG
state, the position in the data (epoch, steps done in it) and the history so far. The store
gives it the job's identity, its digest, its atomic write and its rotation; how checkpoints are
kept from other jobs: :func:`sparkdp.driver.recovery.refuse_foreign_checkpoints`,
docs/guide/reliability.md (Checkpoints, One job per directory); what the digest does not guard
against: docs/guide/security.md, Files the job reads.

The directory is a local path (on a cluster: one every executor and the driver can reach) or an
fsspec URL (``s3://...``, ``hdfs://...``); rank 0 writes, in the background
(:class:`~sparkdp.train.checkpoint_store.BackgroundWriter`), the driver reads.

A strategy that shards the state (``fsdp``) writes sharded checkpoints instead
(:mod:`sparkdp.train.sharded_checkpoint`, series ``shards``): every rank its own shards, rank 0
this module's payload without the model as the ``loop-state`` part; :func:`latest_checkpoint`
returns either kind, a sharded one with ``shards`` set and an empty ``model``.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from ..config import CheckpointConfig
from ..errors import ConfigError
from ..frozen import expected_keys
from .checkpoint_manager import CheckpointManager
from .checkpoint_store import (
    LOOP_PART,
    CheckpointStore,
    decode,
    new_job_id,
    parse_name,
    position_key,
    sync_position,
)

FORMAT = 1
SERIES = "ckpt"
#: the layout of a per-step fault-tolerant job's quorum part (``train.step_checkpoint``)
QUORUM_FORMAT = 1
#: sharded checkpoints (``train.sharded_checkpoint``): one directory checkpoint per save
SHARDED_SERIES = "shards"
# LOOP_PART (the store's, where every part name is checked): the part of a sharded checkpoint
# that holds everything but the shards: a one-file checkpoint's bytes (this module's payload
# with no model; the optimizer's parameter groups and scheduler)


@dataclass(frozen=True)
class CheckpointPolicy:
    """Where this job's checkpoints go: its checkpoint settings as resolved for the run
    (``checkpoint_dir`` is the directory they go to: the job's own, the ``resume`` directory or
    a temporary one) and the identity written into every checkpoint; rotation deletes only
    files carrying it, and restarts resume only from them. (The identity is no setting: a new
    job draws one, a resumed job keeps its checkpoints'.)"""

    settings: CheckpointConfig
    job_id: str = field(default_factory=new_job_id)

    def __post_init__(self) -> None:
        if self.settings.checkpoint_dir is None:
            raise ValueError("a checkpoint policy needs the directory its checkpoints go to (checkpoint_dir)")

    @property
    def directory(self) -> str:
        return str(self.settings.checkpoint_dir)

    def manager(self) -> CheckpointManager:
        """The manager that writes, rotates and lists this job's checkpoints."""
        return CheckpointManager.of(self.settings, self.job_id)

    def store(self) -> CheckpointStore:
        return self.manager().store


@dataclass(frozen=True)
class Checkpoint:
    """A loaded checkpoint. ``epoch``/``step``: where training continues (0-based epoch)."""

    path: str
    epoch: int
    step: int
    model: dict[str, torch.Tensor]
    optimizer: bytes
    strategy_state: dict[str, Any]
    rng: list[torch.Tensor]
    history: list[dict[str, float]]
    workers: int
    job_id: str
    epoch_stats: tuple[float, float, float] = (0.0, 0.0, 0.0)
    #: a sharded checkpoint: where its manifest is (the workers load ``model`` and the optimizer's
    #: tensors from its shards; ``model`` is empty and ``optimizer`` holds the rest); "" otherwise
    shards: str = ""
    #: which model the weights belong to (:func:`sparkdp.export.record.model_record`); None when
    #: the model is of no kind sparkdp can rebuild, or the checkpoint predates the record
    model_record: dict[str, Any] | None = None
    #: a per-step fault-tolerant job's row cursor and worker state (``train.step_checkpoint``):
    #: ``format``, ``step``, ``cursor`` (plain values) and ``state`` (sparkdp state bytes as a
    #: uint8 tensor); None in a restart-mode job's checkpoint
    quorum: dict[str, Any] | None = None


def _reader(directory: str | os.PathLike[str], settings: CheckpointConfig | None) -> CheckpointStore:
    """The store of ``directory`` as a reader sees it: every job's checkpoints, none written."""
    return CheckpointManager.reader(
        os.fspath(directory), settings.checkpoint_storage_options if settings else None
    ).store


def check_writable(directory: str | os.PathLike[str], settings: CheckpointConfig | None = None) -> None:
    """Fail at the start of a job, not after an hour of training, if nothing can be saved there."""
    _reader(directory, settings).check_writable()


def checkpoint_names(
    directory: str | os.PathLike[str], settings: CheckpointConfig | None = None
) -> list[str]:
    """The synchronous checkpoints in ``directory`` (every job's), oldest first."""
    return _reader(directory, settings).names(SERIES)


def save_checkpoint(
    policy: CheckpointPolicy,
    *,
    epoch: int,
    step: int,
    model: dict[str, torch.Tensor],
    optimizer: bytes,
    strategy_state: dict[str, Any],
    rng: list[torch.Tensor],
    history: list[dict[str, float]],
    workers: int,
    epoch_stats: tuple[float, float, float] = (0.0, 0.0, 0.0),
    model_record: dict[str, Any] | None = None,
) -> str:
    """Write one checkpoint atomically, then delete this job's older ones beyond ``keep_checkpoints``;
    returns where it is."""
    payload = checkpoint_payload(
        epoch=epoch,
        step=step,
        model=model,
        optimizer=optimizer,
        strategy_state=strategy_state,
        rng=rng,
        history=history,
        workers=workers,
        epoch_stats=epoch_stats,
        model_record=model_record,
    )
    return policy.manager().save(SERIES, sync_position(epoch, step), payload)


def checkpoint_payload(
    *,
    epoch: int,
    step: int,
    model: dict[str, torch.Tensor],
    optimizer: bytes,
    strategy_state: dict[str, Any],
    rng: list[torch.Tensor],
    history: list[dict[str, float]],
    workers: int,
    epoch_stats: tuple[float, float, float] = (0.0, 0.0, 0.0),
    model_record: dict[str, Any] | None = None,
    quorum: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """What a checkpoint holds, as nested state (a sharded checkpoint's loop-state part: no model).
    ``model_record`` travels as one JSON string, so no key of a model's config can collide with
    the nesting's own markers. ``quorum``: a per-step fault-tolerant job's cursor and state."""
    payload = {
        "format": FORMAT,
        "epoch": epoch,
        "step": step,
        "model": dict(model),
        "optimizer": torch.frombuffer(bytearray(optimizer), dtype=torch.uint8)
        if optimizer
        else torch.zeros(0, dtype=torch.uint8),
        "strategy_state": strategy_state,
        "rng": list(rng),
        "history": history,
        "workers": workers,
        "epoch_stats": list(epoch_stats),
        "model_record": json.dumps(model_record) if model_record is not None else "",
    }
    return payload if quorum is None else {**payload, "quorum": quorum}


def load_checkpoint(directory: str, name: str, settings: CheckpointConfig | None = None) -> Checkpoint:
    """Read and verify one checkpoint; ``ValueError`` if it is truncated, altered or not one."""
    store = _reader(directory, settings)
    parsed = parse_name(name)
    if parsed is None or parsed.series != SERIES:
        raise ValueError(f"{name!r} is not a synchronous checkpoint's name")
    return _checkpoint_from(store.url(name), store.load(name), parsed.job_id)


def parse_checkpoint(data: bytes, path: str) -> Checkpoint:
    """Verify and decode a checkpoint file's bytes (``path``: where they came from, for messages);
    ``ValueError`` for anything that is not an intact checkpoint."""
    job, series, payload = decode(data)
    if series != SERIES:
        raise ValueError(f"it is a {series!r} checkpoint, not a synchronous one")
    return _checkpoint_from(path, payload, job)


def _checkpoint_from(path: str, obj: Any, job_id: str) -> Checkpoint:
    """The verified file's contents as a Checkpoint, checking every field's type on the way."""
    try:
        return _fields(path, obj, job_id)
    except ValueError:
        raise
    except Exception as exc:  # contents that decode but are not a checkpoint's: damaged, like a bad digest
        raise ValueError(f"its contents are not a checkpoint's ({type(exc).__name__}: {exc})") from exc


def _fields(path: str, obj: Any, job_id: str) -> Checkpoint:
    if not isinstance(obj, dict):
        raise ValueError("its contents are not a checkpoint's (not a mapping)")
    if obj.get("format") != FORMAT:
        raise ValueError(f"checkpoint format {obj.get('format')!r}; this sparkdp reads format {FORMAT}")
    ints: dict[str, Any] = {k: obj.get(k) for k in ("epoch", "step", "workers")}  # checked on the next line
    bad = [k for k, v in ints.items() if isinstance(v, bool) or not isinstance(v, int) or v < 0]
    model, optimizer, stats = obj.get("model"), obj.get("optimizer"), obj.get("epoch_stats")
    if (
        bad
        or not (isinstance(model, dict) and all(isinstance(v, torch.Tensor) for v in model.values()))
        or not isinstance(optimizer, torch.Tensor)
        or not isinstance(obj.get("strategy_state"), dict)
        or not isinstance(obj.get("rng"), list)
        or not all(isinstance(r, torch.Tensor) for r in obj["rng"])
        or not isinstance(obj.get("history"), list)
        or not isinstance(stats, list)
        or len(stats) != 3
        or not all(isinstance(x, (int, float)) for x in stats)
    ):
        raise ValueError(
            "its contents are not a checkpoint's (a field is missing or of the wrong type"
            f"{': ' + ', '.join(bad) if bad else ''})"
        )
    return Checkpoint(
        path=path,
        epoch=ints["epoch"],
        step=ints["step"],
        model=model,
        optimizer=optimizer.numpy().tobytes(),
        strategy_state=obj["strategy_state"],
        rng=list(obj["rng"]),
        history=list(obj["history"]),
        workers=ints["workers"],
        job_id=job_id,
        epoch_stats=(float(stats[0]), float(stats[1]), float(stats[2])),
        model_record=_record(obj.get("model_record", "")),
        quorum=_quorum(obj.get("quorum")),
    )


def _record(text: Any) -> dict[str, Any] | None:
    """The model record a checkpoint carries ("" or absent: none; older checkpoints lack it)."""
    if text in ("", None):
        return None
    if not isinstance(text, str):
        raise ValueError("its model record is not a JSON string")
    try:
        record = json.loads(text)
    except json.JSONDecodeError as err:
        raise ValueError(f"its model record is not JSON ({err})") from None
    if not isinstance(record, dict):
        raise ValueError("its model record is not a JSON object")
    return record


def _quorum(part: Any) -> dict[str, Any] | None:
    """A checkpoint's quorum part, checked (None: a restart-mode job's checkpoint)."""
    if part is None:
        return None
    cursor = part.get("cursor") if isinstance(part, dict) else None
    ints = ("epoch", "rows", "data_rows", "seed", "global_batch", "lanes")
    if (
        not isinstance(cursor, dict)
        or part.get("format") != QUORUM_FORMAT
        or not isinstance(part.get("state"), torch.Tensor)
        or not all(type(cursor.get(k)) is int and cursor[k] >= 0 for k in ints)
        or type(cursor.get("shuffle")) is not bool
        or not isinstance(cursor.get("order"), str)
    ):
        raise ValueError("its quorum part (a per-step fault-tolerant job's cursor and state) is malformed")
    return part


def latest_checkpoint(
    directory: str | os.PathLike[str], job_id: str | None = None, settings: CheckpointConfig | None = None
) -> Checkpoint | None:
    """The newest checkpoint that reads and verifies (of job ``job_id`` only, when given; another
    job's is never resumed: a restart would train that job's weights), whole (``ckpt``) or
    sharded (``shards``); damaged newer ones are skipped with a warning."""
    store = _reader(directory, settings)
    whole = store.latest(
        SERIES,
        job_id,
        lambda name, payload: _checkpoint_from(store.url(name), payload, parse_name(name).job_id),  # type: ignore[union-attr]
    )
    sharded = store.latest(SHARDED_SERIES, job_id, lambda name, manifest: _sharded(store, name, manifest))
    found = [c for c in (whole, sharded) if c is not None]
    # one job writes one kind; of two, the later position (names sort by it within a series)
    return max(found, key=lambda c: position_key(parse_name(c[0]).position))[1] if found else None  # type: ignore[union-attr]


def _sharded(store: CheckpointStore, name: str, manifest: dict[str, Any]) -> Checkpoint:
    """A sharded checkpoint as the driver sees it: its loop-state part (checked against the
    manifest and its own digest); the shards stay where they are, for the workers."""
    job, series, payload = decode(store.read_part(name, LOOP_PART, manifest))
    if (job, series) != (manifest["job_id"], SHARDED_SERIES):
        raise ValueError(f"its loop state is job {job!r}'s {series!r} checkpoint, not what its name says")
    return replace(_checkpoint_from(store.url(name), payload, job), shards=store.url(name))


def check_compatible(model: torch.nn.Module, checkpoint: Checkpoint) -> None:
    """The checkpoint's weights fit ``model``: same names, same shapes (else say which differ)."""
    keys = expected_keys(model, checkpoint.model)  # a frozen base is not saved (sparkdp.frozen)
    want = {k: tuple(v.shape) for k, v in model.state_dict().items() if k in keys}
    have = {k: tuple(v.shape) for k, v in checkpoint.model.items()}
    if want == have:
        return
    problems = (
        [f"missing in the checkpoint: {', '.join(sorted(want.keys() - have.keys())[:5])}"]
        if want.keys() - have.keys()
        else []
    )
    if have.keys() - want.keys():
        problems.append(f"not in the model: {', '.join(sorted(have.keys() - want.keys())[:5])}")
    shapes = [
        f"{k} {have[k]} vs the model's {want[k]}"
        for k in sorted(want.keys() & have.keys())
        if want[k] != have[k]
    ]
    if shapes:
        problems.append(f"different shapes: {'; '.join(shapes[:5])}")
    raise ConfigError(
        f"the checkpoint {checkpoint.path} was written for another model ({'; '.join(problems)}). "
        "Resume with the model it was saved from, or point resume at another directory."
    )


__all__ = [
    "LOOP_PART",
    "SERIES",
    "SHARDED_SERIES",
    "Checkpoint",
    "CheckpointPolicy",
    "check_compatible",
    "check_writable",
    "checkpoint_payload",
    "checkpoint_names",
    "latest_checkpoint",
    "load_checkpoint",
    "new_job_id",
    "parse_checkpoint",
    "save_checkpoint",
]

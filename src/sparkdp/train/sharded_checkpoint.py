"""Sharded checkpoints: every rank writes its own shard of the model and optimizer state.

A strategy that shards the state (``fsdp``) would otherwise gather the whole model and
optimizer state to rank 0 for every checkpoint. Here each rank writes only what it holds, with
``torch.distributed.checkpoint`` (DCP), into ONE directory checkpoint of the job's
:class:`~sparkdp.train.checkpoint_store.CheckpointStore` (series ``shards``, named
``shards-e{epoch:05d}-s{step:08d}-{job}``: the store's job identity, SHA-256 per part, rotation)::

    shards-e00001-s00000020-{job}/
        shard-00001-model-00001-of-00001.safetensors   rank 0's shards (and the replicated tensors)
        shard-00002-model-00001-of-00001.safetensors   rank 1's shards ...
        loop-state                                     position, history, RNG states, optimizer
                                                       parameter groups, scheduler (a one-file
                                                       checkpoint's bytes, rank 0's)
    shards-e00001-s00000020-{job}.manifest.json        every part's SHA-256: the commit, written last

The shard files are DCP's safetensors format (``HuggingFaceStorageWriter`` with one file per
rank): tensors as safetensors, and in the header's JSON each tensor's offset in the whole
tensor. DCP's default ``.metadata`` file is a pickle; this format has none, and the reader
(``HuggingFaceStorageReader``) builds DCP's metadata from the safetensors headers, so nothing is
unpickled on resume (docs/guide/security.md).

Each rank copies its shards to host memory on the training thread (DCP's stager), then writes
them on a background thread without any collective (``no_dist``: each rank plans its own file;
replicated tensors go into rank 0's file only). The commit needs every rank's file: after a save
each step all-reduces the ranks' "written" flags and SHA-256s until all are in; then rank 0
writes the manifest. A crash before that leaves no manifest, so ``latest`` never picks the
half-written directory; the next save at that position, or rotation, removes it.

Resume loads on ANY number of ranks: each rank reads every shard file (checked against the
manifest) and DCP copies the pieces that overlap its new shards (resharding). The manifest's part
names are checked against the two the format defines (``loop-state``, ``shard-NNNNN-...``) on
every read, so a crafted manifest cannot make a rank write outside its temporary directory.
"""

from __future__ import annotations

import logging
import tempfile
import warnings
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from ..comm.base import Collective
from ..errors import ConfigError
from .checkpoint import LOOP_PART, SHARDED_SERIES, CheckpointPolicy
from .checkpoint_manager import CheckpointManager
from .checkpoint_store import BackgroundWriter, CheckpointStore, encode, host_copy, parse_name, sync_position

if TYPE_CHECKING:
    from ..strategies.base import Strategy

log = logging.getLogger(__name__)

# every rank plans and writes its own file without collectives (no_dist), which DCP warns about
warnings.filterwarnings("ignore", message=r"torch\.distributed is (disabled, )?unavailable or uninitialized")

_SHA_BYTES = 32


def shard_part(rank: int) -> str:
    """The file rank ``rank`` writes (DCP's name for shard ``rank + 1`` of one file each)."""
    from torch.distributed.checkpoint._hf_utils import _gen_file_name

    return _gen_file_name(1, 1, rank + 1)


def split_tensors(tree: Any) -> tuple[Any, Any]:
    """``tree`` (nested dicts) as (its tensors, everything else), both with the same nesting;
    DCP gets the tensors, the loop's state part the rest (None values, flags)."""
    if not isinstance(tree, dict):
        raise TypeError("expected a dict")
    tensors: dict[Any, Any] = {}
    rest: dict[Any, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            tensors[key], rest[key] = split_tensors(value)
        elif isinstance(value, torch.Tensor):
            tensors[key] = value
        else:
            rest[key] = value
    return tensors, rest


def merge(tensors: Any, rest: Any) -> Any:
    """Undo :func:`split_tensors`."""
    out = dict(tensors)
    for key, value in rest.items():
        out[key] = merge(out.get(key, {}), value) if isinstance(value, dict) else value
    return out


def aliases(model: torch.nn.Module) -> dict[str, str]:
    """Names under which ``model`` holds a parameter or buffer it already holds under an earlier
    name (tied weights, e.g. a language model's head and embedding) -> that earlier name: the
    tensor is written once, under its first name, and loaded back into both. Read from the
    module, not from a state dict (whose tensors are fresh views), so every rank agrees."""
    first: dict[int, str] = {}
    out: dict[str, str] = {}
    named = [*model.named_parameters(remove_duplicate=False), *model.named_buffers(remove_duplicate=False)]
    for name, value in named:
        if id(value) in first:
            out[name] = first[id(value)]
        else:
            first[id(value)] = name
    return out


def _own(tree: dict[str, Any], rank: int) -> dict[str, Any]:
    """What this rank writes: its DTensor shards (on a mesh that also replicates them, the first
    replica's only); tensors every rank holds whole (not DTensors) on rank 0 only."""
    from torch.distributed.tensor import DTensor, Replicate

    out: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out[key] = _own(value, rank)
        elif isinstance(value, DTensor):
            where = list(value.device_mesh.get_coordinate() or ())
            if all(c == 0 for c, p in zip(where, value.placements) if isinstance(p, Replicate)):
                out[key] = value
        elif rank == 0:
            out[key] = value
    return out


def _rank_writer(path: str, rank: int) -> Any:
    from torch.distributed.checkpoint.hf_storage import HuggingFaceStorageWriter

    class RankWriter(HuggingFaceStorageWriter):
        """DCP's safetensors writer, one file per rank, planned by each rank alone."""

        def prepare_global_plan(self, plans: list[Any]) -> list[Any]:
            return [replace(plan, storage_data={"shard_index": rank + 1}) for plan in plans]

    return RankWriter(path, save_distributed=True)


class ShardedSaver:
    """Every rank's side of the job's sharded checkpoints (the training loop's saver uses it
    when the strategy :meth:`~sparkdp.strategies.base.Strategy.saves_shards`)."""

    def __init__(self, policy: CheckpointPolicy, collective: Collective) -> None:
        self.store: CheckpointStore = policy.store()
        self.collective = collective
        self.writer = BackgroundWriter("sparkdp-shard-writer")
        self._stager: Any = None
        self._pending: str | None = None  # the position written but not yet committed
        self._written: dict[str, str] = {}  # this rank's parts of it -> SHA-256

    def save(
        self, epoch: int, step: int, model: torch.nn.Module, state: dict[str, Any], loop: dict[str, Any]
    ) -> None:
        """Every rank: stage ``state`` (:meth:`Strategy.sharded_state`'s tensors for ``model``,
        the module it came from) and write it in the background; rank 0 adds ``loop`` (:func:`~sparkdp.train.checkpoint.checkpoint_payload`,
        no model) as the loop-state part. The previous save is committed first."""
        rank, position = self.collective.rank, sync_position(epoch, step)
        self.writer.wait()  # this rank's previous write is done (its error raised here)
        if rank == 0:  # a write of this position that never committed (a failed attempt) goes first
            self.store.discard(SHARDED_SERIES, position)
        parts = self._exchange(done=True)  # also: no rank writes before rank 0 discarded
        previous = self._pending
        if self._stager is None:
            from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

            cuda = torch.cuda.is_available()
            self._stager = DefaultStager(StagingOptions(cuda, False, False, cuda))
        tied = {k: v for k, v in aliases(model).items() if v in state["model"]}
        weights = {k: v for k, v in state["model"].items() if k not in tied}
        staged = self._stager.stage(_own({**state, "model": weights}, rank))
        loop_bytes = encode(host_copy(loop), self.store.job_id, SHARDED_SERIES) if rank == 0 else None
        self._pending = position

        def write() -> None:
            if previous is not None and parts is not None and rank == 0:
                self._commit(previous, parts)
            self._written = self._write(position, staged, loop_bytes)

        self.writer.submit(write)

    def poll(self) -> None:
        """Every rank, between steps: once every rank's write is in, rank 0 commits it."""
        if self._pending is None:
            return
        done = not self.writer.busy
        if done:
            self.writer.wait()  # raises this rank's failed write
        parts = self._exchange(done)
        if parts is not None:
            position, self._pending = self._pending, None
            if self.collective.rank == 0:
                self.writer.submit(lambda: self._commit(position, parts))

    def close(self) -> None:
        """Every rank, at the end: wait for the last write and commit it."""
        self.writer.wait()
        if self._pending is None:
            return
        parts = self._exchange(done=True)
        position, self._pending = self._pending, None
        if self.collective.rank == 0 and parts is not None:
            self._commit(position, parts)

    # -- inside ---------------------------------------------------------------------------------

    def _write(self, position: str, staged: dict[str, Any], loop_bytes: bytes | None) -> dict[str, str]:
        import torch.distributed.checkpoint as dcp

        rank = self.collective.rank
        target = self.store.directory_writer(SHARDED_SERIES, position)
        with tempfile.TemporaryDirectory(prefix="sparkdp-shards-") as tmp:
            dcp.save(staged, storage_writer=_rank_writer(tmp, rank), no_dist=True)
            for file in sorted(Path(tmp).iterdir()):  # one file, or none for a rank holding nothing
                if file.name != shard_part(rank):
                    raise RuntimeError(f"DCP wrote {file.name!r} where sparkdp expects {shard_part(rank)!r}")
                target.write(file.name, file.read_bytes())
        if loop_bytes is not None:
            target.write(LOOP_PART, loop_bytes)
        return dict(target.parts)

    def _exchange(self, done: bool) -> dict[str, str] | None:
        """Every rank's written parts (part -> SHA-256) once every rank is ``done``, else None:
        one SUM all-reduce of a row per rank (done, then up to two SHA-256s as bytes)."""
        coll = self.collective
        rows = torch.zeros(coll.world_size, 1 + 2 * (1 + _SHA_BYTES), dtype=torch.float64)
        if done:
            rows[coll.rank, 0] = 1.0
            mine = [(shard_part(coll.rank), 1), (LOOP_PART, 2)]
            for part, slot in mine:
                sha = self._written.get(part)
                if sha is not None:
                    lo = 1 + (slot - 1) * (1 + _SHA_BYTES)
                    rows[coll.rank, lo] = 1.0
                    rows[coll.rank, lo + 1 : lo + 1 + _SHA_BYTES] = torch.tensor(list(bytes.fromhex(sha)))
        coll.all_reduce(rows, "sum")
        if int(rows[:, 0].sum()) != coll.world_size:
            return None
        parts: dict[str, str] = {}
        for rank in range(coll.world_size):
            for part, slot in ((shard_part(rank), 1), (LOOP_PART, 2)):
                lo = 1 + (slot - 1) * (1 + _SHA_BYTES)
                if rows[rank, lo] > 0:
                    parts[part] = bytes(
                        rows[rank, lo + 1 : lo + 1 + _SHA_BYTES].to(torch.uint8).tolist()
                    ).hex()
        return parts

    def _commit(self, position: str, parts: dict[str, str]) -> None:
        name = self.store.commit_directory(SHARDED_SERIES, position, parts)
        log.info("checkpoint %s (%d parts)", self.store.url(name), len(parts))


def copy_parts(store: CheckpointStore, name: str, manifest: Mapping[str, Any], into: str) -> None:
    """Every rank's part of the sharded checkpoint ``name`` into the directory ``into``, each
    checked against the manifest's SHA-256 as it is read.

    The store refuses a manifest whose part names are not the format's own; the resolved path is
    checked here again, so that no name, whatever reads it, places a file outside ``into``
    (docs/guide/security.md)."""
    root = Path(into).resolve()
    for part in manifest["parts"]:
        if part == LOOP_PART:
            continue
        path = (root / part).resolve()
        if path.parent != root:
            raise ValueError(f"the part name {part!r} of {name} leaves the checkpoint; refused")
        path.write_bytes(store.read_part(name, part, manifest))


def restore(
    location: str,
    strategy: Strategy,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    saved_optimizer: dict[str, Any],
    storage_options: dict[str, Any] | None = None,
) -> None:
    """Every rank: load the sharded checkpoint at ``location`` (its manifest's URL) into
    ``model`` and ``optimizer`` as this rank now shards them; ``saved_optimizer``: the loop-state
    part's optimizer state (parameter groups and non-tensor entries)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.hf_storage import HuggingFaceStorageReader

    directory, _, name = location.rstrip("/").rpartition("/")
    parsed = parse_name(name)
    if parsed is None or parsed.series != SHARDED_SERIES:
        raise ValueError(f"{location!r} is not a sharded checkpoint's manifest")
    store = CheckpointManager.reader(directory, storage_options).store
    manifest = store.manifest(name)  # every part name the format's own: none leaves ``tmp`` below
    target = strategy.sharded_state(model, optimizer)
    tied = {k: v for k, v in aliases(model).items() if v in target["model"]}
    weights = {k: v for k, v in target["model"].items() if k not in tied}
    tensors, _ = split_tensors({"model": weights, "optimizer": target["optimizer"]["state"]})
    with tempfile.TemporaryDirectory(prefix="sparkdp-shards-") as tmp:
        copy_parts(store, name, manifest, tmp)
        try:
            dcp.load(tensors, storage_reader=HuggingFaceStorageReader(tmp), no_dist=True)
        except Exception as exc:  # DCP names the missing or mismatched key
            raise ConfigError(
                f"the sharded checkpoint {location} does not fit this model and optimizer ({exc}). "
                "Resume with the model and optimizer it was saved from, or point resume at another "
                "directory."
            ) from exc
    optimizer_state = merge(tensors["optimizer"], saved_optimizer.get("state", {}))
    weights = {**tensors["model"], **{alias: tensors["model"][name] for alias, name in tied.items()}}
    strategy.load_sharded_state(
        model,
        optimizer,
        {
            "model": weights,
            "optimizer": {"state": optimizer_state, "param_groups": saved_optimizer["param_groups"]},
        },
    )


__all__ = ["ShardedSaver", "aliases", "merge", "restore", "shard_part", "split_tensors"]

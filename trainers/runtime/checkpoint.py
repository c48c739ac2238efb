"""Checkpoint manager: owns file names, atomic writes, checksums, retention and resume.

Layout of one checkpoint at optimizer step N (in `<run>/checkpoints/`):

    model_0000000N.pt      model, optimizer, scheduler, grad scaler, counters (written by rank 0)
    rank000_0000000N.pt    each rank's own state: data position, RNG states (one file per rank)
    meta_0000000N.json     written last, by rank 0: SHA-256 of every file above, the resolved
                           config, world size, the validation metric. A checkpoint without its
                           meta file is incomplete and never resumed from.

States a trainer shards across ranks (FSDP2's: `sharded=` in `save`/`resume`), by torch.distributed.checkpoint:

    shards_0000000N/       .metadata and __<rank>_<i>.distcp, every rank its own part; every file's SHA-256
                           in the meta (each rank hashes what it wrote)
    consolidated_0000000N.pt  the full model in one file for export and sampling (`consolidate`),
                           written on demand by one process, its SHA-256 added to the meta

Every file is written to a temporary name, fsynced and renamed, so a kill at any moment leaves either the old file
or the new one. Resume picks the newest checkpoint whose checksums verify on every rank, and falls back to older
ones (with a warning) when the newest is corrupt. Several nodes without a shared disk keep every file, shards
included, on node 0 alone: trainers.runtime.apart.

Every read of a file we wrote can meet garbage: a meta that is not valid JSON, or not an object, is taken out of the
complete set (renamed `.unusable`, kept for a post-mortem) with a warning, and never stops a save, a prune, "best" or
an evaluation. Only when *every* checkpoint is unusable does a start refuse (one line), instead of silently starting
over from step 0: `--restart` moves the evidence aside and starts fresh.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from trainers.errors import UsageError
from trainers.runtime import apart
from trainers.runtime.device import optimizer_steps_on_host
from trainers.runtime.dist import DistContext, all_gather_object, all_reduce_max, barrier, broadcast_object
from trainers.runtime.files import atomic_write, atomic_write_json, sha256_file

_META_RE = re.compile(r"^meta_(\d{8})\.json$")
_STEP_FILE_RE = re.compile(r"^(model|rank\d{3}|meta|consolidated)_(\d{8})\.(pt|json)$")
_SHARD_DIR_RE = re.compile(r"^shards_(\d{8})$")


def atomic_torch_save(path: Path, obj: Any) -> str:
    """Save atomically and return the SHA-256 of the bytes on disk."""
    atomic_write(path, lambda f: torch.save(obj, f))
    return sha256_file(path)


@dataclass
class Resumed:
    step: int
    shared: dict[str, Any]  # model/optimizer/scheduler/scaler/counters
    rank_state: dict[str, Any] | None  # None when the world size changed since the save
    meta: dict[str, Any]


class CheckpointManager:
    def __init__(self, directory: Path, ctx: DistContext, keep_last: int, logger: logging.Logger):
        if keep_last < 1:
            raise ValueError("keep_last must be >= 1")
        self.dir, self.ctx, self.keep_last, self.log = Path(directory), ctx, keep_last, logger
        self.mirror = None  # rank 0's remote mirror (--remote): told of each checkpoint made complete, and of set_aside
        self.apart = ctx.distributed and apart.run_dir_apart()  # node 0's folder is the job's (trainers.runtime.apart)

    # ---- names -------------------------------------------------------------------------------
    def model_path(self, step: int) -> Path:
        return self.dir / f"model_{step:08d}.pt"

    def rank_path(self, step: int, rank: int) -> Path:
        return self.dir / f"rank{rank:03d}_{step:08d}.pt"

    def meta_path(self, step: int) -> Path:
        return self.dir / f"meta_{step:08d}.json"

    def shard_dir(self, step: int) -> Path:
        return self.dir / f"shards_{step:08d}"

    def consolidated_path(self, step: int) -> Path:
        return self.dir / f"consolidated_{step:08d}.pt"

    def complete_steps(self) -> list[int]:
        """Steps with a readable meta file (complete checkpoints), newest first."""
        return [step for step in self._meta_steps() if self.meta(step) is not None]

    def _meta_steps(self) -> list[int]:
        if not self.dir.is_dir():
            return []
        return sorted((int(m.group(1)) for p in self.dir.iterdir() if (m := _META_RE.match(p.name))), reverse=True)

    def read_meta(self, step: int) -> dict[str, Any]:
        """The meta record; raises ValueError when it is not a JSON object with a file list."""
        record = json.loads(self.meta_path(step).read_text())
        if not isinstance(record, dict) or not isinstance(record.get("files"), dict):
            raise ValueError(f"{self.meta_path(step).name} is not a checkpoint record")
        return record

    def meta(self, step: int) -> dict[str, Any] | None:
        """The meta record, or None when unreadable: then rank 0 quarantines it with a warning (one bad file never
        blocks saving, pruning, best or evaluation)."""
        try:
            return self.read_meta(step)
        except (OSError, ValueError, UnicodeDecodeError) as exc:
            if not self.meta_path(step).exists():
                return None  # pruned meanwhile
            if self.ctx.is_main:
                self.log.warning("checkpoint meta %s is unreadable (%s); set aside as .unusable",
                                 self.meta_path(step).name, exc)
                self._quarantine(step)
            return None

    def best_step(self) -> int | None:
        """The complete checkpoint with the lowest recorded finite metric (None if none has one)."""
        scored = []
        for step in self.complete_steps():
            metric = (self.meta(step) or {}).get("metric")
            if isinstance(metric, (int, float)) and metric == metric:
                scored.append((metric, -step, step))
        return min(scored)[2] if scored else None

    def record_metric(self, step: int, metric: float) -> None:
        """Rank 0: the metric of a checkpoint saved without one (a stop between evaluations), so `best` can pick it."""
        record = self.read_meta(step)
        record["metric"] = metric
        atomic_write_json(self.meta_path(step), record)

    def evidence_of_a_run(self) -> list[str]:
        """Names that show a run was here and checkpointed: meta files (usable or set aside), or the
        step files of two or more steps (every meta deleted). One step's files without a meta are
        what a kill during the first write leaves: starting over from step 0 loses nothing then."""
        if not self.dir.is_dir():
            return []
        names = sorted(p.name for p in self.dir.iterdir())
        metas = [n for n in names if n.startswith("meta_")]
        if metas:
            return metas
        steps = {int(m.group(2)) for n in names if (m := _STEP_FILE_RE.match(n))} | \
            {int(m.group(1)) for n in names if (m := _SHARD_DIR_RE.match(n))}
        return [n for n in names if _STEP_FILE_RE.match(n) or _SHARD_DIR_RE.match(n)] if len(steps) >= 2 else []

    # ---- save --------------------------------------------------------------------------------
    def save(self, step: int, shared: dict[str, Any], rank_state: dict[str, Any], meta: dict[str, Any],
             sharded: dict[str, Any] | None = None) -> None:
        """Collective: every rank calls it at the same step. `sharded`: states (objects with
        state_dict/load_state_dict over DTensors) saved with torch.distributed.checkpoint."""
        self.dir.mkdir(parents=True, exist_ok=True)
        files = self._save_sharded(step, sharded) if sharded else {}
        files.update(self.write_local(step, shared, rank_state))
        self.commit(step, files, meta, sorted(sharded or ()))

    def gather_rank_states(self, rank_state: dict[str, Any]) -> Any:
        """Collective: what `write_local` takes: this rank's own state, or (`apart`) every rank's on rank 0."""
        return apart.gather_rank_states(self.ctx, rank_state) if self.apart else rank_state

    def write_local(self, step: int, shared: dict[str, Any] | None, rank_state: Any) -> dict[str, str]:
        """Not collective (a background thread may run it): this rank's file (`apart`: rank 0 writes every rank's),
        and the shared file on rank 0; returns the SHA-256 of each, by name. Nothing is complete until `commit`."""
        if self.apart and not self.ctx.is_main:
            return {}
        self.dir.mkdir(parents=True, exist_ok=True)
        by_rank = rank_state if self.apart else {self.ctx.rank: rank_state}
        files = {self.rank_path(step, rank).name: atomic_torch_save(self.rank_path(step, rank), state)
                 for rank, state in by_rank.items()}
        if self.ctx.is_main:
            model_file = self.model_path(step)
            files[model_file.name] = atomic_torch_save(model_file, shared)
        return files

    def commit(self, step: int, files: dict[str, str], meta: dict[str, Any], sharded: list[str] | None = None) -> None:
        """Collective, once every rank's files of `step` are on disk: rank 0 writes the meta (which
        makes the checkpoint complete) from every rank's checksums, then prunes."""
        gathered = all_gather_object(self.ctx, files)
        if self.ctx.is_main:
            all_files: dict[str, str] = {}
            for part in gathered:
                all_files.update(part)
            record = dict(meta, step=step, world_size=self.ctx.world_size, files=all_files, sharded=sharded or [])
            atomic_write_json(self.meta_path(step), record)
        keep = broadcast_object(self.ctx, self._keep_set() if self.ctx.is_main else None)
        if self.ctx.is_main:
            self._prune(keep)
            if self.mirror is not None:
                self.mirror.checkpoint(step)
        if self.apart:
            apart.share_metas(self)  # (every node then reads the same complete steps and best)
        barrier(self.ctx)

    def _save_sharded(self, step: int, sharded: dict[str, Any]) -> dict[str, str]:
        """Collective: torch.distributed.checkpoint writes each rank's part; each rank returns the
        SHA-256 of the files it wrote (rank 0 also of .metadata), named relative to the folder."""
        import torch.distributed.checkpoint as dcp

        folder = self.shard_dir(step)
        if self.ctx.is_main and folder.exists():
            shutil.rmtree(folder)  # left by an attempt killed before its meta: never mixed with new parts
        barrier(self.ctx)
        dcp.save(sharded, checkpoint_id=folder)
        mine = sorted(folder.glob(f"__{self.ctx.rank}_*.distcp"))
        if self.ctx.is_main:
            mine.append(folder / ".metadata")
        files = {f"{folder.name}/{p.name}": sha256_file(p) for p in mine}
        if self.apart:
            apart.gather_shards(self, folder, files)  # (the other nodes' parts into node 0's folder)
        return files

    def _keep_set(self) -> list[int]:
        steps = self.complete_steps()
        keep = set(steps[: self.keep_last])
        best = self.best_step()
        if best is not None:
            keep.add(best)
        return sorted(keep)

    def _prune(self, keep: list[int]) -> None:
        """Rank 0, after every rank has written: drop every file of a step not kept, whatever rank
        (or earlier world size) wrote it; the meta first, so a half-deleted checkpoint never looks
        complete."""
        keep_set = set(keep)
        files = [(p, int(m.group(2)), m.group(1)) for p in self.dir.iterdir() if (m := _STEP_FILE_RE.match(p.name))]
        for path, step, kind in sorted(files, key=lambda f: f[2] != "meta"):
            if step not in keep_set:
                path.unlink(missing_ok=True)
        for path in self.dir.iterdir():
            if (m := _SHARD_DIR_RE.match(path.name)) and int(m.group(1)) not in keep_set:
                shutil.rmtree(path, ignore_errors=True)

    def _quarantine(self, step: int) -> None:
        """Take an unusable checkpoint out of the complete set (its meta renamed, bytes kept for a
        post-mortem), so `latest`/`best` never pick it and later saves start from a clean order."""
        meta = self.meta_path(step)
        if meta.exists():
            os.replace(meta, meta.with_name(meta.name + ".unusable"))

    def set_aside(self) -> Path | None:
        """`--restart`: the checkpoints folder moved aside (kept), so a run starts fresh; the remote's removed."""
        if self.mirror is not None:
            self.mirror.forget_checkpoints()
        if not self.dir.is_dir():
            return None
        target = self.dir.with_name(f"{self.dir.name}.set-aside-{time.strftime('%Y%m%d-%H%M%S')}")
        os.replace(self.dir, target)
        return target

    def load_verified(self, step: int, map_location) -> dict[str, Any]:
        """The model file of a complete checkpoint, after checking its SHA-256 against the meta; with
        the states of its consolidated file merged in when it has one (see `consolidate`)."""
        shared = self._load_file_verified(step, self.model_path(step), map_location)
        if self.consolidated_path(step).name in ((self.meta(step) or {}).get("files") or {}):
            consolidated = self._load_file_verified(step, self.consolidated_path(step), map_location)
            shared["states"] = {**shared.get("states", {}), **consolidated}
        return shared

    def _load_file_verified(self, step: int, path: Path, map_location) -> dict[str, Any]:
        expected = ((self.meta(step) or {}).get("files") or {}).get(path.name)
        if expected is None or not path.is_file() or sha256_file(path) != expected:
            raise UsageError(f"checkpoint {path} is missing or fails its SHA-256 check; pick another with --checkpoint")
        return optimizer_steps_on_host(torch.load(path, map_location=map_location, weights_only=True))

    def sharded_names(self, step: int) -> list[str]:
        """The states of a checkpoint that live in its shards folder ([] for a plain checkpoint)."""
        return list((self.meta(step) or {}).get("sharded") or [])

    def load_sharded(self, step: int, states: dict[str, Any], checked: bool = False) -> None:
        """Collective: load `states` (a subset of the checkpoint's sharded ones) in place, after this
        rank has checked the shard files it reads."""
        import torch.distributed.checkpoint as dcp

        record = self.meta(step) or {}
        brought = self.apart and apart.bring_shards(self, step, record, checked)  # (node 0's folder alone has them)
        problem = self._verify_names(step, self._shard_files_needed(step, record), record)
        bad_anywhere = all_reduce_max(self.ctx, [1.0 if problem else 0.0])[0] > 0
        if bad_anywhere:
            raise UsageError(f"checkpoint step {step}'s shards are unusable ({problem or 'on another rank'}); pick "
                             f"another with --checkpoint")
        dcp.load(states, checkpoint_id=self.shard_dir(step))
        if self.apart:
            apart.drop_brought_shards(self, step, brought)

    def consolidate(self, step: int, names: tuple[str, ...] = ("model",)) -> Path:
        """One process: the named sharded states of checkpoint `step` as one file (sharded.consolidate)."""
        from trainers.runtime.sharded import consolidate

        return consolidate(self, step, names)

    def verify(self, step: int) -> str | None:
        """Every file of a checkpoint against its meta; the first problem, or None when all match."""
        record = self.meta(step)
        if record is None:
            return f"meta_{step:08d}.json is unreadable"
        for name, expected in record["files"].items():
            path = self.dir / name
            if not path.is_file():
                return f"{name} is missing"
            if sha256_file(path) != expected:
                return f"{name} fails its SHA-256 check"
        return None

    # ---- resume ------------------------------------------------------------------------------
    def shard_files(self, step: int, meta: dict[str, Any]) -> list[str]:
        """Every file of checkpoint `step`'s shards folder its meta lists, named relative to the checkpoints folder."""
        return [n for n in meta.get("files", {}) if n.startswith(f"{self.shard_dir(step).name}/")]

    def _shard_files_needed(self, step: int, meta: dict[str, Any]) -> list[str]:
        """The shard files this rank reads: .metadata and its own parts (every part after a change of
        world size, when torch.distributed.checkpoint reshards)."""
        prefix, names = f"{self.shard_dir(step).name}/", self.shard_files(step, meta)
        if meta.get("world_size") != self.ctx.world_size:
            return names
        return [n for n in names if n == prefix + ".metadata" or n.startswith(f"{prefix}__{self.ctx.rank}_")]

    def _verify_local(self, step: int, meta: dict[str, Any]) -> str | None:
        """Check the files this rank needs; return a reason when something is wrong."""
        needed = [self.model_path(step).name]
        if meta.get("world_size") == self.ctx.world_size:
            needed.append(self.rank_path(step, self.ctx.rank).name)
        needed += self._shard_files_needed(step, meta)
        return self._verify_names(step, needed, meta)

    def _verify_names(self, step: int, needed: list[str], meta: dict[str, Any]) -> str | None:
        for name in needed:
            expected = meta.get("files", {}).get(name)
            path = self.dir / name
            if expected is None:
                return f"{name} missing from meta"
            if not path.is_file():
                return f"{name} missing"
            if sha256_file(path) != expected:
                return f"{name} checksum mismatch"
        return None

    def resume(self, map_location: torch.device, sharded: dict[str, Any] | None = None) -> Resumed | None:
        """Collective: the newest checkpoint that verifies on every rank, loaded; None when the
        folder holds no checkpoint. Raises UsageError (on every rank) when it holds checkpoints and
        none of them is usable: starting over from step 0 must be asked for (`--restart`).
        `sharded` states are loaded in place from the checkpoint's shards folder; a checkpoint whose
        sharded states are not these (a run switched between DDP and FSDP) is refused."""
        if self.apart:
            found = apart.resume_on_rank0(self, map_location, sharded)
            return None if found is None else Resumed(*found)
        candidates = broadcast_object(self.ctx, self._meta_steps() if self.ctx.is_main else None)
        for step in candidates:
            try:
                meta = self.read_meta(step)
                problem = self._verify_local(step, meta)
            except (OSError, ValueError, UnicodeDecodeError) as exc:  # unreadable or half-written meta
                meta, problem = {}, f"meta unreadable: {exc}"
            bad_anywhere = all_reduce_max(self.ctx, [1.0 if problem else 0.0])[0] > 0
            if bad_anywhere:
                if problem:
                    self.log.warning("checkpoint step %d is unusable on rank %d (%s); trying an older one",
                                     step, self.ctx.rank, problem)
                elif self.ctx.is_main:
                    self.log.warning("checkpoint step %d is unusable on another rank; trying an older one", step)
                barrier(self.ctx)  # every rank has read it before rank 0 sets it aside
                if self.ctx.is_main:
                    self._quarantine(step)
                continue
            self.refuse_other_sharding(step, meta, sharded)
            shared = optimizer_steps_on_host(torch.load(self.model_path(step), map_location=map_location,
                                                        weights_only=True))
            if sharded:
                import torch.distributed.checkpoint as dcp

                dcp.load(sharded, checkpoint_id=self.shard_dir(step))
            rank_state = None
            if meta.get("world_size") == self.ctx.world_size:
                rank_state = torch.load(self.rank_path(step, self.ctx.rank), map_location="cpu", weights_only=True)
            elif self.ctx.is_main:
                self.log.warning("checkpoint step %d was written by %s ranks, this run has %d: per-rank data "
                                 "positions cannot be mapped, the interrupted epoch restarts",
                                 step, meta.get("world_size"), self.ctx.world_size)
            return Resumed(step, shared, rank_state, meta)
        self.refuse_if_a_run_was_here()
        return None

    def refuse_other_sharding(self, step: int, meta: dict[str, Any], sharded: dict[str, Any] | None) -> None:
        saved = sorted(meta.get("sharded") or [])
        if saved != sorted(sharded or ()):
            raise UsageError(f"checkpoint step {step} was saved with sharded states {saved or 'none'}, this run shards "
                             f"{sorted(sharded or ()) or 'none'}: resume with the same parallelism (--parallel), or "
                             f"use a new --run-dir")

    def refuse_if_a_run_was_here(self) -> None:
        """Collective: UsageError on every rank when the folder holds checkpoints and none was usable."""
        evidence = broadcast_object(self.ctx, self.evidence_of_a_run() if self.ctx.is_main else None)
        if evidence:
            raise UsageError(f"every checkpoint in {self.dir} is unusable ({', '.join(evidence[:4])}"
                             f"{' ...' if len(evidence) > 4 else ''}); nothing was changed. To start this run over "
                             f"from step 0 add --restart (the checkpoints are moved aside, not deleted)")

"""The coordinator's side of checkpoints: ask every shard to save, collect the answers, record
one ``checkpoint`` event per complete set, keep the newest few.

A checkpoint is complete when every shard has written its file into the same folder
(``<run folder>/checkpoints/<seq>/shard-<rank>.npz``); only a complete one is recorded, and
``psctl resume`` starts from the newest recorded one. Shards save independently, each at a
moment between two of its frames, so the files are not one global cut: each holds, per worker,
the clocks that shard has applied, and a resumed worker starts from the smallest of them (the
shards that are ahead discard the repeated clocks as duplicates).
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from engine.wire.messages import Checkpoint

CHECKPOINT_TIMEOUT_S = 30.0  # for every shard to save one checkpoint
CHECKPOINTS_KEPT = 2  # older complete checkpoints are deleted


def checkpoint_folder(run_folder: Path, seq: int) -> Path:
    return run_folder / "checkpoints" / f"{seq:06d}"


class CheckpointKeeper:
    def __init__(self, run_folder: Path, shards: int, *, first_seq: int,
                 send: Callable[[int, Checkpoint], Awaitable[bool]],
                 event: Callable[..., None]) -> None:
        self.run_folder, self.shards = run_folder, shards
        self.seq = first_seq
        self._send, self._event = send, event
        self._saved: dict[int, dict[str, Any]] = {}
        self._failed: list[str] = []
        self._arrived = asyncio.Event()
        self._complete: list[int] = []
        self._busy = asyncio.Lock()

    async def save(self, servers: list[int], timeout: float = CHECKPOINT_TIMEOUT_S) -> bool:
        """One checkpoint of every shard, each saved by the live server that is its primary;
        whether it completed (and was recorded)."""
        async with self._busy:
            self.seq += 1
            folder = checkpoint_folder(self.run_folder, self.seq)
            self._saved, self._failed = {}, []
            started = time.perf_counter()
            order = Checkpoint(seq=self.seq, folder=str(folder))
            sent = await asyncio.gather(*(self._send(r, order) for r in servers))
            if not all(sent):
                return self._give_up(folder, "a shard server is gone")
            try:
                await asyncio.wait_for(self._all_answered(), timeout)
            except TimeoutError:
                return self._give_up(folder, f"not every shard saved within {timeout:g} s")
            if self._failed:
                return self._give_up(folder, self._failed[0])
            self._record(folder, time.perf_counter() - started)
            return True

    def on_saved(self, kind: str, detail: dict[str, Any]) -> None:
        """A shard's answer (a ``checkpoint_saved`` or ``checkpoint_failed`` event)."""
        index = detail.get("index")
        if detail.get("seq") != self.seq or not isinstance(index, int):
            return  # an answer to a checkpoint already given up on
        if kind == "checkpoint_saved":
            self._saved[index] = detail
        else:
            self._failed.append(f"shard {index}: {detail.get('message', 'failed')}")
        self._arrived.set()

    async def _all_answered(self) -> None:
        while len(self._saved) + len(self._failed) < self.shards:
            self._arrived.clear()
            await self._arrived.wait()

    def _record(self, folder: Path, seconds: float) -> None:
        shards = [self._saved[r] for r in sorted(self._saved)]
        self._event("checkpoint", seq=self.seq, folder=str(folder),
                    bytes=sum(int(s.get("bytes", 0)) for s in shards),
                    seconds=round(seconds, 4),
                    clocks=[s.get("clocks", []) for s in shards])
        self._complete.append(self.seq)
        while len(self._complete) > CHECKPOINTS_KEPT:
            old = checkpoint_folder(self.run_folder, self._complete.pop(0))
            with contextlib.suppress(OSError):
                shutil.rmtree(old)

    def _give_up(self, folder: Path, why: str) -> bool:
        self._event("checkpoint_incomplete", seq=self.seq, reason=why)
        with contextlib.suppress(OSError):
            shutil.rmtree(folder)
        return False

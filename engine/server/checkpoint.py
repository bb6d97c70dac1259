"""A shard's checkpoint: its values, optimizer state and vector clocks in one ``.npz`` file.

Written atomically (a temporary file, fsync, rename, fsync of the folder), so a checkpoint file
either holds a whole shard or does not exist. Read back with ``allow_pickle=False`` and checked
against the shard it is loaded into: its key range, workers, clock ranges and optimizer slots.

What a restored shard holds: every update it had applied, and per worker and clock range the
next clock it expects. Under a model that accumulates rounds (BSP) a round that was only partly
pushed is dropped: its contributors' clocks go back to the round, so they push it again. The
consistency controller is rebuilt by replaying the commits the clocks imply, in clock order;
its timing history (which only ElasticBSP and DSSP keep) starts empty again, and ElasticBSP
monitors two pushes before placing its next barrier, as at the start of a run.

A *live* snapshot (``live=True``) is what a chain's tail hands a server that joins the chain
(``engine.roles.handoff``): it also holds the open rounds' sums and whether the shard was
initialised, so that nothing is dropped; the copy restored from it equals the tail's, and the
updates the tail applies after it follow down the chain.

A sparse shard (issue 44) is saved as its stored keys (``stored_keys``, in row order) and their
rows of every array: the values, the optimizer's state and, live, the open round's rows and sums;
restoring stores exactly those keys, in the same rows, and nothing else. A file's arrays are
sized by its ``stored_keys``, which must fit the shard's capacity.
"""

from __future__ import annotations

import contextlib
import os
import time
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from engine.errors import StoreError
from engine.server.shard import ShardState

FORMAT = 1


def shard_file(folder: Path, rank: int) -> Path:
    return folder / f"shard-{rank}.npz"


@dataclass(frozen=True)
class Snapshot:
    """Copies of a shard's state taken on its event loop, written out later off it."""

    arrays: dict[str, np.ndarray]

    @classmethod
    def of(cls, state: ShardState, seq: int, *, live: bool = False) -> Snapshot:
        arrays: dict[str, np.ndarray] = {
            "format": np.array([FORMAT], dtype=np.int64),
            "seq": np.array([seq], dtype=np.int64),
            "keys": np.array([state.keys.start, state.keys.end], dtype=np.int64),
            "params": _rows(state, state.params),
            "next": state.clocks.next.copy(),
            "versions": state.versions.copy(),
            "pushes": np.array([state.pushes], dtype=np.int64),
            "finished": np.array(state.finished, dtype=np.bool_),
        }
        for i, slot in enumerate(state.optimizer.slots()):
            arrays[f"slot{i}"] = _rows(state, slot)
        if state.rows is not None:
            arrays["stored_keys"] = state.rows.keys()
        if live:
            arrays["initialized"] = np.array([state.initialized], dtype=np.bool_)
            for i, part in enumerate(state.aggregator.round_state()):
                arrays[f"round{i}"] = part.copy()
        return cls(arrays)

    def write(self, path: Path) -> int:
        """Write atomically; returns the file's size in bytes."""
        partial = path.with_name(path.name + ".partial")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with partial.open("wb") as handle:
                np.savez(handle, **self.arrays)  # type: ignore[arg-type]
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(partial, path)
            _fsync_folder(path.parent)
        except OSError as exc:
            with contextlib.suppress(OSError):  # the folder itself may be what failed
                partial.unlink(missing_ok=True)
            raise StoreError(f"cannot write checkpoint {path}: {exc}") from None
        return path.stat().st_size


def save(state: ShardState, folder: Path, rank: int, seq: int) -> tuple[Path, int, float]:
    """Snapshot and write one shard; (path, bytes, seconds)."""
    started = time.perf_counter()
    path = shard_file(folder, rank)
    size = Snapshot.of(state, seq).write(path)
    return path, size, time.perf_counter() - started


def restore(state: ShardState, path: Path, *, live: bool = False) -> int:
    """Load ``path`` into a fresh ``state``; returns the checkpoint's sequence number. A live
    snapshot keeps its open rounds (nothing is pushed again)."""
    stored = _stored(state, path)
    arrays = _load(path, _shapes(state, stored),
                   _live_shapes(state, stored, path) if live else {})
    _check(state, arrays, path, stored)
    if live:
        _check_live(state, arrays, path, stored)
    if state.rows is not None:
        _check_stored_keys(state, arrays["stored_keys"], path)
        state.rows.load(arrays["stored_keys"])
    _put_rows(state, state.params, arrays["params"])
    for i, slot in enumerate(state.optimizer.slots()):
        _put_rows(state, slot, arrays[f"slot{i}"])
    np.copyto(state.versions, arrays["versions"])
    state.pushes = int(arrays["pushes"][0])
    state.finished = [bool(f) for f in arrays["finished"]]
    state.initialized = bool(arrays["initialized"][0]) if live else True
    clocks = arrays["next"].copy()
    if live:
        state.aggregator.load_round([arrays[f"round{i}"]
                                     for i in range(len(state.aggregator.round_state()))])
    elif state.controller.accumulates:  # a partial round is not in the values: push it again
        clocks[:] = clocks.min(axis=0)
    replay(state, clocks)
    return int(arrays["seq"][0])


def replay(state: ShardState, clocks: np.ndarray) -> None:
    """Bring the shard's clocks and controller to ``clocks`` (workers x clock ranges) by
    committing, clock by clock, what they say was committed, then let the controller restart
    its timing-driven state from there (``resume``); what it reports is dropped."""
    controller, ranges = state.controller, clocks.shape[1]
    for clock in range(int(clocks.max(initial=0))):
        for worker in range(clocks.shape[0]):
            for r in range(ranges):
                if clocks[worker, r] > clock:
                    controller.on_commit(worker, clock, range(r, r + 1))
    np.copyto(state.clocks.next, clocks)
    controller.resume([int(c) for c in clocks.min(axis=1)], list(state.finished))
    controller.take_syncs()


Declared = dict[str, tuple[tuple[int, ...], np.dtype[Any]]]
LiveShapes = dict[str, tuple[tuple[int, ...], np.dtype[Any]]]


def declared(path: Path) -> Declared:
    """Each array's shape and dtype as the file's headers declare them, no array read: what a
    caller checks before loading one, since numpy allocates whatever a header declares."""
    with _npz(path) as data:
        return _declared(data, path)


def _load(path: Path, shapes: dict[str, tuple[int, ...]],
          live: LiveShapes) -> dict[str, np.ndarray]:
    """The arrays of ``path`` named in ``shapes`` and ``live``, each read only once its header
    declares the shape this shard has (a damaged header must not allocate gigabytes)."""
    with _npz(path) as data:
        heads = _declared(data, path)
        for name, shape in shapes.items():
            if name in heads and heads[name][0] != shape:
                raise StoreError(f"checkpoint {path} does not fit this shard: {name} should "
                                 f"have shape {shape}, has {heads[name][0]} (was the run's "
                                 "config changed?)")
        for name, (shape, dtype) in live.items():
            if name in heads and heads[name] != (shape, dtype):
                raise StoreError(f"{path} is not a live copy of this shard: {name} should be "
                                 f"{dtype} of shape {shape}")
        wanted = [name for name in [*shapes, *live] if name in heads]
        return _guarded(path, lambda: {name: data[name] for name in wanted})


def _npz(path: Path) -> np.lib.npyio.NpzFile:
    def opened() -> np.lib.npyio.NpzFile:
        _check_magic(path)
        data = np.load(path, allow_pickle=False)
        if not isinstance(data, np.lib.npyio.NpzFile):
            raise StoreError(f"cannot read checkpoint {path}: it holds one array, not the "
                             "arrays of a psctl checkpoint")
        return data

    return _guarded(path, opened)


def _declared(data: np.lib.npyio.NpzFile, path: Path) -> Declared:
    def read() -> Declared:
        heads: Declared = {}
        archive = data.zip
        assert archive is not None  # None only once closed
        for member in archive.namelist():
            if not member.endswith(".npy"):
                continue
            with archive.open(member) as raw:
                version = np.lib.format.read_magic(raw)
                if version not in ((1, 0), (2, 0)):
                    raise StoreError(f"cannot read checkpoint {path}: {member} is in npy format "
                                     f"{version}, which psctl never writes")
                header = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                          else np.lib.format.read_array_header_2_0)
                shape, _, dtype = header(raw)
            if dtype.hasobject:
                raise StoreError(f"cannot read checkpoint {path}: {PYTHON_OBJECTS}")
            heads[member.removesuffix(".npy")] = (tuple(shape), dtype)
        return heads

    return _guarded(path, read)


PYTHON_OBJECTS = "it holds Python objects, which psctl never loads; it is not a psctl checkpoint"
# How an archive (.npz), an array (.npy) and a pickle (protocol 2 to 5) begin.
_ARCHIVE, _ARRAY = (b"PK\x03\x04", b"PK\x05\x06"), b"\x93NUMPY"
_PICKLE = tuple(bytes([0x80, protocol]) for protocol in range(2, 6))


def _check_magic(path: Path) -> None:
    """A file that begins as neither an archive nor an array is refused for what it is: numpy
    takes anything else for a pickle, so random bytes would be said to hold Python objects."""
    with path.open("rb") as handle:
        magic = handle.read(len(_ARRAY))
    if not magic or magic.startswith((*_ARCHIVE, _ARRAY)):
        return  # numpy says what is wrong with an empty file, or inside an archive or array
    if magic.startswith(_PICKLE):
        raise StoreError(f"cannot read checkpoint {path}: {PYTHON_OBJECTS}")
    raise StoreError(f"cannot read checkpoint {path}: it is neither an archive of arrays (.npz) "
                     "nor an array (damaged or not a checkpoint)")
T = TypeVar("T")


def _guarded(path: Path, read: Callable[[], T]) -> T:
    """``read()``, with every way a damaged file fails as one StoreError naming ``path``."""
    try:
        return read()
    except ValueError as exc:  # numpy's advice (load it with pickles allowed) is not ours
        if "allow_pickle" in str(exc):
            raise StoreError(f"cannot read checkpoint {path}: {PYTHON_OBJECTS}") from None
        raise StoreError(f"cannot read checkpoint {path}: {exc}") from None
    except (OSError, EOFError, zipfile.BadZipFile, KeyError, SyntaxError, MemoryError) as exc:
        raise StoreError(f"cannot read checkpoint {path}: {exc or type(exc).__name__} (damaged "
                         "or not a checkpoint)") from None


def _rows(state: ShardState, array: np.ndarray) -> np.ndarray:
    """A copy of what a checkpoint keeps of a shard-sized ``array``: all of it, or a sparse
    shard's stored rows (and the entry past its rows that an optimizer keeps a total in)."""
    if state.rows is None:
        return array.copy()
    used = state.rows.used
    return np.concatenate([array[:used], array[state.size:]])


def _put_rows(state: ShardState, array: np.ndarray, saved: np.ndarray) -> None:
    """The inverse of :func:`_rows`, into a fresh shard's ``array``."""
    if state.rows is None:
        np.copyto(array, saved)
        return
    extra = len(array) - state.size
    used = len(saved) - extra
    array[:used] = saved[:used]
    array[state.size:] = saved[used:]


def _stored(state: ShardState, path: Path) -> int:
    """Keys with a row in the file: its ``stored_keys`` for a sparse shard (checked against the
    shard's capacity before anything of that size is read), every key for a dense one."""
    if state.rows is None:
        return len(state.keys)
    head = declared(path).get("stored_keys")
    if head is None or len(head[0]) != 1 or head[1] != np.dtype(np.int64):
        raise StoreError(f"checkpoint {path} does not fit this shard: its keys are sparse and "
                         "the file has no int64 stored_keys (was the run's config changed?)")
    stored = head[0][0]
    if stored > state.size:
        raise StoreError(f"checkpoint {path} stores {stored:,} keys; this shard holds at most "
                         f"{state.size:,}")
    return stored


def _sized(state: ShardState, array: np.ndarray, stored: int) -> tuple[int, ...]:
    """The shape ``array`` (shard-sized) has in a checkpoint with ``stored`` keys."""
    return (len(array) - state.size + stored,)


def _shapes(state: ShardState, stored: int) -> dict[str, tuple[int, ...]]:
    """The shape of every array a checkpoint of ``state`` with ``stored`` keys holds."""
    shapes = {"format": (1,), "seq": (1,), "keys": (2,),
              "params": _sized(state, state.params, stored),
              "next": state.clocks.next.shape, "versions": state.versions.shape,
              "pushes": (1,), "finished": (state.clocks.next.shape[0],),
              **{f"slot{i}": _sized(state, s, stored)
                 for i, s in enumerate(state.optimizer.slots())}}
    if state.rows is not None:
        shapes["stored_keys"] = (stored,)
    return shapes


def _live_shapes(state: ShardState, stored: int, path: Path) -> LiveShapes:
    if state.rows is not None:  # an open round's rows and sums: as many as the file has, if
        # they fit the rows it stores (checked before either is read)
        head = declared(path).get("round0")
        rows = head[0] if head is not None and len(head[0]) == 1 and head[0][0] <= stored else (0,)
        return {"initialized": ((1,), np.dtype(np.bool_)), "round0": (rows, np.dtype(np.int64)),
                "round1": (rows, np.dtype(np.float32))}
    return {"initialized": ((1,), np.dtype(np.bool_)),
            **{f"round{i}": (p.shape, p.dtype)
               for i, p in enumerate(state.aggregator.round_state())}}


def _check_stored_keys(state: ShardState, keys: np.ndarray, path: Path) -> None:
    if keys.dtype != np.int64 or (keys < 0).any() or (keys >= len(state.keys)).any():
        raise StoreError(f"checkpoint {path} stores keys outside this shard's "
                         f"[{state.keys.start}, {state.keys.end})")
    if len(np.unique(keys)) != len(keys):
        raise StoreError(f"checkpoint {path} stores a key twice")


def _check(state: ShardState, arrays: dict[str, np.ndarray], path: Path, stored: int) -> None:
    slots = state.optimizer.slots()
    for name, shape in _shapes(state, stored).items():
        if name not in arrays or arrays[name].shape != shape:
            got = arrays[name].shape if name in arrays else "nothing"
            raise StoreError(f"checkpoint {path} does not fit this shard: {name} should have "
                             f"shape {shape}, has {got} (was the run's config changed?)")
    if arrays["finished"].dtype != np.bool_:
        raise StoreError(f"checkpoint {path} holds finished flags that are not booleans")
    if int(arrays["format"][0]) != FORMAT:
        raise StoreError(f"checkpoint {path} has format {int(arrays['format'][0])}, "
                         f"this psctl reads {FORMAT}")
    if tuple(arrays["keys"].tolist()) != (state.keys.start, state.keys.end):
        start, end = arrays["keys"].tolist()
        raise StoreError(f"checkpoint {path} holds keys [{start}, {end}), this shard "
                         f"[{state.keys.start}, {state.keys.end})")
    floats = [arrays["params"], *(arrays[f"slot{i}"] for i in range(len(slots)))]
    if not all(a.dtype == np.float32 and np.isfinite(a).all() for a in floats):
        raise StoreError(f"checkpoint {path} holds values that are not finite float32")
    _check_counts(arrays, path)


def check_clocks(path: Path, shape: tuple[int, ...]) -> None:
    """The checks a shard makes of the clocks in ``path`` (whose header declares ``shape``
    for them, see :func:`declared`), without the shard: for ``psctl resume``, so that a
    checkpoint a server would refuse is refused before any process starts."""
    arrays = _load(path, {"next": shape, "versions": (shape[1],), "pushes": (1,), "seq": (1,)},
                   {})
    for name, expected in (("next", shape), ("versions", (shape[1],)), ("pushes", (1,)),
                           ("seq", (1,))):
        if name not in arrays:
            raise StoreError(f"checkpoint {path} does not fit this shard: {name} should have "
                             f"shape {expected}, has nothing (was the run's config changed?)")
    _check_counts(arrays, path)


def _check_counts(arrays: dict[str, np.ndarray], path: Path) -> None:
    for name in ("next", "versions", "pushes", "seq"):
        if arrays[name].dtype.kind != "i" or (arrays[name] < 0).any():
            raise StoreError(f"checkpoint {path} holds negative or non-integer {name}")
    # Every clock was reached by pushes to this shard (a joining worker starts at a clock
    # others reached), and restoring replays each one: a damaged clock of 10^9 would spin.
    pushes, top = int(arrays["pushes"][0]), int(arrays["next"].max(initial=0))
    if top > pushes:
        raise StoreError(f"checkpoint {path} holds clock {top}, more than the {pushes} pushes "
                         "it records (damaged or not a checkpoint of this run)")


def _check_live(state: ShardState, arrays: dict[str, np.ndarray], path: Path,
                stored: int) -> None:
    for name, (shape, dtype) in _live_shapes(state, stored, path).items():
        if name not in arrays or arrays[name].shape != shape or arrays[name].dtype != dtype:
            raise StoreError(f"{path} is not a live copy of this shard: {name} should be "
                             f"{dtype} of shape {shape}")
    if state.rows is not None:
        _check_sparse_round(arrays, path, stored)
    elif not np.isfinite(arrays["round0"]).all():
        raise StoreError(f"{path} holds round sums that are not finite")


def _check_sparse_round(arrays: dict[str, np.ndarray], path: Path, stored: int) -> None:
    rows, sums = arrays.get("round0"), arrays.get("round1")
    if (rows is None or sums is None or rows.dtype != np.int64 or sums.dtype != np.float32
            or rows.shape != sums.shape or rows.ndim != 1):
        raise StoreError(f"{path} is not a live copy of this shard: its open round should be "
                         "int64 rows and float32 sums of one length")
    if ((rows < 0) | (rows >= stored)).any() or len(np.unique(rows)) != len(rows):
        raise StoreError(f"{path} holds an open round on rows it does not store")
    if not np.isfinite(sums).all():
        raise StoreError(f"{path} holds round sums that are not finite")


def _fsync_folder(folder: Path) -> None:
    try:
        handle = os.open(folder, os.O_RDONLY)
    except OSError:
        return  # not every file system lets a folder be opened; the rename is still atomic
    try:
        os.fsync(handle)
    finally:
        os.close(handle)

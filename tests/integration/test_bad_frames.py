"""Acceptance: malformed traffic from a raw client (on the transport the servers listen on) is
refused while training goes on."""

from __future__ import annotations

import asyncio
import contextlib
import json
import pickle
import struct
import threading
from pathlib import Path

import numpy as np
import pytest

from engine.errors import ConnectionClosed
from engine.keys import KeyRange
from engine.launcher import Launcher
from engine.transport.schemes import SchemeTransport
from engine.wire.protocol import FLAG_COMMIT, Frame, MsgType, Role, decode, encode
from engine.wire.records import RunStatus
from tests.integration.support import config, query, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]


def _bad_frames(run: bytes, keys: KeyRange) -> dict[str, bytes]:
    good = encode(Frame(MsgType.PUSH, 7, keys, run=run, role=Role.WORKER, rank=0,
                        payload=np.zeros(len(keys), dtype=np.float32)))
    wrong_dtype = bytearray(good)
    struct.pack_into("<B", wrong_dtype, 4, 2)  # claims float64: sizes no longer agree
    wrong_shape = encode(Frame(MsgType.PUSH, 8, keys, run=run, role=Role.WORKER, rank=0,
                               payload=np.zeros(len(keys) - 1, dtype=np.float32)))
    return {
        "malformed": b"\x00\x01garbage",
        "pickle": pickle.dumps({"evil": list(range(100))}),
        "wrong_dtype": bytes(wrong_dtype),
        "wrong_shape": bytes(wrong_shape),
        **_bad_sparse_frames(run, keys),
    }


def _sparse(run: bytes, span: KeyRange, index: list[int], values: int) -> bytearray:
    return encode(Frame(MsgType.PUSH, 9, span, run=run, role=Role.WORKER, rank=0,
                        flags=FLAG_COMMIT, index=np.array(index, dtype=np.uint32),
                        payload=np.ones(values, dtype=np.float32)))


def _bad_sparse_frames(run: bytes, keys: KeyRange) -> dict[str, bytes]:
    """Key-list pushes that break one rule each (protocol version 3)."""
    too_many = _sparse(run, keys, [1, 2, 3], 3)
    struct.pack_into("<Q", too_many, 96, 10**9)  # the key count field
    return {
        "unsorted": bytes(_sparse(run, keys, [5, 3, 7], 3)),
        "duplicated": bytes(_sparse(run, keys, [3, 3, 7], 3)),
        "out_of_shard": bytes(_sparse(run, KeyRange(0, 10**7), [1, 5_000_000], 2)),
        "count_mismatch": bytes(_sparse(run, keys, [1, 2, 3], 2)),
        "count_too_large": bytes(too_many),
    }


async def _attack(address: str, token: str, run: bytes, keys: KeyRange) -> dict[str, str]:
    # Whatever transport the servers listen on (the address's scheme says which).
    replies: dict[str, str] = {}
    transport = SchemeTransport(max_frame_bytes=2**30)
    socket = await transport.connect(address, token=token, timeout=10)
    for name, data in _bad_frames(run, keys).items():
        await socket.send(data)
        frame = decode(await asyncio.wait_for(socket.recv(), 10), max_bytes=2**26)
        assert frame.type is MsgType.ERROR, name
        replies[name] = " ".join(frame.error())
    await socket.close()
    socket = await transport.connect(address, token=token, timeout=10)
    try:
        await socket.send(bytes(70 * 2**20))  # over the server's 64 MiB frame limit
        await asyncio.wait_for(socket.recv(), 10)
    except ConnectionClosed as exc:  # the server closes: 1009 message too big
        replies["oversize"] = str(exc)
    with contextlib.suppress(Exception):  # already closed by the server
        await socket.close()
    return replies


def test_raw_client_garbage_is_refused_and_the_run_finishes(tmp_path: Path,
                                                            mnist_dir: Path) -> None:
    launcher = Launcher(config(data__dataset="mnist", data__data_dir=str(mnist_dir),
                               data__train_limit=6000, cluster__workers=2,
                               cluster__servers=1, train__epochs=3, sync__model="bsp"),
                        db=tmp_path / "experiments.db")
    launcher.start()
    outcome: dict[str, object] = {}

    def attack_while_training() -> None:
        wait_for(lambda: query(launcher.db, "SELECT count(*) FROM iterations")[0][0] > 10,
                 90, "training to start")
        detail = json.loads(query(launcher.db, "SELECT detail FROM events WHERE kind = "
                                               "'server_listening'")[0][0])
        run = bytes.fromhex(launcher.run_id)[:16]
        keys = KeyRange(0, 784 * 512 + 512)  # the first layer, inside shard 0
        before = query(launcher.db, "SELECT count(*) FROM iterations")[0][0]
        outcome["replies"] = asyncio.run(_attack(detail["address"], launcher.join_token, run,
                                                 keys))
        outcome["before"] = before

    attacker = threading.Thread(target=attack_while_training)
    attacker.start()
    result = launcher.wait()
    attacker.join()
    replies = outcome["replies"]
    assert isinstance(replies, dict)
    assert "not a psctl frame" in replies["malformed"]
    assert "bad magic" in replies["pickle"]
    assert "bytes" in replies["wrong_dtype"]
    assert "does not match" in replies["wrong_shape"]
    assert "key list is not sorted: key 3 at position 1 follows 5" in replies["unsorted"]
    assert "key list is duplicated: key 3 at position 1 follows 3" in replies["duplicated"]
    # A span wider than the server's keys is refused before its key list is read.
    assert ("are not all on this shard" in replies["out_of_shard"]
            or "the frame addresses 10000000 keys; this server holds" in replies["out_of_shard"])
    assert "does not match the 3 keys of the key list" in replies["count_mismatch"]
    # a key count above the server's keys is refused before the room for it is even checked
    assert "the frame addresses 1000000000 keys; this server holds" in replies["count_too_large"]
    assert "1009" in replies["oversize"] or "too big" in replies["oversize"]
    assert result.status is RunStatus.FINISHED, result.reason
    after = query(launcher.db, "SELECT count(*) FROM iterations")[0][0]
    assert after == 2 * 3 * 47 and after > int(outcome["before"])  # type: ignore[call-overload]
    stats = [json.loads(row[0]) for row in query(launcher.db, "SELECT detail FROM events WHERE "
                                                             "kind = 'server_stats'")]
    assert stats and stats[0]["bad_frames"] >= 9

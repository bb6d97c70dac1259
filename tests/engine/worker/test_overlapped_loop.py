"""The overlapped loop settles each push once: a push the server refused fails the loop with
the server's reason, not with a second wait on the same request from ``end``."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from engine.errors import ProtocolError, RemoteError
from engine.keys import KeyLayout, KeyRange
from engine.plan import build_config
from engine.worker.client import Handle, PullResult, PushResult
from engine.worker.loops import OverlappedLoop, Shard
from tests.engine.worker.hosts import timing

KEYS = 4


class RefusingClient:
    """Answers pulls; refuses the first push; a handle waited for twice is a ProtocolError, as
    in ``ParameterClient``."""

    def __init__(self) -> None:
        self._ids = iter(range(1, 10**6))
        self.open: set[int] = set()

    def _handle(self, kind: type[Any]) -> Handle[Any]:
        handle = Handle(next(self._ids), kind)
        self.open.add(handle.request_id)
        return handle

    def pull(self, keys: KeyRange, out: np.ndarray, *, clock: int) -> Handle[PullResult]:
        return self._handle(PullResult)

    def push(self, keys: KeyRange, values: np.ndarray, **header: Any) -> Handle[PushResult]:
        return self._handle(PushResult)

    def wait(self, handle: Handle[Any], timeout: float | None = None) -> Any:
        if handle.request_id not in self.open:
            raise ProtocolError(f"unknown or already awaited request id {handle.request_id}")
        self.open.discard(handle.request_id)
        if handle.kind is PullResult:
            return PullResult({0: 0}, 0.0, 10, 10)
        raise RemoteError("shard server 0 refused the push: BadPayload: too large")


def test_a_refused_push_fails_the_loop_with_the_servers_reason() -> None:
    config = build_config({}, {"data.dataset": "digits", "train.epochs": 1,
                               "sync.model": "asp", "train.overlap": True})
    worker = SimpleNamespace(
        client=RefusingClient(), config=config, layout=KeyLayout.single(KEYS),
        keys=KeyRange(0, KEYS), rank=0, **timing(),
        record=lambda row, layers=None: None, should_stop=lambda: False,
        epoch_done=lambda epoch: None)
    model = SimpleNamespace(params_np=np.zeros(KEYS, dtype=np.float32),
                            grads_np=np.ones(KEYS, dtype=np.float32))

    class Constant(OverlappedLoop):
        def compute(self, shard: Shard, batch: np.ndarray) -> float:
            return 1.0

    loop = Constant(worker, model)  # type: ignore[arg-type]
    shard = Shard(np.zeros((6, 2), dtype=np.float32), np.zeros(6, dtype=np.int64), batch_size=2)
    with pytest.raises(RemoteError, match="too large"):
        loop.train(shard)

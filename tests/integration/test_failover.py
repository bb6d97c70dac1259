"""Chain replication with a raw client: every acknowledged push survives its primary's death.

The coordinator and two shard servers (one backup of each key range) run as real processes;
this test is worker 0. It pushes a known sequence of gradients, kills shard 0's primary with
SIGKILL while a push is in flight, goes on pushing, and checks that the new primary holds
exactly the values the acknowledged pushes imply: bit for bit, so that no update was lost and
none was applied twice.
"""

from __future__ import annotations

import json
import os
import secrets
import select
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import numpy as np
import pytest

from engine.aio import LoopThread
from engine.config import RunConfig
from engine.keys import KeyRange
from engine.roles.control import SyncControl
from engine.roles.worker import connect_client
from engine.transport import WebSocketTransport
from engine.transport.admission import credential
from engine.wire.messages import Hello
from engine.wire.protocol import ANY_CLOCK, Role
from tests.integration.support import config, query, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]
LR = 0.5
PUSHES, KILL_AT = 40, 20


def _spawn(args: list[str], env: dict[str, str], log: Path,
           stdout: int | None = None) -> subprocess.Popen[bytes]:
    with log.open("wb") as handle:
        return subprocess.Popen([sys.executable, "-m", "engine.roles", *args], env=env,
                                stdin=subprocess.DEVNULL, stderr=handle,
                                stdout=stdout if stdout is not None else handle)


def _announced(coordinator: subprocess.Popen[bytes], timeout: float = 60.0) -> str:
    assert coordinator.stdout is not None
    deadline, line = time.monotonic() + timeout, b""
    while time.monotonic() < deadline and not line.endswith(b"\n"):
        ready, _, _ = select.select([coordinator.stdout], [], [], 0.2)
        if ready:
            line += os.read(coordinator.stdout.fileno(), 4096)
    assert line.startswith(b"PSCTL_COORDINATOR "), line
    return line.split()[1].decode()


def test_every_acknowledged_push_survives_the_death_of_its_primary(tmp_path: Path) -> None:
    run_config = config(data__dataset="digits", model__hidden=(16,), cluster__workers=1,
                        cluster__servers=2, cluster__replicas=1, sync__model="asp",
                        optimizer__momentum=0.0, optimizer__lr=LR,
                        cluster__connect_timeout_s=150.0)
    (tmp_path / "config.json").write_text(json.dumps(run_config.to_json_dict()))
    token, db = secrets.token_urlsafe(32), tmp_path / "experiments.db"
    env = dict(os.environ, PSCTL_TOKEN=token, PYTHONUNBUFFERED="1")
    coordinator = _spawn(["coordinator", "--config", str(tmp_path / "config.json"), "--run-id",
                          uuid.uuid4().hex, "--name", "failover", "--db", str(db)], env,
                         tmp_path / "coordinator.log", stdout=subprocess.PIPE)
    started = [coordinator]
    io = LoopThread("failover-test-io")
    try:
        address = _announced(coordinator)
        started += [_spawn(["server", "--coordinator", address, "--rank", str(rank)], env,
                           tmp_path / f"server-{rank}.log") for rank in (0, 1)]
        me = credential(token, "worker", 0)
        control, welcome = SyncControl.open(io, WebSocketTransport(), address,
                                            Hello(role="worker", rank=0, pid=os.getpid()),
                                            token=me, timeout=60.0)
        assert welcome.backups and all(len(b) == 1 for b in welcome.backups.values())
        client = connect_client(WebSocketTransport(), welcome,
                                RunConfig.model_validate(welcome.config), Role.WORKER, 0, me, io,
                                duplicates_ok=True)
        keys = KeyRange(0, welcome.num_keys)
        expected = np.linspace(-1, 1, len(keys), dtype=np.float32)
        client.wait(client.init(expected.copy()))
        rng = np.random.default_rng(7)
        for clock in range(PUSHES):
            grad = rng.standard_normal(len(keys)).astype(np.float32)
            handle = client.push(keys, grad, clock=clock, base_versions={})
            if clock == KILL_AT:  # in flight: applied, forwarded, or neither
                os.kill(started[1].pid, signal.SIGKILL)
            client.wait(handle, timeout=30.0)  # acknowledged: the chain's tail applied it
            expected -= np.multiply(grad, np.float32(LR))
        held = np.empty(len(keys), dtype=np.float32)
        client.wait(client.pull(keys, held, clock=ANY_CLOCK), timeout=30.0)
        np.testing.assert_array_equal(held, expected)
        complete = wait_for(lambda: query(db, "SELECT detail FROM events WHERE kind = "
                                              "'failover_complete'"), 10, "the failover")
        seconds = json.loads(complete[0][0])["seconds"]
        assert 0 < seconds <= 1.0
        assert query(db, "SELECT count(*) FROM events WHERE kind = 'server_lost'")[0][0] == 1
        client.close()
        control.close()
    finally:
        io.stop()
        for process in started:
            if process.poll() is None:
                process.kill()
            process.wait(10)

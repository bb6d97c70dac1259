"""docs/security.md states the limits the code enforces, and its example runs as written."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from engine.config import ClusterConfig, OptimizerConfig
from engine.server.service import MAX_BAD_FRAMES, ServerLimits
from engine.transport.websocket import CLOSE_TIMEOUT_S, PING_TIMEOUT_S
from engine.wire.protocol import MAX_KEY, MIN_FRAME_LIMIT
from tests.conftest import REPO

DOC = (REPO / "docs" / "security.md").read_text()
MIB = 2**20


def limit(name: str) -> str:
    """The default column of the limits table row named ``name``."""
    match = re.search(rf"^\| {re.escape(name)} \| ([^|]+) \|", DOC, flags=re.M)
    assert match is not None, f"no row {name!r} in docs/security.md"
    return match.group(1).strip()


def test_the_limits_table_states_the_defaults_in_force() -> None:
    cluster, limits = ClusterConfig(), ServerLimits()
    assert limit("frame size") == f"{cluster.max_frame_bytes // MIB} MiB"
    assert limit("unread reply bytes queued per connection") == \
        f"{cluster.max_queued_bytes // MIB} MiB"
    assert cluster.max_queued_bytes == limits.max_queued_bytes
    assert limit("pulls waiting for a clock per sender") == str(cluster.max_pending_pulls)
    assert cluster.max_pending_pulls == limits.max_pending_pulls
    assert limit("unread reply bytes queued per server process") == \
        f"{cluster.max_server_queued_bytes // MIB} MiB"
    assert cluster.max_server_queued_bytes == limits.max_server_queued_bytes
    assert limit("pulls waiting for a clock per server process") == \
        str(cluster.max_server_pending_pulls)
    assert cluster.max_server_pending_pulls == limits.max_server_pending_pulls
    assert MIN_FRAME_LIMIT == 64 * 1024 and limit("declared sizes") == \
        "what the shard's key count allows (at least 64 KiB)"
    assert limit("invalid frames per connection") == str(MAX_BAD_FRAMES)
    assert limit("log lines about one peer's refused frames") == \
        f"{limits.warnings_per_minute} per minute"
    assert MAX_KEY == 2**63 - 1 and limit("key space") == "2^63 − 1 keys"
    assert OptimizerConfig().clip_norm is None and limit(
        "gradient norm clip (per push, per shard)") == "off"
    assert limit("silent peer") == f"{PING_TIMEOUT_S:.0f} s without a pong"
    assert limit("closing handshake") == f"{CLOSE_TIMEOUT_S:.0f} s"


def blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", DOC, flags=re.S)


@pytest.mark.integration
@pytest.mark.timeout(300)
def test_the_example_runs_with_the_settings_it_shows(tmp_path: Path) -> None:
    (toml,) = blocks("toml")
    name = toml.partition("\n")[0].removeprefix("#").strip()
    (tmp_path / name).write_text(toml)
    env = {**os.environ, "PSCTL_DB": str(tmp_path / "experiments.db"), "NO_COLOR": "1",
           "XDG_CONFIG_HOME": str(tmp_path / "xdg")}
    (command,) = blocks("bash")
    words = shlex.split(command)
    assert words[0] == "psctl"
    launched = subprocess.run([sys.executable, "-m", "psctl", *words[1:], "--no-live"],
                              cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=240, check=False)
    assert launched.returncode == 0, launched.stderr
    shown = subprocess.run([sys.executable, "-m", "psctl", "runs", "show", "@last", "--json"],
                           cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60,
                           check=False)
    assert shown.returncode == 0, shown.stderr
    config = json.loads(shown.stdout)["config"]
    assert config["cluster"]["max_queued_bytes"] == 16 * MIB
    assert config["cluster"]["max_pending_pulls"] == 256
    assert config["optimizer"]["clip_norm"] == 5.0


def test_the_new_limits_of_issue_57_are_stated_as_in_force() -> None:
    from engine.server.limits import MEMORY_SHARE
    from engine.wire.protocol import MAX_LIST_KEYS

    assert limit("keys one key-list push or pull names") == f"{MAX_LIST_KEYS:,}"
    assert MEMORY_SHARE == 0.25 and ClusterConfig().server_memory is None
    assert limit("bytes of sparse keys a server process stores") == (
        "a quarter of the machine's memory over `cluster.servers`")

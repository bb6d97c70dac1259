"""Every role a child process of the launcher, on this machine."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.hosts import RoleEnv, RoleProcess, fresh_wave, read_announcement, tail, with_node


@dataclass
class LocalProcess:
    process: subprocess.Popen[bytes]
    log: Path
    node: str

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def returncode(self) -> int | None:
        return self.process.returncode

    def poll(self) -> int | None:
        return self.process.poll()

    def wait(self, timeout: float | None = None) -> int:
        return self.process.wait(timeout)

    def send_signal(self, sig: int) -> None:
        self.process.send_signal(sig)

    def kill(self) -> None:
        self.process.kill()

    def log_tail(self, lines: int = 12) -> str:
        return tail(self.log, lines)


class LocalHosts:
    """Children of this process, each in its own session (a terminal's Ctrl-C reaches the
    launcher alone, which then stops them in order), bound to ``host``."""

    def __init__(self, host: str, *, append: bool = False) -> None:
        self.host = host
        self.append = append  # a resumed run logs on in the same files

    def open(self, run_id: str) -> None:
        return None

    def start(self, role: str, rank: int, args: list[str], env: RoleEnv, log: Path, *,
              announce: bool = False) -> RoleProcess:
        return self._popen(args, env, log, "ab" if self.append else "wb", announce=announce)

    def restart(self, process: RoleProcess, role: str, rank: int, args: list[str],
                env: RoleEnv, log: Path) -> RoleProcess:
        return self._popen(args, env, log, "ab")

    def announcement(self, process: RoleProcess, timeout: float) -> str | None:
        assert isinstance(process, LocalProcess)
        return read_announcement(process.process, timeout)

    def close(self) -> None:
        return None

    def wave(self) -> int:
        return fresh_wave()

    def start_up(self) -> dict[str, Any]:
        return {"mode": "fresh", "note": None}

    def _popen(self, args: list[str], env: RoleEnv, log: Path, mode: str, *,
               announce: bool = False) -> LocalProcess:
        with log.open(mode) as handle:
            process = subprocess.Popen(
                [sys.executable, "-m", "engine.roles", *with_node(args, self.host)],
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE if announce else handle,
                stderr=handle, env=env.over(os.environ), start_new_session=True)
        return LocalProcess(process, log, self.host)


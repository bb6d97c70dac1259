"""Serving the dashboard: in the foreground (``psctl ui``) or beside a run (``launch --ui``)."""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path

import uvicorn

from engine.errors import ConfigError

DEFAULT_HOST = "127.0.0.1"  # only this machine, unless asked otherwise
DEFAULT_PORT = 8765


def _config(db: Path, host: str, port: int) -> uvicorn.Config:
    from uvicorn.config import WS_PROTOCOLS

    from webui.app import create_app

    # The sans-I/O implementation avoids the deprecated legacy websockets API where it exists.
    ws = "websockets-sansio" if "websockets-sansio" in WS_PROTOCOLS else "auto"
    return uvicorn.Config(create_app(db), host=host, port=port, log_level="warning", ws=ws,
                          lifespan="on")


def listening_socket(host: str, port: int) -> socket.socket:
    """A socket bound to ``host:port``. Bound here rather than by uvicorn, which logs a bad
    address and exits the process itself; this raises ConfigError saying which address failed."""
    if not 0 <= port <= 65535:  # getaddrinfo would silently take it modulo 65536
        raise ConfigError(f"cannot serve the dashboard on {host}:{port}: ports go up to 65535")
    sock: socket.socket | None = None
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM)[0]
        sock = socket.socket(family, kind, proto)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
    except OSError as exc:
        if sock is not None:
            sock.close()
        reason = exc.strerror or str(exc)
        raise ConfigError(f"cannot serve the dashboard on {host}:{port}: {reason}") from None
    return sock


def serve(db: Path, sock: socket.socket) -> None:
    """Serve on ``sock`` (see :func:`listening_socket`) until interrupted."""
    host, port = sock.getsockname()[:2]
    with sock:
        uvicorn.Server(_config(db, host, port)).run(sockets=[sock])


class BackgroundServer:
    """The dashboard in a daemon thread of this process; ``stop()`` shuts it down."""

    def __init__(self, db: Path, host: str = DEFAULT_HOST, port: int = DEFAULT_PORT) -> None:
        self.server = uvicorn.Server(_config(db, host, port))
        # uvicorn takes signals only on the main thread, so Ctrl-C stays the launcher's.
        self.thread = threading.Thread(target=self.server.run, name="psctl-ui", daemon=True)

    def start(self, timeout_s: float = 10.0) -> str:
        """Start serving; the address once it listens (port 0 picks a free port)."""
        self.thread.start()
        deadline = time.monotonic() + timeout_s
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the dashboard did not start (is the port in use?)")
            time.sleep(0.02)
        host, port = self.server.servers[0].sockets[0].getsockname()[:2]
        return f"http://{host}:{port}"

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=5)

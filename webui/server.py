"""Serving the dashboard: in the foreground (``psctl ui``) or beside a run (``launch --ui``)."""

from __future__ import annotations

import errno
import signal
import socket
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from types import FrameType

import uvicorn

from engine.errors import ConfigError

DEFAULT_HOST = "127.0.0.1"  # only this machine, unless asked otherwise
DEFAULT_PORT = 8765
# uvicorn waits for open connections before it exits; a page's live websocket never ends on its
# own, so without a bound Ctrl-C would leave the server up as long as a browser tab is open.
# The live loops (webui.live) end as soon as uvicorn closes their socket; this is the backstop.
SHUTDOWN_GRACE_S = 1  # seconds (uvicorn takes whole ones)


def _config(db: Path, host: str, port: int, allow: Sequence[str] = ()) -> uvicorn.Config:
    from uvicorn.config import WS_PROTOCOLS

    from webui.app import create_app
    from webui.guard import served_names

    # The sans-I/O implementation avoids the deprecated legacy websockets API where it exists.
    ws = "websockets-sansio" if "websockets-sansio" in WS_PROTOCOLS else "auto"
    return uvicorn.Config(create_app(db, served_names(host, allow)), host=host, port=port,
                          log_level="warning", ws=ws, lifespan="on",
                          timeout_graceful_shutdown=SHUTDOWN_GRACE_S)


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
        # Listening now: a browser opened at the printed address queues until uvicorn accepts,
        # instead of being refused in between.
        sock.listen(2048)
    except OSError as exc:
        if sock is not None:
            sock.close()
        reason = exc.strerror or str(exc)
        raise ConfigError(f"cannot serve the dashboard on {host}:{port}: {reason}") from None
    return sock


def port_taken(exc: ConfigError) -> bool:
    """Whether :func:`listening_socket` failed because something already listens there."""
    cause = exc.__context__
    return isinstance(cause, OSError) and cause.errno == errno.EADDRINUSE


def serve(db: Path, sock: socket.socket, allow: Sequence[str] = ()) -> None:
    """Serve on ``sock`` (see :func:`listening_socket`) until interrupted, answering to the
    host names in ``allow`` besides the bound ones (see :func:`webui.guard.served_names`)."""
    host, port = sock.getsockname()[:2]
    with sock:
        uvicorn.Server(_config(db, host, port, allow)).run(sockets=[sock])


class BackgroundServer:
    """The dashboard in a daemon thread of this process, on ``host:port`` (0: any free port;
    ConfigError, see :func:`port_taken`, when it cannot be bound); ``stop()`` shuts it down."""

    def __init__(self, db: Path, host: str = DEFAULT_HOST, port: int = DEFAULT_PORT) -> None:
        # Bound here rather than by uvicorn, which would log its own bind error.
        self.sock = sock = listening_socket(host, port)
        host, port = sock.getsockname()[:2]
        self.address = f"http://{host}:{port}"
        self.server = uvicorn.Server(_config(db, host, port))
        # uvicorn takes signals only on the main thread, so Ctrl-C stays the launcher's.
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [sock]},
                                       name="psctl-ui", daemon=True)

    def start(self, timeout_s: float = 10.0) -> str:
        """Start serving; the address once it listens."""
        self.thread.start()
        deadline = time.monotonic() + timeout_s
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("the dashboard did not start")
            time.sleep(0.02)
        return self.address

    def stop(self) -> None:
        self.server.should_exit = True
        # SHUTDOWN_GRACE_S bounds uvicorn's own wait; the rest is margin for the lifespan.
        self.thread.join(timeout=SHUTDOWN_GRACE_S + 2)
        self.sock.close()

    def serve_until_signalled(self, poll_s: float = 0.2) -> None:
        """Keep serving until SIGINT or SIGTERM (call from the main thread), then stop."""
        stop = threading.Event()

        def on_signal(_signum: int, _frame: FrameType | None) -> None:
            stop.set()

        previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            # Short waits in a loop: the dashboard thread dying must end this too.
            while not stop.wait(poll_s) and self.thread.is_alive():
                pass
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            self.stop()

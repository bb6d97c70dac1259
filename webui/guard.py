"""Which requests the dashboard answers: the Host and Origin checks against DNS rebinding and
cross-site writes.

A page on another site can make the browser talk to ``127.0.0.1``: directly (cross-site
requests and websockets, which carry that page's ``Origin``), or by pointing its own name at
127.0.0.1 (DNS rebinding: the requests then carry the page's name as ``Host`` and are
same-origin to the browser). So every request must name the dashboard by a host it is served
as, and every write and every websocket that a browser marks with an Origin must come from
that same origin. Clients that send no Origin (curl, scripts) are not browsers running someone
else's page, and are let through.

Starlette's ``TrustedHostMiddleware`` checks the Host alone and answers "Invalid host header"
without naming the host or the way to allow it; one small middleware here checks both headers
and says what to do.
"""

from __future__ import annotations

import ipaddress
import json
import socket
from collections.abc import Iterable
from urllib.parse import urlsplit

from starlette.types import ASGIApp, Receive, Scope, Send

LOOPBACK_NAMES = ("127.0.0.1", "localhost", "::1")
WILDCARDS = ("0.0.0.0", "::", "")
UNSAFE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
ALLOW_HOST_OPTION = "--allow-host"


def served_names(bound: str, extra: Iterable[str] = ()) -> tuple[str, ...]:
    """The host names requests may use: loopback, the bound address, the machine's own names
    when bound to every interface, and those the user allows (``*``: any)."""
    names = [*LOOPBACK_NAMES, _bare(bound)]
    if _bare(bound) in WILDCARDS:
        names += [socket.gethostname(), socket.getfqdn()]
    names += [_bare(name) for name in extra]
    return tuple(dict.fromkeys(name.lower() for name in names if name))


def _bare(host: str) -> str:
    return host.strip().removeprefix("[").removesuffix("]").lower()


def _is_address(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _split_host(value: str) -> tuple[str, int | None] | None:
    """(host, port) of a Host header, or None when it is not one."""
    try:
        parts = urlsplit(f"//{value}")
        port = parts.port
    except ValueError:
        return None
    if not parts.hostname or parts.username is not None or parts.path:
        return None
    return parts.hostname.lower(), port


class HostOriginGuard:
    """ASGI middleware: refuses (403, one line) a request whose Host is not a name the
    dashboard is served as, and a write or websocket whose Origin (for writes: or Referer) is
    another origin."""

    def __init__(self, app: ASGIApp, names: Iterable[str]) -> None:
        self.app = app
        self.names = frozenset(_bare(name) for name in names)
        self.any_host = "*" in self.names
        # Bound to every interface, the dashboard is reached by whatever address the network
        # gives it; a rebinding page can only send a name, never an address, as its Host.
        self.any_address = bool(self.names & set(WILDCARDS))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] in ("http", "websocket"):
            problem = self.refusal(scope)
            if problem is not None:
                await _refuse(scope, receive, send, problem)
                return
        await self.app(scope, receive, send)

    def refusal(self, scope: Scope) -> str | None:
        """Why this request is refused, in one line; None when it is served."""
        headers = {k.decode("latin-1").lower(): v.decode("latin-1")
                   for k, v in scope.get("headers", ())}
        host = headers.get("host", "")
        problem = self._host_problem(host)
        if problem is not None:
            return problem
        if scope["type"] == "http" and scope.get("method", "GET") not in UNSAFE_METHODS:
            return None
        origin = headers.get("origin")
        if origin is None and scope["type"] == "http":
            origin = headers.get("referer")
        if origin is None or same_origin(origin, host):
            return None
        what = "websocket" if scope["type"] == "websocket" else "write"
        return (f"refused a {what} from another site (origin {_short(origin)}, the dashboard is "
                f"{_short(host)}): only the dashboard's own pages may write or stream")

    def _host_problem(self, host: str) -> str | None:
        if self.any_host:
            return None
        parsed = _split_host(host)
        if parsed is not None:
            name = parsed[0]
            if name in self.names or (self.any_address and _is_address(name)):
                return None
        allowed = ", ".join(sorted(self.names))
        return (f"refused a request for host {_short(host) or '(none)'}: the dashboard answers "
                f"only to {allowed} (a page from another site may be trying to reach it through "
                f"DNS rebinding); to serve it under that name too, start it with "
                f"{ALLOW_HOST_OPTION} NAME")


def same_origin(origin: str, host: str) -> bool:
    """Whether ``origin`` (an Origin or Referer) names the host and port this request was sent
    to. The scheme is not compared: behind a reverse proxy that ends TLS the page is https and
    the request reaching the dashboard http, and one port serves one scheme anyway."""
    try:
        parts = urlsplit(origin)
        port = parts.port
    except ValueError:
        return False
    own = _split_host(host)
    if own is None or not parts.hostname or parts.scheme not in ("http", "https"):
        return False
    return parts.hostname.lower() == own[0] and port == own[1]


def _short(value: str, limit: int = 80) -> str:
    """A header value fit for a one-line message: printable and bounded."""
    shown = "".join(c if c.isprintable() else "?" for c in value[:limit])
    return repr(shown + ("…" if len(value) > limit else ""))


async def _refuse(scope: Scope, receive: Receive, send: Send, problem: str) -> None:
    body = json.dumps({"detail": problem}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if scope["type"] == "http":
        await send({"type": "http.response.start", "status": 403, "headers": headers})
        await send({"type": "http.response.body", "body": body})
        return
    # Closed before the upgrade, uvicorn answers HTTP 403 (its denial-response path logs a
    # spurious "returned without completing handshake" with the sans-I/O websockets); 1008 is
    # "policy violation" for servers that do accept first.
    await send({"type": "websocket.close", "code": 1008, "reason": problem[:120]})

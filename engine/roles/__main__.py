"""Entry point of every role process: ``python -m engine.roles ROLE [options]``.

The launcher starts these, but each can be started by hand or by a cluster scheduler on another
machine: everything a role needs is its arguments plus, in the environment, ``PSCTL_TOKEN``
(the run's secret: the coordinator and the servers, which admit others) or ``PSCTL_CREDENTIAL``
(a worker's or the evaluator's own credential, ``engine.transport.admission``).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import sys
import traceback
from pathlib import Path

from engine import plugins
from engine.errors import PsctlError
from engine.roles import lifecycle
from engine.roles.lifecycle import join_token, setup_logging


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m engine.roles")
    roles = parser.add_subparsers(dest="role", required=True)
    coordinator = roles.add_parser("coordinator", help="admit roles, record the run")
    coordinator.add_argument("--config", type=Path, required=True, help="resolved config JSON")
    coordinator.add_argument("--run-id", required=True)
    coordinator.add_argument("--name", required=True)
    coordinator.add_argument("--db", type=Path, required=True)
    coordinator.add_argument("--host", default="127.0.0.1")
    coordinator.add_argument("--port", type=int, default=0)
    coordinator.add_argument("--resume-from", type=Path, default=None,
                             help="continue the run from this checkpoint folder")
    coordinator.add_argument("--resume-seq", type=int, default=0)
    coordinator.add_argument("--announce-file", type=Path, default=None,
                             help="say where it listens in this file instead of on stdout")
    for role in ("server", "worker", "evaluator"):
        sub = roles.add_parser(role)
        sub.add_argument("--coordinator", required=True, help="ws://host:port of the coordinator")
        sub.add_argument("--rank", type=int, default=0)
        sub.add_argument("--host", default="127.0.0.1",
                         help="this role's address: a server listens on it, and every role "
                         "connects from it")
        sub.add_argument("--max-frame-bytes", type=int, default=64 * 2**20,
                         help="largest frame accepted (cluster.max_frame_bytes)")
    return parser


def main(argv: list[str] | None = None, *, die_with_parent: bool = True) -> int:
    """Run one role; ``die_with_parent``: ask the kernel to end it with its launcher (a
    role started by hand or by another scheduler is not tied to its parent)."""
    args = _parser().parse_args(argv)
    if die_with_parent:
        lifecycle.die_with_parent()
    else:  # started by hand: not by the launcher, which sets the allocator in the environment
        lifecycle.keep_large_blocks_mapped()
    setup_logging(args.role, getattr(args, "rank", 0))
    token = join_token(args.role, getattr(args, "rank", 0))
    try:
        return _run(args, token)
    except PsctlError as exc:
        print(f"psctl {args.role} {getattr(args, 'rank', 0)}: {exc}", file=sys.stderr)
        return 1
    except Exception:  # the launcher shows this log's tail when a role dies
        traceback.print_exc()
        return 1


def _run(args: argparse.Namespace, token: str) -> int:
    from engine.transport.schemes import SchemeTransport

    plugins.load()  # the run's policies from outside psctl, as its launcher saw them

    if args.role == "coordinator":
        return _coordinator(args, token)
    # Outgoing connections leave from the role's own address too (a node of a cluster, or a
    # 127.0.0.x of its own on one machine).
    # It reaches each peer by its address's scheme (the coordinator on ws://, the shard servers
    # on what cluster.transport says).
    transport = SchemeTransport(max_frame_bytes=args.max_frame_bytes, source=args.host)
    if args.role == "server":
        from engine.roles.server import run_server

        # The modules' objects (about 57k) never die: out of the collector's sight, a full
        # collection takes microseconds instead of holding the shard's event loop 10-35 ms.
        gc.freeze()
        asyncio.run(run_server(transport, args.coordinator, args.rank, token=token,
                               host=args.host))
    elif args.role == "worker":
        from engine.roles.worker import run_worker

        run_worker(transport, args.coordinator, args.rank, token=token, node=args.host)
    else:
        from engine.roles.evaluator import run_evaluator

        run_evaluator(transport, args.coordinator, token=token, node=args.host)
    return 0


def _coordinator(args: argparse.Namespace, token: str) -> int:
    from engine.config import RunConfig
    from engine.roles.coordination import Resume
    from engine.roles.coordinator import (
        EXIT_CODES,
        announce_in_file,
        announce_on_stdout,
        coordinate,
    )
    from engine.transport import WebSocketTransport

    config = RunConfig.model_validate_json(args.config.read_text())
    transport = WebSocketTransport(max_frame_bytes=config.cluster.max_frame_bytes)
    status = asyncio.run(coordinate(config, run_id=args.run_id, name=args.name, token=token,
                                    db=args.db, transport=transport, host=args.host,
                                    port=args.port,
                                    announce=announce_on_stdout if args.announce_file is None
                                    else announce_in_file(args.announce_file),
                                    folder=args.config.resolve().parent,
                                    resume=None if args.resume_from is None else
                                    Resume(args.resume_from, args.resume_seq)))
    return EXIT_CODES.get(status, 1)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())

"""Which node each role of a run ran on, from the events its roles joined with (``psctl runs
show``); a role that was restarted is counted where it last ran."""

from __future__ import annotations

from urllib.parse import urlsplit

from sqlalchemy import Connection, select

from engine.db.schema import events, parse_json

_KINDS = ("coordinator_listening", "process_joined", "worker_rejoined", "server_rejoined",
          "evaluator_rejoined")


def role_nodes(conn: Connection, run_id: str) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """(node address, the roles on it) per node, nodes in address order."""
    rows = conn.execute(select(events.c.kind, events.c.detail).where(
        events.c.run_id == run_id, events.c.kind.in_(_KINDS)).order_by(events.c.id)).all()
    where: dict[str, str] = {}
    for kind, detail in rows:
        found = parse_json(detail)
        if kind == "coordinator_listening":
            node = urlsplit(str(found.get("address", ""))).hostname
            name = "coordinator"
        else:
            node = found.get("node")
            role = found.get("role", "worker" if kind == "worker_rejoined" else "server")
            name = "evaluator" if role == "evaluator" else f"{role} {found.get('rank')}"
        if node:
            where[name] = str(node)
    by_node: dict[str, list[str]] = {}
    for name, node in where.items():
        by_node.setdefault(node, []).append(name)
    return tuple((node, tuple(sorted(names, key=_order)))
                 for node, names in sorted(by_node.items()))


def _order(name: str) -> tuple[int, int]:
    role, _, rank = name.partition(" ")
    return (("coordinator", "server", "evaluator", "worker").index(role),
            int(rank) if rank.isdigit() else 0)

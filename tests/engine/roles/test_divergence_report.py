"""The coordinator ends a run whose worker reports divergence, saying so (and recording it)."""

from __future__ import annotations

import asyncio
from typing import Any

from engine.plan import build_config
from engine.roles.coordination import Coordinator
from engine.roles.coordinator import model_layout
from engine.roles.peer import Peer
from engine.wire.messages import Fatal
from engine.wire.records import RunStatus


class _Events:
    def __init__(self) -> None:
        self.rows: list[Any] = []

    def record_event(self, row: Any) -> None:
        self.rows.append(row)

    def __getattr__(self, name: str) -> Any:
        return lambda *args: None


def test_a_worker_reporting_divergence_fails_the_run_with_its_words() -> None:
    async def main() -> tuple[tuple[RunStatus, str | None], list[Any]]:
        config = build_config({}, {"data.dataset": "digits", "cluster.workers": 2})
        events = _Events()
        coordinator = Coordinator(config, run_id="d" * 32, token="t",
                                  layout=model_layout(config), recorder=events)
        peer = Peer("worker", 1, None, welcomed=True, pid=1)  # type: ignore[arg-type]
        said = "the model diverged: worker 1 at iteration 4: its training loss is nan"
        coordinator._on_message(peer, Fatal(message=said, diverged=True))
        return await asyncio.wait_for(coordinator.outcome, 1), events.rows

    (status, reason), rows = asyncio.run(main())
    assert status is RunStatus.FAILED and reason is not None
    assert reason.startswith("the model diverged: worker 1 at iteration 4")
    diverged = [row for row in rows if row.kind == "diverged"]
    assert len(diverged) == 1 and diverged[0].detail["rank"] == 1

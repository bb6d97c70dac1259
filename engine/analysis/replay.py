"""Replay a recorded run's timings through ElasticBSP's predictor and ZipLine, offline.

For each decision point the replay rebuilds what a live controller knew (every worker's push
times and waits up to its barrier clock, read from ``iterations``), predicts the next R end times
with the chosen predictor, lets ZipLine choose, and compares with what the run actually did:
the recorded push times of the chosen iterations (prediction error, the spread they really had)
and, for an ElasticBSP run, the recorded decision and the wait observed at that barrier.

Decision points are the recorded barriers of an ElasticBSP run; for any other run, common clocks
1, 1 + R, 1 + 2R, ... (as if a barrier had been placed there). Values pass through the same
nanosecond rounding as on the wire, so replaying an ElasticBSP run with its own settings gives
exactly its recorded decisions.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
from sqlalchemy import Engine, select

from engine.config import HistorySeed
from engine.consistency.elastic import candidates
from engine.consistency.timings import TimingHistory, predict_end_times
from engine.consistency.zipline import search
from engine.db.schema import iterations, runs, syncs, translate_errors
from engine.errors import DataError
from engine.wire.protocol import from_ns, to_ns


@dataclass(frozen=True)
class ReplayedSync:
    index: int
    base_clocks: list[int]
    start: float
    chosen: list[int]
    predicted_wait: float  # d: the spread ZipLine expects at the chosen iterations (s)
    actual_spread: float | None  # the spread the recorded push times had there (s)
    mean_abs_error: float | None  # |predicted - recorded| end time over the chosen iterations
    recorded_wait: float | None  # ElasticBSP runs: the wait observed at this barrier
    matches_recorded: bool | None  # ElasticBSP runs: same choice as the live controller


@dataclass(frozen=True)
class Replay:
    run_id: str
    lookahead: int
    predictor: str
    source: str  # "recorded barriers" or "every R clocks"
    syncs: list[ReplayedSync]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class _Pushes:
    """Per worker: push times and waits by clock, rounded as the frames carried them."""

    def __init__(self, rows: list[Any], workers: int) -> None:
        self.at: list[dict[int, float]] = [{} for _ in range(workers)]
        self.waited: list[dict[int, float]] = [{} for _ in range(workers)]
        for worker, clock, pushed_at, wait_s in rows:
            self.at[worker][clock] = from_ns(to_ns(pushed_at))
            self.waited[worker][clock] = from_ns(to_ns(wait_s))

    def history(self, worker: int, upto: int, seed: tuple[float, ...]) -> TimingHistory:
        history = TimingHistory(1)
        history.seed(0, seed)
        for clock in range(upto + 1):
            if clock in self.at[worker]:
                history.observe(0, self.at[worker][clock], self.waited[worker][clock])
        return history

    def last_clock(self, worker: int) -> int:
        return max(self.at[worker], default=-1)


def replay_run(engine: Engine, run_id: str, *, lookahead: int | None = None,
               predictor: str | None = None) -> Replay:
    with translate_errors("reading the run to replay"), engine.connect() as conn:
        run = conn.execute(select(runs.c.config_json, runs.c.workers)
                           .where(runs.c.id == run_id)).one()
        rows = conn.execute(select(iterations.c.worker, iterations.c.iteration,
                                   iterations.c.pushed_at, iterations.c.wait_s)
                            .where(iterations.c.run_id == run_id,
                                   iterations.c.pushed_at.is_not(None))).all()
        recorded = conn.execute(select(syncs).where(syncs.c.run_id == run_id)
                                .order_by(syncs.c.sync_index)).all()
    sync_config = json.loads(run.config_json).get("sync", {})
    lookahead = lookahead or int(sync_config.get("lookahead", 15))
    # A run recorded before sync.max_ahead had no bound; one with it searched min(R, bound).
    searched = candidates(lookahead, int(sync_config.get("max_ahead", lookahead)))
    predictor = predictor or str(sync_config.get("predictor", "ewma"))
    pushes = _Pushes([tuple(r) for r in rows], run.workers)
    seeds = _seeds(sync_config.get("history"), run.workers)
    decided = [r for r in recorded if r.predictor != "monitoring"]
    points = ([(r.sync_index, json.loads(r.base_clocks), r) for r in decided] if decided
              else [(i, [c] * run.workers, None) for i, c in
                    enumerate(range(1, _common_last(pushes, run.workers), lookahead))])
    replayed = [_replay_point(pushes, seeds, index, base, searched, predictor, row)
                for index, base, row in points]
    source = "recorded barriers" if decided else "every R clocks"
    return Replay(run_id, lookahead, predictor, source, [r for r in replayed if r is not None])


def _seeds(history: dict[str, Any] | None, workers: int) -> list[tuple[float, ...]]:
    if not history:
        return [()] * workers
    seed = HistorySeed.model_validate(history)
    return [seed.intervals[w % len(seed.intervals)] for w in range(workers)]


def _common_last(pushes: _Pushes, workers: int) -> int:
    return min(pushes.last_clock(w) for w in range(workers)) + 1


def _replay_point(pushes: _Pushes, seeds: list[tuple[float, ...]], index: int, base: list[int],
                  lookahead: int, predictor: str, row: Any) -> ReplayedSync | None:
    active = [w for w, b in enumerate(base) if pushes.last_clock(w) > b]
    arrivals = [pushes.at[w].get(b) for w, b in enumerate(base) if b >= 0]
    if not active or None in arrivals:
        return None
    start = max((a for a in arrivals if a is not None), default=0.0)
    estimates = [pushes.history(w, base[w], seeds[w]).estimate(0, predictor) for w in active]
    if None in estimates:
        return None
    times = predict_end_times(np.full(len(active), start), np.array(estimates), lookahead)
    chosen, spread = search(times)
    picks = [-1] * len(base)
    for position, worker in enumerate(active):
        picks[worker] = int(chosen[position])
    actual = [pushes.at[w].get(base[w] + 1 + picks[w]) for w in active]
    predicted = [float(times[p, chosen[p]]) for p in range(len(active))]
    return ReplayedSync(
        index=index, base_clocks=list(base), start=start, chosen=picks,
        predicted_wait=float(spread),
        actual_spread=None if None in actual else max(actual) - min(actual),  # type: ignore[type-var,operator]
        mean_abs_error=_mean_abs_error(predicted, actual),
        recorded_wait=None if row is None else row.actual_wait,
        matches_recorded=None if row is None else json.loads(row.chosen) == picks)


def _mean_abs_error(predicted: list[float], actual: list[float | None]) -> float | None:
    pairs = [(p, a) for p, a in zip(predicted, actual, strict=True) if a is not None]
    return float(np.mean([abs(p - a) for p, a in pairs])) if pairs else None


def history_seed(engine: Engine, run_id: str, *, keep: int = 16) -> HistorySeed:
    """The last ``keep`` busy intervals of each worker of a recorded run, for ``--history``."""
    with translate_errors("reading the history run"), engine.connect() as conn:
        workers = conn.execute(select(runs.c.workers).where(runs.c.id == run_id)).scalar_one()
        rows = conn.execute(select(iterations.c.worker, iterations.c.iteration,
                                   iterations.c.pushed_at, iterations.c.wait_s)
                            .where(iterations.c.run_id == run_id,
                                   iterations.c.pushed_at.is_not(None))).all()
    pushes = _Pushes([tuple(r) for r in rows], workers)
    intervals = [pushes.history(w, pushes.last_clock(w), ()).intervals(0)[-keep:]
                 for w in range(workers)]
    usable = tuple(tuple(i) for i in intervals if i and min(i) > 0)
    if not usable:
        raise DataError(f"run {run_id} recorded no push timings to learn from (it has fewer "
                        "than two pushes per worker, or predates psctl's timing columns)")
    return HistorySeed(run=run_id, intervals=usable)

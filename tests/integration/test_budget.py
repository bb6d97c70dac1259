"""A budget on real processes: every worker trains until it is spent, the run ends for all at
once, and the model is tested at the budget's marks and at its end (issue 41)."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.launcher import Launcher
from tests.integration.support import config, query

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]


def test_a_time_budget_ends_every_worker_together(tmp_path: Path) -> None:
    db = tmp_path / "experiments.db"
    launcher = Launcher(config(data__dataset="digits", cluster__workers=3, cluster__servers=1,
                               sync__model="asp", stop__budget="8s", eval__interval_s=100.0,
                               heterogeneity__stragglers=({"rank": 0, "factor": 3.0},)), db=db)
    launcher.start()
    result = launcher.wait()
    assert result.status.value == "finished" and result.reason == "budget of 8s spent"
    run = launcher.run_id
    ends = [end for (end,) in query(db, "SELECT max(ended_at) FROM iterations WHERE run_id = ? "
                                        "GROUP BY worker", run)]
    first = query(db, "SELECT min(started_at) FROM iterations WHERE run_id = ?", run)[0][0]
    assert len(ends) == 3 and max(ends) - min(ends) < 1.0  # one straggler iteration or so
    assert 7.0 <= max(ends) - first <= 10.0
    # the straggler was not left alone at the end, and the fast workers cycled over their shards
    counts = dict(query(db, "SELECT worker, count(*) FROM iterations WHERE run_id = ? "
                            "GROUP BY worker", run))
    assert counts[1] > counts[0] and counts[1] > 3 * 8  # digits: 8 batches a worker per epoch
    tested = [at - first for (at,) in query(db, "SELECT at FROM evaluations WHERE run_id = ? "
                                                "ORDER BY at", run)]
    assert len(tested) == 4  # at 2, 4 and 6 s of training, and at the end
    for mark, at in zip((2.0, 4.0, 6.0), tested, strict=False):
        assert mark - 0.5 <= at <= mark + 2.0


def test_a_samples_budget_stops_the_run_a_few_iterations_past_it(tmp_path: Path) -> None:
    db = tmp_path / "experiments.db"
    launcher = Launcher(config(data__dataset="digits", cluster__workers=3, cluster__servers=1,
                               sync__model="ssp", stop__budget="3000samples"), db=db)
    launcher.start()
    result = launcher.wait()
    assert result.status.value == "finished" and result.reason == "budget of 3000samples spent"
    (samples,) = query(db, "SELECT sum(samples) FROM iterations WHERE run_id = ?",
                       launcher.run_id)[0]
    # The workers report every 0.05 s: a few iterations each past the budget when idle, more on
    # a loaded machine (3,834 once in CI); how far past is a time, not a bound here. What must
    # hold: it stopped for the budget, far before its 10 epochs' 14,370 samples.
    assert 3000 <= samples <= 3000 + 3 * 20 * 64
    assert query(db, "SELECT count(*) FROM evaluations WHERE run_id = ?",
                 launcher.run_id)[0][0] >= 4  # three marks and the end

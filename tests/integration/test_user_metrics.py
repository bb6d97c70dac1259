"""psctl.log end to end: docs/models.md's commands launch a real run (processes, sockets) of a
user model that logs its gradient's norm every iteration; its values are in the database for
every iteration of every worker, in ``psctl export``, in ``psctl compare`` and its plot, and
charted on the run page in Chromium."""

from __future__ import annotations

import csv
import json
import math
import os
import re
import shutil
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from tests.conftest import REPO, psctl_in_process
from tests.webui.chromium import checked_page, chromium, needs_chromium, screenshot, serving

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

EXAMPLE = "docs/examples/logged_metrics.py"


def doc_commands() -> str:
    """The bash block of docs/models.md's "Metrics you log yourself"."""
    doc = (REPO / "docs" / "models.md").read_text()
    section = doc.split("## Metrics you log yourself", 1)[1].split("\n## ", 1)[0]
    [block] = re.findall(r"```bash\n(.*?)```", section, flags=re.S)
    return str(block)


class Run(NamedTuple):
    folder: Path
    db: Path
    run_id: str
    output: str


@pytest.fixture(scope="module")
def logged(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    folder = tmp_path_factory.mktemp("logged")
    (folder / "docs" / "examples").mkdir(parents=True)
    shutil.copy(REPO / EXAMPLE, folder / EXAMPLE)  # the commands name it relative to the root
    db = folder / "experiments.db"
    env = {**os.environ, "PSCTL_DB": str(db), "NO_COLOR": "1", "COLUMNS": "200",
           "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    done = subprocess.run(["bash", "-ec", doc_commands()], cwd=folder, env=env,
                          capture_output=True, text=True, timeout=240, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    [(run_id, status)] = query(db, "SELECT id, status FROM runs")
    assert status == "finished"
    yield Run(folder, db, run_id, done.stdout + done.stderr)


def query(db: Path, sql: str, *args: Any) -> list[tuple[Any, ...]]:
    with sqlite3.connect(db) as conn:
        return conn.execute(sql, args).fetchall()


def test_every_iteration_of_every_worker_has_its_grad_norm(logged: Run) -> None:
    iterations = query(logged.db, "SELECT worker, iteration FROM iterations ORDER BY 1, 2")
    assert {w for w, _ in iterations} == {0, 1}
    for name in ("grad_norm", "active_fraction"):
        rows = query(logged.db, "SELECT rank, iteration, at, value FROM user_metrics WHERE "
                                "name = ? AND role = 'worker' ORDER BY 1, 2", name)
        assert [(w, i) for w, i, _, _ in rows] == iterations, name
        ended = dict(((w, i), t) for w, i, t in query(
            logged.db, "SELECT worker, iteration, ended_at FROM iterations"))
        assert all(at == ended[(w, i)] for w, i, at, _ in rows)
        assert all(math.isfinite(v) and v > 0 for *_, v in rows)
    # the evaluator ran forward only: its rows are active_fraction, one per evaluation step
    evaluated = query(logged.db, "SELECT DISTINCT step FROM evaluations ORDER BY 1")
    assert query(logged.db, "SELECT iteration FROM user_metrics WHERE role = 'evaluator' "
                            "ORDER BY 1") == evaluated
    assert query(logged.db, "SELECT DISTINCT name FROM user_metrics WHERE role = 'evaluator'") \
        == [("active_fraction",)]


def test_the_export_holds_every_value(logged: Run) -> None:
    with (logged.folder / "logged-csv" / "user_metrics.csv").open() as handle:
        exported = [(r["name"], r["role"], int(r["rank"]), int(r["iteration"]), float(r["value"]))
                    for r in csv.DictReader(handle)]
    stored = query(logged.db, "SELECT name, role, rank, iteration, value FROM user_metrics "
                              "ORDER BY name, role, rank, iteration")
    assert exported == stored
    assert sum(1 for name, *_ in exported if name == "grad_norm") == query(
        logged.db, "SELECT count(*) FROM iterations")[0][0]
    out = logged.folder / "json"
    done = psctl_in_process("export", logged.run_id, "--format", "json", "--out", str(out),
                            db=logged.db)
    assert done.returncode == 0, done.stderr
    rows = json.loads((out / "user_metrics.json").read_text())
    assert [(r["name"], r["role"], r["rank"], r["iteration"], r["value"]) for r in rows] == [
        tuple(row) for row in stored]


def test_compare_shows_the_final_and_mean_value(logged: Run) -> None:
    assert re.search(r"grad_norm\s+final", logged.output), logged.output
    done = psctl_in_process("compare", "logged", "--metric", "grad_norm", "--json", db=logged.db)
    assert done.returncode == 0, done.stderr
    [row] = json.loads(done.stdout)
    lasts = query(logged.db, "SELECT value FROM user_metrics u WHERE name = 'grad_norm' AND "
                             "iteration = (SELECT max(iteration) FROM user_metrics WHERE "
                             "run_id = u.run_id AND name = u.name AND rank = u.rank)")
    assert row["user.grad_norm.final"] == pytest.approx(sum(v for (v,) in lasts) / 2)
    [(mean,)] = query(logged.db, "SELECT avg(value) FROM user_metrics WHERE name = 'grad_norm'")
    assert row["user.grad_norm.mean"] == pytest.approx(mean)
    plotted = psctl_in_process("compare", "logged", "--plot", "--metric", "grad_norm",
                               db=logged.db)
    assert plotted.returncode == 0, plotted.stderr
    assert "grad_norm against seconds of training" in plotted.stdout
    missing = psctl_in_process("compare", "logged", "--metric", "nope", db=logged.db)
    assert missing.returncode == 2
    assert "they logged: active_fraction, grad_norm" in " ".join(missing.stderr.split())


@needs_chromium
def test_the_run_page_charts_grad_norm(logged: Run) -> None:
    workers = {f"worker {w}" for w in (0, 1)}
    with serving(logged.db) as base, chromium() as browser, checked_page(browser) as page:
        page.goto(f"{base}/runs/{logged.run_id}")
        page.wait_for_function("document.body.dataset.userMetrics === '2'", timeout=60_000)
        chart = page.evaluate("""() => {
            const div = document.querySelector('#user-metrics [data-metric="grad_norm"]');
            const box = div.getBoundingClientRect();
            return {plotted: div.classList.contains("js-plotly-plot"),
                    title: div.querySelector(".gtitle").textContent,
                    names: div.data.map((t) => t.name),
                    points: div.data.map((t) => t.y.length),
                    lines: div.querySelectorAll(".scatterlayer .trace path.js-line").length,
                    shown: div.dataset.points, width: box.width, height: box.height,
                    hidden: document.getElementById("user-metrics").hidden};
        }""")
        screenshot(page, "user-metrics-run-page.png")
    per_worker = query(logged.db, "SELECT count(*) FROM user_metrics WHERE name = 'grad_norm' "
                                  "GROUP BY rank ORDER BY rank")
    assert chart["plotted"] and not chart["hidden"]
    assert chart["title"].startswith("grad_norm")
    assert set(chart["names"]) == workers
    assert chart["points"] == [n for (n,) in per_worker] and chart["lines"] == 2
    assert int(chart["shown"]) == sum(n for (n,) in per_worker)
    assert chart["width"] > 300 and chart["height"] > 150

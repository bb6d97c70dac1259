"""Dashboard benchmark (issue 4, acceptance 3): first meaningful paint of a run page for a run
with 1,000,000 iteration rows, and the lag from a row's commit to its point on the page.

The database is written here with bulk inserts (4 workers x 250,000 iterations); the dashboard
runs in this process (uvicorn in a thread), the page in Debian's headless chromium. *First
meaningful paint*: from navigation start until the charts above the fold have been drawn (the
page sets `window.__psctl.firstPaint`); *all charts*: until every chart is drawn. *Cold*: a
fresh browser context (plotly.min.js, 4.8 MB, not yet cached); *warm*: a reload.
*Lag*: rows committed one transaction at a time (as the recorder does), each measured from
just after its commit until the page reports a render that includes it.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import machine_note, paragraph, update_docs_section, write_result
from engine.recorder import REBUILD_ROLLUPS_SQL

RUN = "d" * 32
COLUMNS = 17


def build(db: Path, workers: int, per_worker: int) -> float:
    """A running run with ``workers * per_worker`` iterations; returns the last ended_at."""
    from engine.db import open_engine

    open_engine(db).dispose()
    t0 = time.time() - per_worker * 0.0144 * 1.2 - 5  # every row ends in the past
    conn = sqlite3.connect(db)
    conn.execute("INSERT INTO runs (id, name, status, started_at, heartbeat_at, config_json, sync,"
                 " workers, servers, dataset, iteration_count) VALUES (?, 'bench-1M', 'running', "
                 "?, 9e9, '{}', 'asp', ?, 1, 'mnist', ?)", (RUN, t0, workers, workers * per_worker))
    rng = random.Random(0)
    last = t0
    for w in range(workers):
        t, rows = t0, []
        for i in range(per_worker):
            d = 0.0144 * (1 + 0.2 * rng.random())
            rows.append((RUN, w, i, i // 1000, t, t + d, d * .5, d * .2, d * .2, d * .1,
                         rng.randint(0, 3), 2.0 / (1 + i / 1e4), 64, 3_700_000, 3_700_000,
                         t + d * .8, t + d * .85))
            t += d
        conn.executemany(f"INSERT INTO iterations VALUES ({','.join('?' * COLUMNS)})", rows)
        last = max(last, t)
    # The recorder keeps the per-second rollups as it inserts; here they are built in one go.
    conn.execute(REBUILD_ROLLUPS_SQL, {"run": RUN, "origin": t0, "lo": 0, "hi": 10**9})
    conn.commit()
    conn.close()
    return last


def paint_times(base: str, chromium: str, reps: int) -> dict[str, list[float]]:
    from playwright.sync_api import sync_playwright

    out: dict[str, list[float]] = {"cold_first": [], "cold_all": [], "warm_first": [],
                                   "warm_all": []}
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        for _ in range(reps):
            context = browser.new_context(viewport={"width": 1280, "height": 800})
            page = context.new_page()
            for kind in ("cold", "warm"):
                page.goto(f"{base}/runs/{RUN}")
                page.wait_for_selector("body[data-complete='1']", timeout=60_000)
                first, full = page.evaluate(
                    "[window.__psctl.firstPaint, window.__psctl.allPainted]")
                out[f"{kind}_first"].append(first / 1e3)
                out[f"{kind}_all"].append(full / 1e3)
            context.close()
        browser.close()
    return out


def commit_lags(base: str, chromium: str, db: Path, start: float, samples: int) -> list[float]:
    from playwright.sync_api import sync_playwright

    lags = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1280, "height": 800})
        page.goto(f"{base}/runs/{RUN}")
        page.wait_for_selector("body[data-complete='1']", timeout=60_000)
        conn = sqlite3.connect(db)
        origin = conn.execute("SELECT started_at FROM runs").fetchone()[0]
        iteration = 10**6
        for _ in range(samples):
            time.sleep(0.7)  # let the page settle so each sample starts from a quiet page
            now = time.time()
            iteration += 1
            conn.execute(f"INSERT INTO iterations VALUES ({','.join('?' * COLUMNS)})",
                         (RUN, 0, iteration, 999, now - 0.01, now, .005, .002, .002, .001, 0,
                          0.1, 64, 1, 1, now, now))
            conn.execute("UPDATE runs SET iteration_count = iteration_count + 1 WHERE id = ?",
                         (RUN,))
            second = int(now - origin)
            conn.execute(REBUILD_ROLLUPS_SQL, {"run": RUN, "origin": origin, "lo": second,
                                               "hi": second})
            conn.commit()
            committed = time.time()
            page.wait_for_function(f"window.__psctl.latestT >= {now}", timeout=10_000)
            renders = page.evaluate("window.__psctl.renders")
            shown = min(t for t, latest in renders if latest is not None and latest >= now)
            assert shown >= committed - 0.05, "a render before the commit cannot show it"
            lags.append(shown - committed)
        conn.close()
        browser.close()
    return lags


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="100,000 rows, fewer samples")
    args = parser.parse_args()
    chromium = shutil.which("chromium")
    if chromium is None:
        sys.exit("needs Debian's chromium (apt-get install chromium)")
    from webui.server import BackgroundServer

    workers, per_worker = (4, 25_000) if args.quick else (4, 250_000)
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "experiments.db"
        t = time.perf_counter()
        last = build(db, workers, per_worker)
        build_s = time.perf_counter() - t
        server = BackgroundServer(db, port=0)
        base = server.start()
        try:
            paints = paint_times(base, chromium, 2 if args.quick else 5)
            lags = commit_lags(base, chromium, db, last, 5 if args.quick else 20)
        finally:
            server.stop()
    report(workers * per_worker, build_s, paints, lags, args.quick)


def report(rows: int, build_s: float, paints: dict[str, list[float]], lags: list[float],
           quick: bool) -> None:
    from bench._common import machine_info

    med = {k: statistics.median(v) for k, v in paints.items()}
    payload: dict[str, Any] = {"rows": rows, "build_s": build_s, "paint_s": paints,
                               "paint_median_s": med, "lag_s": lags,
                               "lag_median_s": statistics.median(lags), "lag_max_s": max(lags),
                               "machine": machine_info()}
    print(json.dumps({k: v for k, v in payload.items() if k != "machine"}, indent=2))
    if quick:
        return
    write_result("dashboard", payload)
    ok = lambda v: "yes" if v < 1.0 else "no"  # noqa: E731
    lines = [
        paragraph(__doc__.split("\n\n", 1)[1]),
        "",
        "| measured (1,000,000 iteration rows, 4 workers) | median | max | goal | met? |",
        "|---|---|---|---|---|",
        f"| first meaningful paint, warm (reload) | {med['warm_first']:.2f} s | "
        f"{max(paints['warm_first']):.2f} s | < 1 s | {ok(med['warm_first'])} |",
        f"| first meaningful paint, cold (plotly.min.js not cached) | {med['cold_first']:.2f} s"
        f" | {max(paints['cold_first']):.2f} s | < 1 s | {ok(med['cold_first'])} |",
        f"| all charts drawn, warm | {med['warm_all']:.2f} s | {max(paints['warm_all']):.2f} s"
        " | - | n/a |",
        f"| all charts drawn, cold | {med['cold_all']:.2f} s | {max(paints['cold_all']):.2f} s"
        " | - | n/a |",
        f"| commit-to-page lag ({len(lags)} rows) | {statistics.median(lags):.2f} s | "
        f"{max(lags):.2f} s | < 1 s | {ok(statistics.median(lags))} |",
        "",
        paragraph("Reproduce: `python bench/dashboard.py` (about a minute; `--quick` for a smoke "
                  "test with 100,000 rows). Raw samples: `bench/results/dashboard.json`."),
        "",
        machine_note(payload["machine"]),
    ]
    update_docs_section("Dashboard (bench/dashboard.py)", "\n".join(lines))


if __name__ == "__main__":
    main()

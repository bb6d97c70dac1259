"""The runs table in real headless Chromium: columns sort on the numbers ``/api/table`` serves,
a config key filters, tags and notes typed into the page land in the SQLite file, an
oversubscribed run is marked, and a run that starts appears without a reload. Every request
off this machine is aborted; a screenshot lands in test-artifacts/.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from engine.recorder import Recorder
from engine.wire.records import EventRecord, RunStatus
from tests.webui.chromium import checked_page, chromium, needs_chromium, screenshot, serving
from tests.webui.test_compare_api import GROUP, SOLO, seed_compare_db

CROWDED = "d" * 32
pytestmark = [
    pytest.mark.integration,  # a server and a browser: not the fast tier
    needs_chromium,
    pytest.mark.timeout(180),
]


@pytest.fixture
def db(tmp_path: Path) -> Path:
    path = seed_compare_db(tmp_path / "experiments.db")
    recorder = Recorder(path)
    try:
        recorder.start_run(CROWDED, "crowded", {"lr": 0.1}, sync="ssp", workers=8, servers=2,
                           dataset="digits", started_at=time.time() - 30)
        recorder.record_event(EventRecord(at=time.time() - 29, kind="oversubscribed", detail={
            "message": "10 busy processes share 2 cores"}))
        recorder.finish(RunStatus.FAILED)
    finally:
        recorder.close()
    return path


@pytest.fixture
def base(db: Path) -> Iterator[str]:
    with serving(db) as url:
        yield url


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with chromium() as launched:
        yield launched


@pytest.fixture
def page(browser: Any, base: str) -> Iterator[Any]:
    with checked_page(browser) as opened:
        opened.goto(base + "/")
        opened.wait_for_selector("#runs-table tbody[data-rows='5']", timeout=30_000)
        yield opened


def _names(page: Any) -> list[str]:
    return [str(n) for n in page.eval_on_selector_all(
        "#runs-table tbody td.name > a:first-child", "links => links.map(a => a.textContent)")]


def _rows(db: Path, sql: str) -> list[tuple[Any, ...]]:
    raw = sqlite3.connect(db)
    try:
        return raw.execute(sql).fetchall()
    finally:
        raw.close()


def test_columns_sort_on_the_served_numbers(page: Any, base: str) -> None:
    served = page.evaluate("() => fetch('/api/table').then(r => r.json())")["rows"]
    best = {r["name"]: r["values"]["best_accuracy"] for r in served}
    # Newest first by default.
    assert _names(page) == [r["name"] for r in sorted(served, key=lambda r: -r["started_at"])]
    page.click("th[data-sort='best_accuracy']")
    ranked = sorted((n for n in best if best[n] is not None), key=lambda n: -best[n])
    assert _names(page) == [*ranked, "crowded"]  # no accuracy: last, whichever the direction
    assert page.get_attribute("th[data-sort='best_accuracy']", "aria-sort") == "descending"
    page.click("th[data-sort='best_accuracy']")
    assert _names(page) == [*reversed(ranked), "crowded"]
    page.click("th[data-sort='time_to_target_s']")  # the fastest to 97 % first
    to_target = {r["name"]: r["values"]["time_to_target_s"] for r in served}
    reached = sorted((n for n in to_target if to_target[n] is not None), key=to_target.get)
    assert _names(page)[: len(reached)] == reached
    assert "sort=time_to_target_s" in page.url
    cell = page.inner_text(f"tr[data-id='{SOLO}'] td[data-key='best_accuracy']")
    assert cell == f"{100 * best['solo-bsp']:.2f} %"
    startup = next(r["values"]["startup_s"] for r in served if r["id"] == SOLO)
    assert startup is not None  # the fixture's runs start their first iteration at once: 0
    assert page.inner_text(f"tr[data-id='{SOLO}'] td[data-key='startup_s']") == f"{startup:.1f}"


def test_a_config_key_filters_and_a_bad_one_says_why(page: Any) -> None:
    page.fill("#where", "sync.model=asp")
    page.press("#where", "Enter")
    page.wait_for_selector("#runs-table tbody[data-rows='3']", timeout=10_000)
    assert sorted(_names(page)) == ["g1-0", "g1-1", "g1-2"]
    assert "where=sync.model%3Dasp" in page.url
    assert page.inner_text("#table-count") == "3 of 3 runs shown"
    page.fill("#where", "no.such.key=1")
    page.press("#where", "Enter")
    page.wait_for_selector("#table-error:not([hidden])", timeout=10_000)
    assert "no.such.key" in page.inner_text("#table-error")


def test_tags_and_notes_typed_in_the_page_land_in_the_file(page: Any, db: Path) -> None:
    row = f"tr[data-id='{SOLO}']"
    page.click(f"{row} td.tags button.add")
    page.fill(f"{row} .tag-input", "verdict=diverged")
    page.press(f"{row} .tag-input", "Enter")
    page.wait_for_selector(f"{row} .tag:has-text('verdict=diverged')", timeout=10_000)
    assert _rows(db, f"SELECT key, value FROM tags WHERE run_id = '{SOLO}'") == [
        ("verdict", "diverged")]
    page.click(f"{row} .tag button.remove")
    page.wait_for_function(f"!document.querySelector(\"{row} .tag\")", timeout=10_000)
    assert _rows(db, f"SELECT * FROM tags WHERE run_id = '{SOLO}'") == []

    page.click(f"{row} td.notes button.edit")
    page.fill(f"{row} td.notes textarea", "lr 0.1 is too high for bsp")
    page.click(f"{row} td.notes button:has-text('Save')")
    page.wait_for_selector(f"{row} .note-text:has-text('too high')", timeout=10_000)
    assert _rows(db, f"SELECT notes FROM runs WHERE id = '{SOLO}'") == [
        ("lr 0.1 is too high for bsp",)]


def test_oversubscription_groups_and_new_runs_are_shown(page: Any, db: Path) -> None:
    crowded = f"tr[data-id='{CROWDED}']"
    assert page.inner_text(f"{crowded} .warn") == "oversubscribed"
    assert page.get_attribute(f"tr[data-id='{GROUP[0]}'] a.group", "href") == "/compare?group=g1"
    assert page.locator(f"tr[data-id='{SOLO}'] .warn").count() == 0
    screenshot(page, "runs-page.png")

    recorder = Recorder(db)  # a run starts while the page is open
    try:
        recorder.start_run("e" * 32, "started-later", {"lr": 0.1}, sync="asp", workers=1,
                           servers=1, dataset="digits", started_at=time.time())
        page.wait_for_selector("#runs-table tbody[data-rows='6']", timeout=15_000)
        assert _names(page)[0] == "started-later"
        assert page.inner_text(f"tr[data-id='{'e' * 32}'] td.status") == "running"
    finally:
        recorder.close()

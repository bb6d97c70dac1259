"""The compare page in real headless Chromium: the chart stays inside its box (wide and at phone
width), evaluations are drawn raw, a group of repeated runs is a mean line with a ± std band,
and the metrics table shows what ``psctl compare`` prints. Every request off this machine is
aborted; screenshots land in test-artifacts/.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import psctl
from tests.webui.chromium import checked_page, chromium, needs_chromium, screenshot, serving
from tests.webui.test_compare_api import GROUP, SOLO, SOLO_ACCURACY, seed_compare_db

pytestmark = [
    pytest.mark.integration,  # a server and a browser: not the fast tier
    needs_chromium,
    pytest.mark.timeout(180),
]
ALL = ",".join([SOLO, *GROUP])


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return seed_compare_db(tmp_path_factory.mktemp("compare-page") / "experiments.db")


@pytest.fixture(scope="module")
def base(db: Path) -> Iterator[str]:
    with serving(db) as url:
        yield url


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with chromium() as launched:
        yield launched


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    with checked_page(browser) as opened:
        yield opened


def _open(page: Any, url: str) -> None:
    page.goto(url)
    page.wait_for_selector("body[data-painted='1']", timeout=30_000)


def _assert_inside_box(page: Any) -> None:
    """Plot (its svg), legend and the "showing N of M" line lie inside the chart's box."""
    boxes = page.evaluate("""() => {
        const r = (e) => { const b = e.getBoundingClientRect();
          return {left: b.left, top: b.top, right: b.right, bottom: b.bottom}; };
        const chart = document.getElementById('compare-chart');
        return {box: r(chart.closest('.chart-box')),
                svg: [...chart.querySelectorAll('.main-svg')].map(r),
                legend: [...chart.querySelectorAll('.legend')].map(r),
                count: r(document.getElementById('compare-count'))}; }""")
    box = boxes["box"]
    parts = [("svg", b) for b in boxes["svg"]] + [("legend", b) for b in boxes["legend"]]
    assert boxes["svg"] and boxes["legend"], boxes
    for name, part in [*parts, ("count", boxes["count"])]:
        assert part["left"] >= box["left"] - 0.5 and part["right"] <= box["right"] + 0.5, \
            (name, part, box)
        assert part["top"] >= box["top"] - 0.5 and part["bottom"] <= box["bottom"] + 0.5, \
            (name, part, box)
    # The count line sits below the plot, not over it.
    assert boxes["count"]["top"] >= max(b["bottom"] for b in boxes["svg"]) - 0.5, boxes


def _traces(page: Any) -> list[dict[str, Any]]:
    traces: list[dict[str, Any]] = page.evaluate(
        """() => document.getElementById('compare-chart').data.map((t) => ({
            name: t.name, mode: t.mode, fill: t.fill || null, y: t.y, meta: t.meta || null}))""")
    return traces


def _table(page: Any) -> list[list[str]]:
    rows: list[list[str]] = page.evaluate(
        """() => [...document.querySelectorAll('#compare-table tr')]
           .map((tr) => [...tr.children].map((c) => c.textContent))""")
    return rows


def _cli_markdown(db: Path, *args: str) -> list[list[str]]:
    done = psctl("compare", "--md", *args, db=db, timeout=60)
    assert done.returncode == 0, done.stderr
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("|")]
    del lines[1]  # the alignment row
    return [[c.strip().replace("\\|", "|") for c in ln.strip("|").split(" | ")] for ln in lines]


def test_wide_chart_fits_evaluations_raw_and_group_banded(page: Any, base: str, db: Path) -> None:
    _open(page, f"{base}/compare?runs={ALL}")
    assert page.input_value("#metric") == "accuracy"
    assert not page.is_checked("#smooth")  # evaluations: no smoothing by default
    assert page.is_checked("#aggregate")  # three runs of g1
    traces = _traces(page)
    solo = next(t for t in traces if t["name"] == "solo-bsp")
    # The raw values, every one of them a marker: 88.1 % is drawn as 88.1 %.
    assert solo["mode"] == "lines+markers"
    assert solo["y"] == pytest.approx([100 * a for a in SOLO_ACCURACY])
    assert [t for t in traces if t["fill"] == "tonexty" and t["meta"] == "band"]
    assert "g1 (3 runs, mean ± std)" in [t["name"] for t in traces]
    legend = page.text_content("#compare-chart .legend") or ""
    assert "g1 (3 runs, mean ± std)" in legend
    _assert_inside_box(page)
    assert page.text_content("#compare-count").startswith("showing ")
    screenshot(page, "compare-page.png")


def test_narrow_window_keeps_everything_in_the_box(page: Any, base: str) -> None:
    page.set_viewport_size({"width": 400, "height": 1000})
    _open(page, f"{base}/compare?runs={ALL}")
    page.wait_for_function(
        "[...document.querySelectorAll('#compare-chart .main-svg')]"
        ".every((svg) => svg.getBoundingClientRect().width <= 400)", timeout=10_000)
    _assert_inside_box(page)
    overflow = page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
    assert overflow <= 0, f"the page scrolls sideways by {overflow} px at 400 px wide"
    screenshot(page, "compare-narrow.png")
    # The longest legend: every run on its own, each with a smoothed line (iteration metrics
    # are smoothed by default), wraps over several rows and still stays in the box.
    draws = page.get_attribute("#compare-chart", "data-draws")
    page.uncheck("#aggregate")
    page.select_option("#metric", "throughput")
    page.wait_for_function("document.getElementById('compare-chart').dataset.draws - "
                           f"{draws} >= 2")
    assert page.is_checked("#smooth")
    assert len([t for t in _traces(page) if "(EMA" in t["name"]]) == 4
    _assert_inside_box(page)
    overflow = page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
    assert overflow <= 0, f"the page scrolls sideways by {overflow} px at 400 px wide"


def test_table_is_what_psctl_compare_prints(page: Any, base: str, db: Path) -> None:
    _open(page, f"{base}/compare?runs={ALL}")
    ids = [SOLO, *GROUP]
    assert _table(page) == _cli_markdown(db, *ids, "--target", "0.97")
    raw = json.loads(psctl("compare", "--json", *ids, "--target", "0.97", db=db).stdout)
    solo = next(r for r in raw if r["id"] == SOLO)
    cell = page.text_content(f"#compare-table tr[data-id='{SOLO}'] td[data-key='best_accuracy']")
    assert cell == f"{100 * solo['best_accuracy']:.2f}%"
    rate = page.text_content(f"#compare-table tr[data-id='{SOLO}'] td[data-key='samples_per_s']")
    assert rate == f"{solo['samples_per_s']:,.0f}"
    assert page.text_content("#compare-cli") == (
        f"psctl compare {' '.join(i[:8] for i in ids)} --target 0.97")

    # Another target: the table is measured again, as `--target 0.9` would.
    seq = page.get_attribute("#compare-table", "data-seq")
    page.fill("#target", "0.9")
    page.dispatch_event("#target", "change")
    page.wait_for_function(f"document.getElementById('compare-table').dataset.seq !== '{seq}'")
    assert _table(page) == _cli_markdown(db, *ids, "--target", "0.9")

    # Groups unaggregated: a line per run, no band, and a table row per run (--per-run).
    draws = page.get_attribute("#compare-chart", "data-draws")
    seq = page.get_attribute("#compare-table", "data-seq")
    page.uncheck("#aggregate")
    page.wait_for_function(f"document.getElementById('compare-chart').dataset.draws !== '{draws}'"
                           f" && document.getElementById('compare-table').dataset.seq !== '{seq}'")
    assert not [t for t in _traces(page) if t["fill"] == "tonexty"]
    assert _table(page) == _cli_markdown(db, *ids, "--target", "0.9", "--per-run")

    # A target out of range is refused on the page, not sent.
    page.fill("#target", "1.5")
    page.dispatch_event("#target", "change")
    page.wait_for_selector("#table-note.error")


def test_group_page_shows_every_run_of_the_group(page: Any, base: str) -> None:
    _open(page, f"{base}/compare?group=g1")
    assert page.evaluate("window.PSCTL_RUNS") == GROUP
    assert [t for t in _traces(page) if t["meta"] == "band"]
    rows = _table(page)
    assert len(rows) == 2 and rows[1][0] == "g1"  # one row: the group's means
    assert page.goto(f"{base}/compare?group=nosuch").status == 404


def test_smoothing_is_an_overlay_over_the_raw_points(page: Any, base: str) -> None:
    _open(page, f"{base}/compare?runs={SOLO}")
    draws = page.get_attribute("#compare-chart", "data-draws")
    page.check("#smooth")
    page.wait_for_function(f"document.getElementById('compare-chart').dataset.draws !== '{draws}'")
    traces = _traces(page)
    raw = next(t for t in traces if t["name"] == "solo-bsp")
    assert raw["mode"] == "lines+markers"
    assert raw["y"] == pytest.approx([100 * a for a in SOLO_ACCURACY])
    assert any(t["name"].startswith("solo-bsp (EMA") for t in traces)

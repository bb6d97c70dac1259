"""The compare page in real headless Chromium: several metrics at once as small multiples, each
chart inside its box (wide and at phone width) with its own smoothing and log scale, a cursor
linked across them, time counted from each run's first iteration (a resumed run's downtime a
gap), evaluations drawn raw, a group of repeated runs as a mean line with a ± std band, and the
metrics table `psctl compare` prints, its metric columns in view at 1,400 px. Every request off
this machine is aborted; screenshots land in test-artifacts/.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from engine.recorder import set_tags
from tests.conftest import psctl
from tests.webui.chromium import needs_chromium, screenshot
from tests.webui.test_compare_api import (
    GROUP,
    RESUMED,
    SOLO,
    SOLO_ACCURACY,
    record_resumed,
    record_run,
    seed_compare_db,
)

pytestmark = [
    pytest.mark.integration,  # a server and a browser: not the fast tier
    needs_chromium,
    pytest.mark.timeout(180),
]
ALL = ",".join([SOLO, *GROUP])
SHORT = ["b1" * 16, "b2" * 16]
RESUMED_START = 1_700_000_000.0
DEFAULT_METRICS = ["accuracy", "throughput", "loss", "staleness"]


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = seed_compare_db(tmp_path_factory.mktemp("compare-page") / "experiments.db")
    record_resumed(path, RESUMED, start=RESUMED_START)
    for n, run_id in enumerate(SHORT):  # a group of runs evaluated once, at other moments
        record_run(path, run_id, f"short-{n}", sync="asp", lr=0.05, accuracy=[0.5 + 0.1 * n],
                   step_s=0.002 * (n + 1), start=RESUMED_START + 1000 * (n + 1), seed=n)
        set_tags(path, run_id, {"group": "short"}, [])
    return path


def _open(page: Any, url: str) -> None:
    page.goto(url)
    page.wait_for_selector("body[data-painted='1']", timeout=30_000)


def _chart(metric: str) -> str:
    return f"#compare-charts [data-metric='{metric}'] .compare-chart"


def _draws(page: Any, selector: str = "#compare-charts") -> str:
    return str(page.get_attribute(selector, "data-draws"))


def _wait_redrawn(page: Any, before: str, selector: str = "#compare-charts") -> None:
    page.wait_for_function(
        f"document.querySelector(\"{selector}\").dataset.draws !== '{before}'", timeout=10_000)


def _assert_inside_boxes(page: Any) -> None:
    """Each chart's plot (its svg) and its "showing N of M" line lie inside the chart's box."""
    charts = page.evaluate("""() => {
        const r = (e) => { const b = e.getBoundingClientRect();
          return {left: b.left, top: b.top, right: b.right, bottom: b.bottom}; };
        return [...document.querySelectorAll('#compare-charts .compare-box')].map((box) => ({
          metric: box.dataset.metric, box: r(box),
          svg: [...box.querySelectorAll('.main-svg')].map(r),
          count: r(box.querySelector('.count'))}));
    }""")
    assert charts
    for chart in charts:
        box = chart["box"]
        assert chart["svg"], chart
        for name, part in [*(("svg", b) for b in chart["svg"]), ("count", chart["count"])]:
            assert part["left"] >= box["left"] - 0.5 and part["right"] <= box["right"] + 0.5, \
                (chart["metric"], name, part, box)
            assert part["top"] >= box["top"] - 0.5 and part["bottom"] <= box["bottom"] + 0.5, \
                (chart["metric"], name, part, box)
        # The count line sits below the plot, not over it.
        assert chart["count"]["top"] >= max(b["bottom"] for b in chart["svg"]) - 0.5, chart


def _traces(page: Any, metric: str) -> list[dict[str, Any]]:
    traces: list[dict[str, Any]] = page.evaluate(
        f"""() => document.querySelector("{_chart(metric)}").data.map((t) => ({{
            name: t.name, mode: t.mode, fill: t.fill || null, y: t.y, meta: t.meta || null,
            x: t.x.map((v) => v instanceof Date ? v.getTime() : v)}}))""")
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


def test_several_metrics_at_once_each_in_its_box(page: Any, base: str) -> None:
    _open(page, f"{base}/compare?runs={ALL}")
    assert page.get_attribute("#compare-charts", "data-metrics") == ",".join(DEFAULT_METRICS)
    assert page.is_checked("#aggregate")  # three runs of g1
    for metric in DEFAULT_METRICS:
        traces = _traces(page, metric)
        assert "solo-bsp" in [t["name"] for t in traces], metric
        assert [t for t in traces if t["fill"] == "tonexty" and t["meta"] == "band"], metric
    accuracy = _traces(page, "accuracy")
    solo = next(t for t in accuracy if t["name"] == "solo-bsp")
    # The raw values, every one of them a marker: 88.1 % is drawn as 88.1 %.
    assert solo["mode"] == "lines+markers"
    assert solo["y"] == pytest.approx([100 * a for a in SOLO_ACCURACY])
    # One legend for every chart, the group as its mean ± std.
    legend = page.inner_text("#compare-legend")
    assert "g1 (3 runs, mean ± std)" in legend and "solo-bsp" in legend
    _assert_inside_boxes(page)
    # Two more metrics: six charts; one less: five, in the picks' order.
    before = _draws(page)
    page.check("#metrics input[value='test_loss']")
    _wait_redrawn(page, before)
    before = _draws(page)
    page.check("#metrics input[value='idle_fraction']")
    _wait_redrawn(page, before)
    before = _draws(page)
    page.uncheck("#metrics input[value='staleness']")
    _wait_redrawn(page, before)
    assert page.get_attribute("#compare-charts", "data-metrics") == \
        "accuracy,test_loss,throughput,loss,idle_fraction"
    assert page.locator("#compare-charts .compare-box").count() == 5
    assert "metrics=accuracy,test_loss,throughput,loss,idle_fraction" in page.url
    idle = next(t for t in _traces(page, "idle_fraction") if t["name"] == "solo-bsp")
    assert max(idle["y"]) == pytest.approx(30.0)  # a wait share of 0.3 drawn as 30 %
    _assert_inside_boxes(page)
    screenshot(page, "compare-page.png")


def test_the_metrics_in_the_address_are_drawn(page: Any, base: str) -> None:
    _open(page, f"{base}/compare?runs={SOLO}&metrics=loss,bytes_sent,nosuch")
    assert page.get_attribute("#compare-charts", "data-metrics") == "loss,bytes_sent"
    assert page.is_checked("#metrics input[value='bytes_sent']")
    assert not page.is_checked("#metrics input[value='accuracy']")
    # A name that is no metric is said, with the names there are, not dropped without a word.
    said = page.inner_text("#compare-unknown")
    assert 'no metric "nosuch"' in said and "accuracy, test_loss" in said


def test_a_logged_metric_in_the_address_needs_no_prefix(page: Any, base: str) -> None:
    _open(page, f"{base}/compare?runs={RESUMED}&metrics=accuracy,grad_norm")
    assert page.get_attribute("#compare-charts", "data-metrics") == "accuracy,user:grad_norm"
    assert page.is_checked("#metrics input[value='user:grad_norm']")
    assert page.is_hidden("#compare-unknown")
    [logged] = _traces(page, "user:grad_norm")
    assert len([y for y in logged["y"] if y is not None]) == 60
    page.uncheck("#metrics input[value='accuracy']")  # the address keeps the plain name
    page.wait_for_function("location.search.includes('metrics=grad_norm')")
    assert "user" not in page.url


def test_narrow_window_keeps_everything_in_the_box(page: Any, base: str) -> None:
    page.set_viewport_size({"width": 400, "height": 1000})
    _open(page, f"{base}/compare?runs={ALL}")
    page.wait_for_function(
        "[...document.querySelectorAll('#compare-charts .main-svg')]"
        ".every((svg) => svg.getBoundingClientRect().width <= 400)", timeout=10_000)
    _assert_inside_boxes(page)
    overflow = page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
    assert overflow <= 0, f"the page scrolls sideways by {overflow} px at 400 px wide"
    screenshot(page, "compare-narrow.png")
    # Every run on its own, each with a smoothed line, still stays in the box.
    before = _draws(page)
    page.uncheck("#aggregate")
    _wait_redrawn(page, before)
    _set_smoothing(page, "throughput", 0.6)
    assert len([t for t in _traces(page, "throughput") if "(EMA" in t["name"]]) == 4
    _assert_inside_boxes(page)
    overflow = page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
    assert overflow <= 0, f"the page scrolls sideways by {overflow} px at 400 px wide"


def _set_smoothing(page: Any, metric: str, weight: float) -> None:
    before = _draws(page, _chart(metric))
    page.evaluate(f"""() => {{ const s = document.getElementById('compare-{metric}-smoothing');
        s.value = '{weight}'; s.dispatchEvent(new Event('input'));
        s.dispatchEvent(new Event('change')); }}""")
    _wait_redrawn(page, before, _chart(metric))


def test_smoothing_is_an_overlay_over_the_raw_points(page: Any, base: str) -> None:
    _open(page, f"{base}/compare?runs={SOLO}")
    assert not [t for t in _traces(page, "accuracy") if "(EMA" in t["name"]]  # off at first
    _set_smoothing(page, "accuracy", 0.6)
    traces = _traces(page, "accuracy")
    raw = next(t for t in traces if t["name"] == "solo-bsp")
    assert raw["mode"] == "lines+markers"
    assert raw["y"] == pytest.approx([100 * a for a in SOLO_ACCURACY])
    smoothed = next(t for t in traces if t["name"].startswith("solo-bsp (EMA 0.6"))
    assert smoothed["y"][0] == pytest.approx(31.0)  # debiased: the first point is itself
    assert smoothed["y"][-1] != pytest.approx(88.1)
    # Per chart: the throughput chart is not smoothed by the accuracy chart's slider.
    assert not [t for t in _traces(page, "throughput") if "(EMA" in t["name"]]


def test_the_log_scale_toggle_changes_the_axis_type(page: Any, base: str) -> None:
    _open(page, f"{base}/compare?runs={ALL}")
    axis = f"document.querySelector(\"{_chart('loss')}\")._fullLayout.yaxis.type"
    assert page.evaluate(axis) == "linear"
    before = _draws(page, _chart("loss"))
    page.check("#compare-loss-log")
    _wait_redrawn(page, before, _chart("loss"))
    assert page.evaluate(axis) == "log"
    assert page.evaluate(f"document.querySelector(\"{_chart('accuracy')}\")"
                         "._fullLayout.yaxis.type") == "linear"  # the other charts keep theirs
    before = _draws(page, _chart("loss"))
    page.uncheck("#compare-loss-log")
    _wait_redrawn(page, before, _chart("loss"))
    assert page.evaluate(axis) == "linear"


def test_a_cursor_on_one_chart_shows_the_same_moment_on_the_others(page: Any, base: str) -> None:
    _open(page, f"{base}/compare?runs={SOLO}&metrics=accuracy,throughput,loss")
    others = ["throughput", "loss"]
    charts = ",".join(json.dumps(_chart(m)) for m in others)
    hovered = (f"() => [{charts}].map((s) => "
               "document.querySelectorAll(s + ' .hoverlayer .hovertext').length)")
    assert page.evaluate(hovered) == [0, 0]
    # The pixel of the solo run's second evaluation (20 s of training) on the accuracy chart.
    point = page.evaluate(f"""() => {{ const gd = document.querySelector("{_chart('accuracy')}");
        const fl = gd._fullLayout, box = gd.getBoundingClientRect();
        const i = gd.data.findIndex((t) => t.name === 'solo-bsp');
        return [box.left + fl._size.l + fl.xaxis.l2p(gd.data[i].x[1]),
                box.top + fl._size.t + fl.yaxis.l2p(gd.data[i].y[1])]; }}""")
    page.mouse.move(point[0], point[1])
    page.wait_for_function(f"({hovered})().every((n) => n > 0)", timeout=5_000)
    linked = page.evaluate("() => [...document.querySelectorAll('#compare-charts .compare-chart')]"
                           ".map((d) => Number(d.dataset.linkedX))")
    assert linked == pytest.approx([20.0] * 3)


def test_time_counts_from_the_first_iteration_and_downtime_is_a_gap(page: Any, base: str) -> None:
    _open(page, f"{base}/compare?runs={RESUMED}")
    assert page.input_value("#x-axis") == "train"
    title = page.evaluate(f"document.querySelector(\"{_chart('accuracy')}\")"
                          "._fullLayout.xaxis.title.text")
    assert title == "training time (s, from the first iteration)"
    # Evaluated 30 s and 120 s after the start: 5 s of start-up, then 25 s of training; the
    # second after 68 s down (from the last iteration before the kill to the first after).
    [accuracy] = _traces(page, "accuracy")
    assert _points(accuracy) == pytest.approx([25.0, 47.0])
    assert accuracy["y"].count(None) == 1  # not joined across the downtime
    clock = page.inner_text("#compare-clock")
    assert "resumed-sim 5.0 s" in clock and "resumed" in clock and "virtual time" in clock
    assert page.get_attribute("#compare-legend .sim", "title") == "virtual time"
    # The loss line breaks where the run was down: one gap.
    [loss] = _traces(page, "loss")
    assert loss["y"].count(None) == 1
    gap = loss["y"].index(None)
    assert loss["x"][gap - 1] < loss["x"][gap + 1] < loss["x"][gap - 1] + 5
    # With start-up: seconds since the run started, the downtime in the axis.
    before = _draws(page)
    page.select_option("#x-axis", "elapsed")
    _wait_redrawn(page, before)
    [accuracy] = _traces(page, "accuracy")
    assert _points(accuracy) == pytest.approx([30.0, 120.0])
    assert "x=elapsed" in page.url


def _shown_command(page: Any) -> list[str]:
    """The arguments of the `psctl compare` command the page says its table is."""
    words = str(page.text_content("#compare-cli")).split()
    assert words[:2] == ["psctl", "compare"], words
    return words[2:]


def _points(trace: dict[str, Any]) -> list[float]:
    """The x of each drawn point (a gap is a point without y)."""
    return [x for x, y in zip(trace["x"], trace["y"], strict=True) if y is not None]


def test_a_metric_the_run_logged_is_offered_charted_and_tabled(page: Any, base: str) -> None:
    _open(page, f"{base}/compare?runs={RESUMED}")
    pick = "#metrics input[value='user:grad_norm']"
    assert not page.is_checked(pick)
    before = _draws(page)
    page.check(pick)
    _wait_redrawn(page, before)
    [logged] = _traces(page, "user:grad_norm")
    values = [y for y in logged["y"] if y is not None]
    assert values == pytest.approx([1 / (1 + i) for i in range(60)])
    # Its final and mean value in the table, as `psctl compare --metric grad_norm` prints them.
    seq = page.get_attribute("#compare-table", "data-seq")
    page.select_option("#table-metric", "grad_norm")
    page.wait_for_function(f"document.getElementById('compare-table').dataset.seq !== '{seq}'")
    assert page.inner_text("#compare-table th[data-key='user.grad_norm.final']") == \
        "grad_norm final"
    assert " --metric grad_norm" in page.text_content("#compare-cli")


def test_table_is_what_psctl_compare_prints(page: Any, base: str, db: Path) -> None:
    _open(page, f"{base}/compare?runs={ALL}")
    ids = [SOLO, *GROUP]
    # The target as a percentage, never a fraction, except in the command line it stands for.
    assert page.input_value("#target") == "97"
    assert "to 97 % test accuracy" in page.inner_text("#table-note")
    assert page.inner_text("#compare-table th[data-key='time_to_target_s']") == "to 97 % (s)"
    assert "0.97" not in page.inner_text("#compare-table")
    assert page.text_content("#compare-cli") == (
        f"psctl compare {' '.join(i[:8] for i in ids)} --target 97")
    # Settings as columns: the table of the command the page shows, cell for cell.
    seq = page.get_attribute("#compare-table", "data-seq")
    page.check("#cli-columns")
    page.wait_for_selector("#compare-table[data-layout='cli']")
    assert _table(page) == _cli_markdown(db, *_shown_command(page))
    raw = json.loads(psctl("compare", "--json", *ids, "--target", "0.97", db=db).stdout)
    solo = next(r for r in raw if r["id"] == SOLO)
    cell = page.text_content(f"#compare-table tr[data-id='{SOLO}'] td[data-key='best_accuracy']")
    assert cell == f"{100 * solo['best_accuracy']:.2f}%"
    rate = page.text_content(f"#compare-table tr[data-id='{SOLO}'] td[data-key='samples_per_s']")
    assert rate == f"{solo['samples_per_s']:,.0f}"

    # Another target: the table is measured again, as `--target 0.9` would.
    page.fill("#target", "90")
    page.dispatch_event("#target", "change")
    page.wait_for_function(f"document.getElementById('compare-table').dataset.seq !== '{seq}'")
    assert _shown_command(page)[-2:] == ["--target", "90"]
    assert _table(page) == _cli_markdown(db, *ids, "--target", "0.9")

    # Groups unaggregated: a line per run, no band, and a table row per run (--per-run).
    draws = _draws(page)
    seq = page.get_attribute("#compare-table", "data-seq")
    page.uncheck("#aggregate")
    page.wait_for_function(f"document.getElementById('compare-charts').dataset.draws !== '{draws}'"
                           f" && document.getElementById('compare-table').dataset.seq !== '{seq}'")
    assert not [t for t in _traces(page, "accuracy") if t["fill"] == "tonexty"]
    assert _table(page) == _cli_markdown(db, *ids, "--target", "0.9", "--per-run")

    # A target out of range is refused on the page, not sent.
    page.fill("#target", "150")
    page.dispatch_event("#target", "change")
    page.wait_for_selector("#table-note.error")


def test_metric_cells_are_in_view_at_1400_px(page: Any, base: str) -> None:
    _open(page, f"{base}/compare?runs={ALL},{RESUMED}")
    assert page.get_attribute("#compare-table", "data-layout") == "folded"
    page.locator("#compare-table").scroll_into_view_if_needed()
    cells = page.evaluate("""() => [...document.querySelectorAll('#compare-table td')]
        .filter((td) => td.dataset.key !== '@settings').map((td) => {
          const b = td.getBoundingClientRect();
          return {key: td.dataset.key, left: b.left, right: b.right, top: b.top,
                  bottom: b.bottom}; })""")
    keys = {c["key"] for c in cells}
    assert {"final_accuracy", "best_accuracy", "time_to_target_s", "samples_per_s",
            "idle_fraction", "bytes_per_sample", "wall_s"} <= keys
    assert "optimizer.lr" not in keys  # the settings that differ: folded into one column
    width, height = page.evaluate("[window.innerWidth, window.innerHeight]")
    hidden = [c for c in cells if c["left"] < 0 or c["right"] > width or c["top"] < 0
              or c["bottom"] > height]
    assert hidden == [], hidden[:3]
    settings = page.inner_text(f"#compare-table tr[data-id='{SOLO}'] td.settings")
    assert "optimizer.lr=0.1" in settings and "sync.model=bsp" in settings
    screenshot(page, "compare-table-1400.png", full_page=False)


def test_a_group_whose_runs_share_no_stretch_of_time_draws_each_run(page: Any,
                                                                      base: str) -> None:
    """`launch --repeat` of short runs (docs/cli.md's example): one evaluation each, at
    different moments. No mean can be drawn there; each run is, in the group's colour."""
    _open(page, f"{base}/compare?group=short")
    accuracy = _traces(page, "accuracy")
    assert sorted(t["name"] for t in accuracy) == ["short-0", "short-1"]
    assert page.get_attribute(_chart("accuracy"), "data-empty") == "0"
    assert "group short: its runs share no x range" in page.inner_text(
        "#compare-charts [data-metric='accuracy'] .count")
    # Each run's iterations fell in one bucket: a point, drawn with its marker.
    throughput = _traces(page, "throughput")
    assert sorted(t["name"] for t in throughput) == ["short-0", "short-1"]
    for trace in throughput:
        assert trace["mode"] == "lines+markers" and _points(trace), trace


def test_group_page_shows_every_run_of_the_group(page: Any, base: str) -> None:
    _open(page, f"{base}/compare?group=g1")
    assert page.evaluate("window.PSCTL_RUNS") == GROUP
    assert [t for t in _traces(page, "accuracy") if t["meta"] == "band"]
    rows = _table(page)
    assert len(rows) == 2 and rows[1][0] == "g1"  # one row: the group's means
    assert page.goto(f"{base}/compare?group=nosuch").status == 404

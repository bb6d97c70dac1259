"""The runs list in real headless Chromium, grouped: by a run column, tag or config key, each
group collapsible with its run count and column means; a `launch --repeat` group and a study
open a parallel-coordinates view of what varies in them; simulated runs are marked; at 1,400 px
tags and notes stay in view. Every request off this machine is aborted; screenshots land in
test-artifacts/.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from engine.recorder import set_notes, set_tags
from tests.webui.chromium import needs_chromium, screenshot
from tests.webui.test_compare_api import GROUP, SOLO, record_run, seed_compare_db

pytestmark = [
    pytest.mark.integration,  # a server and a browser: not the fast tier
    needs_chromium,
    pytest.mark.timeout(180),
]
# Three points of a simulated study (psctl study tags its runs so), with the long names, many
# tags and long notes that once pushed the notes off a 1,400 px window.
STUDY = ["7" * 32, "8" * 32, "9" * 32]
STUDY_LR = [0.01, 0.05, 0.2]
NOTE = "lr 0.2 diverged at epoch 3 on the second seed; worth a rerun with warm-up. " * 3


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = seed_compare_db(tmp_path_factory.mktemp("runs-groups") / "experiments.db")
    start = time.time() - 300
    for n, (run_id, lr) in enumerate(zip(STUDY, STUDY_LR, strict=True)):
        record_run(path, run_id, f"lr-sweep-point-{n}-optimizer.lr={lr}-and-a-long-name",
                   sync="ssp", lr=lr, accuracy=[0.4 + 0.1 * n, 0.7 + 0.1 * n], step_s=0.2,
                   start=start + 10 * n, backend="sim")
        set_tags(path, run_id, {"study": "lr-sweep", "study_id": "20261128-115500",
                                "optimizer.lr": str(lr), "smoke": "true",
                                "verdict": "a rather long verdict about this run"}, [])
        set_notes(path, run_id, NOTE)
    return path


def _open(page: Any, url: str, grouped_by: str = "") -> None:
    page.goto(url)
    page.wait_for_selector(f"#runs-table tbody[data-rows='7'][data-grouped-by='{grouped_by}']",
                           timeout=30_000)


def _group_by(page: Any, key: str) -> None:
    page.select_option("#group-by", key)
    page.wait_for_selector(f"#runs-table tbody[data-grouped-by='{key}']", timeout=10_000)


def _groups(page: Any) -> dict[str, int]:
    found: dict[str, int] = page.evaluate("""() => Object.fromEntries(
        [...document.querySelectorAll('#runs-table tr.group-row')]
          .map((tr) => [tr.dataset.group, Number(tr.dataset.count)]))""")
    return found


def _run_rows(page: Any) -> list[str]:
    return [str(i) for i in page.eval_on_selector_all(
        "#runs-table tbody tr[data-id]", "rows => rows.map(r => r.dataset.id)")]


def test_rows_group_by_a_key_with_counts_and_means(page: Any, base: str) -> None:
    _open(page, base + "/")
    assert _groups(page) == {}
    _group_by(page, "sync")
    assert _groups(page) == {"asp": 3, "bsp": 1, "ssp": 3}
    assert "group_by=sync" in page.url
    served = page.evaluate("() => fetch('/api/table').then(r => r.json())")["rows"]
    asp = [r["values"]["final_accuracy"] for r in served if r["sync"] == "asp"]
    mean = page.inner_text("tr.group-row[data-group='asp'] td[data-key='final_accuracy']")
    assert mean == f"{100 * sum(asp) / len(asp):.2f} %"
    assert page.get_attribute("tr.group-row[data-group='asp'] td[data-key='final_accuracy']",
                              "title") == "mean of 3 of 3 runs"
    # No run of the study reached 97 %: no mean, and the title says why for a partial one.
    assert page.inner_text("tr.group-row[data-group='ssp'] "
                           "td[data-key='time_to_target_s']") == "–"
    # Each group's runs follow its header; collapsed, they are gone and the header stays.
    order = _run_rows(page)
    assert set(order[:3]) == set(GROUP) and order[3] == SOLO and set(order[4:]) == set(STUDY)
    page.click("tr.group-row[data-group='asp'] button.toggle")
    page.wait_for_function("document.querySelectorAll('#runs-table tbody tr[data-id]').length"
                           " === 4")
    assert not set(_run_rows(page)) & set(GROUP)
    assert page.get_attribute("tr.group-row[data-group='asp'] button.toggle",
                              "aria-expanded") == "false"
    page.click("tr.group-row[data-group='asp'] button.toggle")
    page.wait_for_function("document.querySelectorAll('#runs-table tbody tr[data-id]').length"
                           " === 7")
    # A config key groups as well, by its value; no key, no groups.
    _group_by(page, "optimizer.lr")
    assert _groups(page) == {"0.01": 1, "0.05": 4, "0.1": 1, "0.2": 1}
    _group_by(page, "")
    assert _groups(page) == {} and len(_run_rows(page)) == 7


def test_a_repeat_group_and_a_study_open_parallel_coordinates(page: Any, base: str) -> None:
    _open(page, base + "/?group_by=tag.group", grouped_by="tag.group")
    assert _groups(page) == {"g1": 3, "": 4}  # the runs without the tag together
    assert page.locator("tr.group-row[data-group=''] button.parcoords-toggle").count() == 0
    page.click("tr.group-row[data-group='g1'] button.parcoords-toggle")
    view = "tr.parcoords-row[data-group='g1'] .parcoords"
    page.wait_for_selector(f"{view}[data-axes]", timeout=30_000)  # plotly loads on demand
    trace = page.evaluate(f"""() => {{ const t = document.querySelector("{view}").data[0];
        return {{type: t.type, labels: t.dimensions.map((d) => d.label),
                 seeds: t.dimensions[0].values}}; }}""")
    assert trace["type"] == "parcoords"
    assert trace["labels"] == ["train.seed", "final acc (%)", "to 97 % (s)", "samples/s"]
    assert sorted(trace["seeds"]) == [0, 1, 2]  # a line per run, in the table's order
    assert page.locator(f"{view} .parcoords").count() > 0  # drawn, not only planned
    assert "train.seed" in page.inner_text("tr.parcoords-row[data-group='g1'] .parcoords-note")

    # A study: its varying setting (the learning rate) against its outcomes; no run reached
    # the target, and each sits on the axis's own "not reached" tick.
    _group_by(page, "tag.study_id")
    page.click("tr.group-row[data-group='20261128-115500'] button.parcoords-toggle")
    view = "tr.parcoords-row[data-group='20261128-115500'] .parcoords"
    page.wait_for_selector(f"{view}[data-axes]", timeout=30_000)
    dims = page.evaluate(f"""() => document.querySelector("{view}").data[0].dimensions
        .map((d) => ({{label: d.label, values: d.values, ticktext: d.ticktext || null}}))""")
    lr = next(d for d in dims if d["label"] == "optimizer.lr")
    assert sorted(lr["values"]) == STUDY_LR
    to_target = next(d for d in dims if d["label"].startswith("to 97 %"))
    assert to_target["ticktext"] == ["not reached"]
    screenshot(page, "runs-parcoords.png")
    page.click("tr.group-row[data-group='20261128-115500'] button.parcoords-toggle")
    page.wait_for_function(f"!document.querySelector(\"{view}\")")


def test_simulated_runs_are_marked(page: Any, base: str) -> None:
    _open(page, base + "/")
    for run_id in STUDY:
        badge = page.locator(f"tr[data-id='{run_id}'] td.name .sim")
        assert badge.inner_text() == "sim" and badge.get_attribute("title") == "virtual time"
    assert page.locator(f"tr[data-id='{SOLO}'] .sim").count() == 0


def test_tags_and_notes_are_in_view_at_1400_px(page: Any, base: str) -> None:
    _open(page, base + "/")
    width = page.evaluate("window.innerWidth")
    assert width == 1400
    boxes = page.evaluate("""() => [...document.querySelectorAll(
        '#runs-table tbody td.tags, #runs-table tbody td.notes, #runs-table thead th')]
        .map((e) => { const b = e.getBoundingClientRect(); return [e.className || e.textContent,
          b.left, b.right]; })""")
    wrap = page.evaluate("document.querySelector('.runs-wrap').getBoundingClientRect().right")
    outside = [b for b in boxes if b[1] < 0 or b[2] > min(width, wrap) + 0.5]
    assert outside == [], outside[:3]
    # What is cut to fit keeps its whole text in its title.
    name = page.locator(f"tr[data-id='{STUDY[0]}'] td.name > a").first
    assert name.get_attribute("title") == "lr-sweep-point-0-optimizer.lr=0.01-and-a-long-name"
    assert page.get_attribute(f"tr[data-id='{STUDY[0]}'] .note-text", "title") == NOTE
    assert page.get_attribute(f"tr[data-id='{STUDY[0]}'] .tag[title^='verdict=']", "title") == \
        "verdict=a rather long verdict about this run"
    screenshot(page, "runs-1400.png", full_page=False)

"""Issue 42, acceptance 1: a run whose model raises ``RuntimeError("boom")`` in ``forward``,
launched with the CLI: its run page, in headless Chromium, leads with the status and the reason
in words (not the events table's JSON), links to the failed worker's log, and shows its tail;
and ``GET /api/runs/RUN/logs/worker-0`` returns a tail with "boom" in it.

One worker, so that worker 0 is the one that fails. Every request off this machine is aborted.
"""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import psctl
from tests.webui.chromium import checked_page, chromium, needs_chromium, screenshot, serving

pytestmark = [pytest.mark.integration, needs_chromium, pytest.mark.timeout(300)]

BOOM = '''
import math

from torch import nn


class Boom(nn.Module):
    def __init__(self, inputs, classes):
        super().__init__()
        self.linear = nn.Linear(inputs, classes)

    def forward(self, x):
        raise RuntimeError("boom")


def build(input_shape, num_classes):
    return Boom(math.prod(input_shape), num_classes)
'''


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=30) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_a_failed_runs_page_says_why_and_shows_the_failed_workers_log(tmp_path: Path) -> None:
    model = tmp_path / "boom.py"
    model.write_text(BOOM)
    db = tmp_path / "experiments.db"
    done = psctl("launch", "--dataset", "digits", "--model", f"{model}:build", "--workers", "1",
                 "--servers", "1", "--epochs", "1", "--name", "boom-run", "--no-live", db=db,
                 cwd=tmp_path)
    assert done.returncode != 0, done.stdout
    with serving(db) as base:
        status, body = _get(f"{base}/api/runs/@last")
        assert status == 200, body
        run = json.loads(body)
        run_id, reason = run["summary"]["id"], run["reason"]
        assert run["summary"]["status"] == "failed"
        assert "worker 0 failed: RuntimeError: boom" in reason
        # The API: the run's logs, and worker 0's tail with its traceback's end.
        status, body = _get(f"{base}/api/runs/{run_id}/logs")
        assert status == 200, body
        listed = [entry["role"] for entry in json.loads(body)["logs"]]
        assert {"coordinator", "server-0", "evaluator", "worker-0"} <= set(listed)
        status, tail = _get(f"{base}/api/runs/{run_id}/logs/worker-0")
        assert status == 200 and "boom" in tail, tail
        assert _get(f"{base}/api/runs/{run_id}/logs/worker-1")[0] == 404
        # The page, in chromium.
        with chromium() as browser, checked_page(browser) as page:
            page.goto(f"{base}/runs/{run_id}")
            lead = page.locator("#run-status")
            lead.wait_for(state="visible", timeout=30_000)
            said = " ".join(lead.inner_text().split())
            assert said.startswith("Failed: Worker 0 failed: RuntimeError: boom"), said
            assert "{" not in said and '"' not in said  # words, not the event's JSON
            # It comes first: right under the title, above the summary and the charts.
            tops = page.evaluate("['run-title', 'run-status', 'run-summary', 'charts'].map("
                                 "id => document.getElementById(id).getBoundingClientRect().top)")
            assert tops == sorted(tops), tops
            assert page.inner_text("#live-badge") == "failed"
            # The traceback is one click away; the link opens worker 0's log in the page.
            assert "RuntimeError" in (page.locator("#run-status details pre").text_content()
                                      or "")
            page.locator("#run-status a[data-role='worker-0']").click()
            page.wait_for_selector("#log-text[data-loaded='1']", timeout=15_000)
            assert page.evaluate("location.hash") == "#log=worker-0"
            assert "boom" in page.inner_text("#log-text")
            assert page.locator("#log-roles button[aria-pressed='true']").inner_text() \
                .startswith("worker 0")
            screenshot(page, "run-page-failed.png")
            # Another role from the list: the coordinator's log.
            page.locator("#log-roles button[data-role='coordinator']").click()
            page.wait_for_function("document.getElementById('log-text').dataset.role === "
                                   "'coordinator' && !document.getElementById('log-text')"
                                   ".textContent.startsWith('loading')", timeout=15_000)
            assert "coordinator" in page.inner_text("#log-note")

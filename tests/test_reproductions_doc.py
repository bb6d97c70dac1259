"""docs/reproductions.md quotes measured numbers only: every ratio with its interval
(``1.23x [1.01, 1.50]``, written with the times sign), every accuracy with its interval
(``97.51 % [97.01, 98.00]``) and every time with its interval (``75.0 s [40.1, 110.2]``) in a
row that names a study is one of that study's summary.json figures (``over_seeds``); every row
that names a run (its id's first 8 characters in backticks) shows that run's final accuracy;
and every study it cites is shipped with its results (a study's check on real processes, in
``results/NAME-local``, too)."""

from __future__ import annotations

import json
import re
from typing import Any

from tests.conftest import REPO

DOC = (REPO / "docs" / "reproductions.md").read_text()
RESULTS = REPO / "studies" / "results"
RATIO = re.compile(r"(\d+\.\d\d)× \[(\d+\.\d\d), (\d+\.\d\d)\]")
PERCENT = re.compile(r"(\d+\.\d\d) % \[(\d+\.\d\d), (\d+\.\d\d)\]")
SECONDS = re.compile(r"(\d+\.\d) s \[(\d+\.\d), (\d+\.\d)\]")


def _summary(name: str) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((RESULTS / name / "summary.json").read_text())
    return loaded


def _figures(name: str) -> tuple[set[tuple[str, ...]], set[tuple[str, ...]],
                                 set[tuple[str, ...]]]:
    ratios, percents, seconds = set(), set(), set()
    for point in _summary(name).get("over_seeds", {}).get("points", []):
        for found in point["versus_baseline"].values():
            if found and found["low"] is not None:
                ratios.add(tuple(f"{found[k]:.2f}" for k in ("ratio", "low", "high")))
        for key, found in point["metrics"].items():
            if not found or found["low"] is None:
                continue
            if key == "time_to_target_s":
                seconds.add(tuple(f"{found[k]:.1f}" for k in ("mean", "low", "high")))
            elif "acc" in key:
                percents.add(tuple(f"{100 * found[k]:.2f}" for k in ("mean", "low", "high")))
    return ratios, percents, seconds


def _cited(shipped: set[str]) -> list[tuple[str, list[str]]]:
    """Each line with the studies it quotes: those it names in backticks, and the study of its
    section (the one its ``psctl study studies/NAME.toml`` command runs)."""
    section: list[str] = []
    out = []
    for line in DOC.splitlines():
        if line.startswith("## "):
            section = []
        section += re.findall(r"psctl study studies/([a-z-]+)\.toml", line)
        named = [n for n in re.findall(r"`([a-z-]+)`", line) if n in shipped]
        out.append((line, sorted(set(named + section))))
    return out


def test_every_quoted_interval_is_a_studys_figure() -> None:
    # A study's points checked on real processes report to results/NAME-local (psctl study
    # --backend local): a line quoting them names that folder.
    shipped = {p.stem for p in (REPO / "studies").glob("*.toml")} | {
        p.parent.name for p in RESULTS.glob("*-local/summary.json")}
    checked = 0
    for line, named in _cited(shipped):
        ratios, percents, seconds = set(), set(), set()
        for name in named:
            more = _figures(name)
            ratios |= more[0]
            percents |= more[1]
            seconds |= more[2]
        for pattern, known in ((RATIO, ratios), (PERCENT, percents), (SECONDS, seconds)):
            for quoted in pattern.findall(line):
                assert quoted in known, f"{quoted} is no figure of {named}: {line}"
                checked += 1
    assert checked >= 40


def _runs() -> dict[str, dict[str, Any]]:
    runs = {}
    for summary in RESULTS.glob("*/summary.json"):
        for row in json.loads(summary.read_text())["rows"]:
            runs[row["run_id"][:8]] = row
    return runs


def test_every_quoted_run_shows_its_recorded_numbers() -> None:
    runs = _runs()
    for line in DOC.splitlines():
        for run_id in re.findall(r"`([0-9a-f]{8})`", line):
            assert run_id in runs, f"{run_id} is in no studies/results/*/summary.json"
            run = runs[run_id]
            assert f"{100 * run['final_accuracy']:.2f} %" in line, line


def test_the_cited_studies_are_shipped_with_their_results() -> None:
    cited = set(re.findall(r"psctl study studies/([a-z-]+)\.toml", DOC))
    assert {"elastic-bsp", "ssp-transient", "bounded-delay", "downpour-adagrad",
            "downpour-sparse", "dynsgd", "pruning"} <= cited
    for name in cited:
        assert (REPO / "studies" / f"{name}.toml").exists()
        assert (RESULTS / name / "summary.json").exists(), name
        assert (RESULTS / name / "report.md").exists(), name
        assert _summary(name)["complete"], f"{name}: not every planned run finished"


def test_the_real_process_checks_are_shipped_and_ran_on_real_processes() -> None:
    """Issue 55: three claims checked on real processes, each report beside its study's."""
    checked = set(re.findall(r"`([a-z-]+-local)`", DOC))
    assert {"elastic-bsp-local", "ssp-transient-local", "pruning-local"} <= checked
    for name in checked:
        summary = _summary(name)
        assert summary["complete"] and summary["backends"] == ["local"], name
        assert "--backend local" in summary["command"], name

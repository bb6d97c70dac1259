"""``psctl compare`` over two real runs (bsp and asp): selectors, columns, metrics, formats."""

from __future__ import annotations

import csv
import io
import json
import shutil
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from psctl.cli import app
from tests.integration.support import query

runner = CliRunner()
pytestmark = pytest.mark.timeout(240)


def compare(db: Path, *args: str, code: int = 0) -> Any:
    result = runner.invoke(app, ["compare", *args, "--db", str(db)], env={"COLUMNS": "220"})
    assert result.exit_code == code, result.output
    return result


def rows(db: Path, *args: str) -> list[dict[str, Any]]:
    return list(json.loads(compare(db, *args, "--json").stdout))


def ids(db: Path) -> dict[str, str]:
    return dict(query(db, "SELECT name, id FROM runs"))


def test_selectors_keep_order_and_drop_repeats(compare_db: Path) -> None:
    run = ids(compare_db)
    found = rows(compare_db, "@last", run["seed-run"][:6], "seed-run", "@last~1", run["asp-run"])
    assert [r["name"] for r in found] == ["asp-run", "seed-run"]
    assert [r["name"] for r in rows(compare_db)] == ["seed-run", "asp-run"]  # all, oldest first


def test_unknown_run_exits_4(compare_db: Path) -> None:
    result = compare(compare_db, "no-such-run", code=4)
    assert "no-such-run" in result.stderr and result.stdout == ""


def test_ambiguous_prefix_exits_4_and_lists_the_candidates(compare_db: Path,
                                                            tmp_path: Path) -> None:
    db = tmp_path / "experiments.db"
    shutil.copy(compare_db, db)
    seed = ids(db)["seed-run"]
    twin = seed[:3] + ("0" if seed[3] != "0" else "1") + seed[4:]
    with sqlite3.connect(db) as conn:  # a second run whose id shares the first 3 characters
        conn.execute("INSERT INTO runs SELECT ?, 'twin', status, reason, started_at, ended_at, "
                     "heartbeat_at, config_json, sync, workers, servers, dataset, iteration_count, "
                     "notes FROM runs WHERE id = ?", (twin, seed))
    result = compare(db, seed[:3], code=4)
    assert "more than one run" in result.stderr
    assert seed in result.stderr and twin in result.stderr


def test_only_changed_config_columns_by_default(compare_db: Path) -> None:
    changed = rows(compare_db)[0]
    assert changed["sync.model"] == "bsp" and "eval.interval_s" in changed
    assert "cluster.workers" not in changed and "optimizer.lr" not in changed
    every = rows(compare_db, "--all")[0]
    assert every["cluster.workers"] == 2 and every["optimizer.lr"] == 0.1
    assert "sync.model" not in rows(compare_db, "seed-run")[0]  # one run: nothing differs


def test_time_to_target_and_speedup_against_a_baseline(compare_db: Path) -> None:
    best = query(compare_db, "SELECT min(b) FROM (SELECT max(accuracy) b FROM evaluations "
                             "GROUP BY run_id)")[0][0]
    target = best * 0.9
    found = {r["name"]: r for r in rows(compare_db, "--target", str(target),
                                        "--baseline", "seed-run")}
    expected = {}
    for name, run_id in ids(compare_db).items():
        first = query(compare_db, "SELECT at FROM evaluations WHERE run_id = ? AND "
                                  "accuracy >= ? ORDER BY at, id LIMIT 1", run_id, target)
        (start,) = query(compare_db, "SELECT min(started_at) FROM iterations WHERE run_id = ?",
                         run_id)[0]
        expected[name] = first[0][0] - start  # seconds of training, start-up left out
        assert found[name]["time_to_target_s"] == pytest.approx(expected[name])
        # Start-up from the command's start, which the launch's start_up event says.
        [(began,)] = query(compare_db, "SELECT json_extract(detail, '$.origin') FROM events "
                                       "WHERE run_id = ? AND kind = 'start_up' ORDER BY at, id "
                                       "LIMIT 1", run_id)
        assert found[name]["startup_s"] == pytest.approx(start - began)
    assert found["seed-run"]["speedup"] == 1.0
    assert found["asp-run"]["speedup"] == pytest.approx(expected["seed-run"] / expected["asp-run"])


def test_unreached_target_is_blank_not_zero(compare_db: Path) -> None:
    found = rows(compare_db, "--target", "1.0", "--baseline", "@last")
    assert all(r["time_to_target_s"] is None and r["speedup"] is None for r in found)
    table = compare(compare_db, "--target", "1.0", "--md").stdout
    assert "| 0.0 |" not in table


def test_baseline_and_time_to_target_sorting_default_to_97_percent(compare_db: Path) -> None:
    explicit = rows(compare_db, "--target", "0.97", "--baseline", "@last")
    result = compare(compare_db, "--baseline", "@last", "--json")
    assert "time to 97 % test accuracy" in result.stderr
    assert json.loads(result.stdout) == explicit
    result = compare(compare_db, "--sort-by", "time_to_target", "--json")
    assert "time to 97 % test accuracy" in result.stderr
    assert all("time_to_target_s" in row for row in json.loads(result.stdout))
    assert "--baseline" in compare(compare_db, "--sort-by", "speedup", code=2).stderr
    plain = compare(compare_db, "--json")
    assert "--target" not in plain.stderr
    assert all("time_to_target_s" not in row for row in json.loads(plain.stdout))


def test_metrics_match_the_iteration_rows(compare_db: Path) -> None:
    run_id = ids(compare_db)["asp-run"]
    found = rows(compare_db, run_id)[0]
    samples, first, last, wait, busy, traffic = query(
        compare_db, "SELECT sum(samples), min(started_at), max(ended_at), sum(wait_s), "
        "sum(ended_at - started_at), sum(bytes_sent + bytes_received) FROM iterations "
        "WHERE run_id = ?", run_id)[0]
    assert found["samples_per_s"] == pytest.approx(samples / (last - first))
    assert found["idle_fraction"] == pytest.approx(wait / busy)
    assert found["bytes_per_sample"] == pytest.approx(traffic / samples)
    staleness = sorted(s for (s,) in query(compare_db, "SELECT staleness FROM iterations "
                                                       "WHERE run_id = ?", run_id))
    assert found["staleness_mean"] == pytest.approx(sum(staleness) / len(staleness))
    assert found["staleness_p95"] == staleness[-(-len(staleness) * 95 // 100) - 1]


def test_where_sort_and_top(compare_db: Path) -> None:
    assert [r["name"] for r in rows(compare_db, "--where", "sync=asp")] == ["asp-run"]
    assert [r["name"] for r in rows(compare_db, "--where", "sync.model=bsp",
                                    "--where", "lr=0.1")] == ["seed-run"]
    fastest = rows(compare_db, "--sort-by", "samples_per_s", "--top", "1")
    assert fastest[0]["samples_per_s"] == max(r["samples_per_s"] for r in rows(compare_db))
    assert len(fastest) == 1
    assert "unknown key" in compare(compare_db, "--where", "nope=1", code=2).stderr
    assert compare(compare_db, "--where", "sync=ssp", code=4).stdout == ""
    assert compare(compare_db, "--where", "sync", code=2).exit_code == 2


def test_json_and_csv_carry_the_same_values(compare_db: Path) -> None:
    as_json = rows(compare_db, "--target", "0.3")
    as_csv = list(csv.DictReader(io.StringIO(compare(compare_db, "--target", "0.3",
                                                     "--csv").stdout)))
    assert len(as_json) == len(as_csv) == 2
    for from_json, from_csv in zip(as_json, as_csv, strict=True):
        assert list(from_json) == list(from_csv)
        for key, value in from_json.items():
            if isinstance(value, float):
                assert float(from_csv[key]) == value  # exact: repr round-trips
            elif isinstance(value, bool):  # as JSON writes it, like lists
                assert from_csv[key] == json.dumps(value)
            else:
                assert from_csv[key] == ("" if value is None else str(value))
    assert "\x1b[" not in json.dumps(as_json)


def test_markdown_and_table(compare_db: Path) -> None:
    md = compare(compare_db, "--md").stdout.splitlines()
    assert md[0].startswith("| run | name | ") and md[1].startswith("|---|---|")
    assert len(md) == 4 and "seed-run" in md[2] + md[3]
    table = compare(compare_db).stdout
    assert "asp-run" in table and "idle" in table and "\x1b[" not in table


def test_plot_draws_one_line_per_run_with_a_legend(compare_db: Path) -> None:
    result = compare(compare_db, "--plot")
    lines = result.stdout.splitlines()
    # The title and the x-axis say the same; the legend lies below the chart, one marker each.
    assert "test accuracy (%) against seconds of training" in lines[0]
    axis = max(i for i, line in enumerate(lines) if "seconds of training" in line)
    legend = [line for line in lines[axis + 1:] if line.strip()]
    assert [line.split()[0] for line in legend] == ["*", "o"]
    assert {line.split()[-1] for line in legend} == {"seed-run", "asp-run"}
    assert "\x1b[" not in result.stdout  # not a terminal: no colour codes
    assert "test loss" in compare(compare_db, "@last", "--plot", "--metric", "loss").stdout
    assert compare(compare_db, "--plot", "--metric", "nope", code=2).exit_code == 2


def test_plot_draws_accuracy_in_percent_as_the_tables_write_it(compare_db: Path) -> None:
    import re

    lines = compare(compare_db, "--plot").stdout.splitlines()
    assert "test accuracy (%) against seconds of training" in lines[0]
    ticks = [float(m.group(1)) for line in lines if (m := re.match(r"^\s*([\d.]+)┤", line))]
    accuracies = [a for (a,) in query(compare_db, "SELECT accuracy FROM evaluations")]
    assert len(ticks) >= 3 and min(ticks) > 1  # percent, not a fraction
    assert min(ticks) <= 100 * max(accuracies) <= max(ticks)


def test_table_into_a_pipe_is_not_squeezed_to_a_nominal_width(compare_db: Path) -> None:
    # Without COLUMNS a file or pipe gets every column (tests/psctl/test_compare_render.py
    # checks COLUMNS and --wide).
    result = runner.invoke(app, ["compare", "--all", "--db", str(compare_db)],
                           env={"COLUMNS": None})
    assert result.exit_code == 0, result.output
    header = next(line for line in result.stdout.splitlines() if "┃ run" in line)
    assert len(header) > 200 and "…" not in result.stdout and "not shown" not in result.stdout
    assert "optimizer.lr" in header and "oversubscribed" in header
    for name, _ in query(compare_db, "SELECT name, id FROM runs"):
        assert name in result.stdout


def test_plot_y_axis_spans_the_data_not_zero() -> None:
    from psctl.plot import y_range

    low, high = y_range([0.951, 0.968, 0.973])
    assert 0.94 < low < 0.951 and 0.973 < high < 0.99
    assert y_range([0.5, 0.5]) == (0.495, 0.505)


def test_plot_in_colour_never_uses_colour_0(compare_db: Path) -> None:
    from engine.db import open_engine
    from engine.db.metrics import run_records
    from psctl.plot import plot

    engine = open_engine(compare_db, readonly=True)
    records = run_records(engine, list(ids(compare_db).values()))
    text = plot(engine, records, color=True)
    engine.dispose()
    assert "\x1b[38;5;12m" in text and "\x1b[38;5;9m" in text  # two bright colours
    assert "\x1b[30m" not in text and "\x1b[38;5;0m" not in text and "\x1b[40m" not in text

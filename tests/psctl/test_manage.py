"""``runs rm``, ``runs tag``, ``export`` and ``config show`` over copies of real runs."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from typer.testing import CliRunner

from psctl.cli import app
from psctl.export import TABLES, export_order
from tests.integration.support import query

runner = CliRunner()
pytestmark = pytest.mark.timeout(120)


def psctl(*args: str, code: int = 0, env: dict[str, str] | None = None) -> Any:
    result = runner.invoke(app, list(args), env={"COLUMNS": "200", **(env or {})})
    assert result.exit_code == code, result.output
    return result


def test_rm_asks_for_yes_off_a_terminal_then_deletes_every_row(writable_db: Path) -> None:
    db = str(writable_db)
    run_id = query(writable_db, "SELECT id FROM runs WHERE name = 'asp-run'")[0][0]
    assert "--yes" in psctl("runs", "rm", "asp-run", "--db", db, code=2).stderr
    assert query(writable_db, "SELECT count(*) FROM runs")[0][0] == 2
    psctl("runs", "rm", "asp-run", "--yes", "--db", db)
    assert query(writable_db, "SELECT name FROM runs") == [("seed-run",)]
    for table in ("iterations", "evaluations", "events", "tags", "syncs", "process_samples"):
        left = query(writable_db, f"SELECT count(*) FROM {table} WHERE run_id = ?", run_id)
        assert left == [(0,)], table
    psctl("runs", "rm", "asp-run", "--yes", "--db", db, code=4)


def test_rm_refuses_a_live_run_without_force(writable_db: Path) -> None:
    import sqlite3
    import time

    with sqlite3.connect(writable_db) as conn:  # make the copy's run look alive
        conn.execute("UPDATE runs SET status = 'running', ended_at = NULL, heartbeat_at = ? "
                     "WHERE name = 'asp-run'", (time.time() + 600,))
    assert "--force" in psctl("runs", "rm", "asp-run", "-y", "--db", str(writable_db),
                              code=2).stderr
    psctl("runs", "rm", "asp-run", "-y", "--force", "--db", str(writable_db))
    assert query(writable_db, "SELECT count(*) FROM runs") == [(1,)]


def test_tag_sets_replaces_and_removes_and_compare_selects_by_tag(writable_db: Path) -> None:
    db = str(writable_db)
    psctl("runs", "tag", "seed-run", "sweep=a", "note=first try", "--db", db)
    psctl("runs", "tag", "seed-run", "sweep=b", "--db", db)
    assert dict(query(writable_db, "SELECT key, value FROM tags")) == {"sweep": "b",
                                                                        "note": "first try"}
    found = json.loads(psctl("compare", "--where", "sweep=b", "--json", "--db", db).stdout)
    assert [r["name"] for r in found] == ["seed-run"]
    every = json.loads(psctl("compare", "--json", "--db", db).stdout)
    assert {r["name"]: r["tag.sweep"] for r in every} == {"seed-run": "b", "asp-run": None}
    psctl("runs", "tag", "seed-run", "--remove", "note", "--db", db)
    assert query(writable_db, "SELECT key FROM tags") == [("sweep",)]
    psctl("runs", "tag", "seed-run", "oops", "--db", db, code=2)


def _db_rows(db: Path, table: str, column: str, run_id: str) -> list[tuple[Any, ...]]:
    names = [c.name for c in dict(TABLES_BY_NAME)[table].columns]
    order = ", ".join(c.name for c in export_order(dict(TABLES_BY_NAME)[table]))
    return query(db, f"SELECT {', '.join(names)} FROM {table} WHERE {column} = ? "
                     f"ORDER BY {order}", run_id)


TABLES_BY_NAME = [(table.name, table) for table, _ in TABLES]
# Before pandas 3 the default float parser may be off by one unit in the last place.
EXACT_FLOATS: dict[str, Any] = (
    {"float_precision": "round_trip"} if int(pd.__version__.split(".")[0]) < 3 else {}
)


def _frame_rows(frame: pd.DataFrame) -> list[tuple[Any, ...]]:
    def plain(value: Any) -> Any:
        if value is None or (isinstance(value, float) and math.isnan(value)):
            return None
        return value.item() if hasattr(value, "item") else value

    return [tuple(plain(v) for v in row) for row in frame.astype(object).itertuples(index=False)]


@pytest.mark.parametrize("fmt", ["csv", "parquet", "json"])
def test_export_reimports_to_exactly_the_database_rows(compare_db: Path, tmp_path: Path,
                                                       fmt: str) -> None:
    run_id = query(compare_db, "SELECT id FROM runs WHERE name = 'asp-run'")[0][0]
    out = tmp_path / "export"
    listed = psctl("export", "asp-run", "--format", fmt, "--out", str(out), "--db",
                   str(compare_db)).stdout.split()
    assert listed == [str(out / f"{table.name}.{fmt}") for table, _ in TABLES]
    for table, column in TABLES:
        path = out / f"{table.name}.{fmt}"
        if fmt == "csv":
            text_columns = {c.name: str for c in table.columns if str(c.type) == "TEXT"}
            frame = pd.read_csv(path, dtype=text_columns, keep_default_na=False, na_values={
                c.name: [""] for c in table.columns if c.nullable}, **EXACT_FLOATS)
        elif fmt == "parquet":
            frame = pd.read_parquet(path)
        else:
            frame = pd.DataFrame(json.loads(path.read_text()),
                                 columns=[c.name for c in table.columns])
        expected = _db_rows(compare_db, table.name, column, run_id)
        assert _frame_rows(frame) == expected, table.name
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["run_id"] == run_id and manifest["tables"]["iterations"] > 0


def test_config_show_names_the_source_of_every_setting(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    user = tmp_path / "xdg" / "psctl"
    user.mkdir(parents=True)
    (user / "config.toml").write_text("[train]\nepochs = 3\nbatch_size = 32\n")
    (tmp_path / "psctl.toml").write_text("[train]\nepochs = 4\n[cluster]\nservers = 1\n")
    (tmp_path / "run.toml").write_text("[cluster]\nservers = 3\n")
    monkeypatch.chdir(tmp_path)
    env = {"XDG_CONFIG_HOME": str(tmp_path / "xdg"), "PSCTL_CLUSTER__WORKERS": "8"}
    shown = json.loads(psctl("config", "show", "--config", "run.toml", "--json", env=env).stdout)
    got = {row["key"]: (row["value"], row["source"]) for row in shown}
    assert got["train.batch_size"] == (32, f"user file: {user / 'config.toml'}")
    assert got["train.epochs"] == (4, f"project file: {tmp_path / 'psctl.toml'}")
    assert got["cluster.servers"] == (3, "--config: run.toml")
    assert got["cluster.workers"] == (8, "env: PSCTL_CLUSTER__WORKERS")
    assert got["train.seed"] == (0, "default")
    bare = json.loads(psctl("config", "show", "--no-config", "--json", env=env).stdout)
    assert {r["key"]: r["source"] for r in bare}["train.epochs"] == "default"


def test_config_errors_name_their_source(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "pyproject.toml").write_text("[tool.psctl.train]\nepoks = 3\n")
    result = psctl("config", "show", code=1, env={"XDG_CONFIG_HOME": str(tmp_path)})
    assert "train.epoks" in result.stderr and "pyproject.toml" in result.stderr
    result = psctl("config", "show", "--no-config", code=1, env={"PSCTL_TRAIN__EPOCHS": "many"})
    assert "train.epochs" in result.stderr


def test_run_arguments_complete_from_the_database(compare_db: Path) -> None:
    env = dict(os.environ, PSCTL_DB=str(compare_db), _PSCTL_COMPLETE="complete_bash",
               COMP_WORDS="psctl runs show as", COMP_CWORD="3")
    done = subprocess.run([sys.executable, "-m", "psctl"], env=env, capture_output=True,
                          text=True, check=False, timeout=60)
    assert done.stdout.split() == ["asp-run"]


def test_installed_bash_completion_offers_run_names(compare_db: Path, tmp_path: Path) -> None:
    """What a user gets from ``psctl --install-completion bash``, run by a real bash."""
    bin_dir = str(Path(sys.executable).parent)
    env = dict(os.environ, HOME=str(tmp_path), PSCTL_DB=str(compare_db),
               PATH=bin_dir + os.pathsep + os.environ.get("PATH", ""))
    psctl_exe = shutil.which("psctl", path=env["PATH"])
    assert psctl_exe is not None, "psctl is not installed in the test environment"
    # From a bash, as a user types it: typer finds the shell among its ancestors, and a test
    # run from no shell at all (nohup, a service) would have none. `&& :` keeps bash from
    # exec'ing psctl in its own place.
    installed = subprocess.run(["bash", "--norc", "-c", '"$0" --install-completion bash && :',
                                psctl_exe], env=env, capture_output=True, text=True,
                               check=False, timeout=60)
    assert installed.returncode == 0, installed.stderr
    assert "psctl.sh" in (tmp_path / ".bashrc").read_text()
    script = ('source ~/.bashrc; COMP_WORDS=(psctl runs show as); COMP_CWORD=3; '
              '"$(complete -p psctl | sed "s/.*-F \\([^ ]*\\) .*/\\1/")" psctl; '
              'printf "%s\\n" "${COMPREPLY[@]}"')
    done = subprocess.run(["bash", "--norc", "-c", script], env=env, capture_output=True,
                          text=True, check=False, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["asp-run"]

"""Bad files and values at the CLI's boundary (issue 37): deeply nested TOML (``--config``,
``./psctl.toml``, a study file), bad libsvm files and over-long tags each get one line naming the
file or the tag and the problem, in process and at once, and nothing is written: no database
for a refused launch, no tag row for a refused tag."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from typer.testing import CliRunner

from engine.config import MAX_NESTING, check_nesting
from engine.errors import ConfigError, StoreError
from engine.recorder import Recorder
from engine.recorder.admin import TAG_VALUE_MAX, set_tags
from psctl.cli import app

pytestmark = pytest.mark.timeout(60)

DEPTH = 1200  # past Python's recursion limit (1000): tomllib and flatten would overflow
SMALL = ["--dataset", "digits", "--workers", "1", "--servers", "1", "--epochs", "1",
         "--no-live"]
NESTED = {
    "arrays": "[train]\nepochs = " + "[" * DEPTH + "]" * DEPTH + "\n",
    "inline-tables": "x = " + "{a = " * DEPTH + "1" + "}" * DEPTH + "\n",
    "table-headers": "[" + ".".join(["a"] * DEPTH) + "]\nx = 1\n",
    "just-past-the-limit": "x = " + "[" * (MAX_NESTING + 2) + "]" * (MAX_NESTING + 2) + "\n",
}


def one_line(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), stderr[-2000:]
    assert "Traceback" not in stderr
    return lines[0]


@pytest.mark.parametrize("shape", NESTED)
def test_a_deeply_nested_config_file_is_one_line(tmp_path: Path, shape: str) -> None:
    path = tmp_path / "deep.toml"
    path.write_text(NESTED[shape])
    db = tmp_path / "fresh" / "experiments.db"
    done = CliRunner().invoke(app, ["launch", *SMALL, "--config", str(path), "--no-config",
                                    "--db", str(db)])
    assert done.exit_code == 1
    line = one_line(done.stderr)
    assert str(path) in line and "nest" in line and str(MAX_NESTING) in line
    assert not db.parent.exists()


@pytest.mark.parametrize("shape", ["arrays", "table-headers"])
def test_a_deeply_nested_project_file_is_one_line(tmp_path: Path, shape: str,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "psctl.toml").write_text(NESTED[shape])
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    for command in (["config", "show"], ["launch", *SMALL, "--db", str(tmp_path / "x.db")]):
        done = CliRunner().invoke(app, command)
        assert done.exit_code == 1, done.output
        line = one_line(done.stderr)
        assert "psctl.toml" in line and "nest" in line
    assert not (tmp_path / "x.db").exists()


def test_a_deeply_nested_study_file_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "study.toml"
    path.write_text(NESTED["inline-tables"])
    done = CliRunner().invoke(app, ["study", str(path), "--dry-run"])
    assert done.exit_code == 1
    assert str(path) in one_line(done.stderr)


def test_nesting_is_checked_without_recursion() -> None:
    deep: list[object] = []
    for _ in range(100_000):  # 100 times the recursion limit
        deep = [deep]
    with pytest.raises(ConfigError, match=f"^here nests tables or arrays more than {MAX_NESTING}"):
        check_nesting(deep, "here")
    check_nesting({"a": {"b": [[1, 2], {"c": 3}]}}, "here")  # a few levels pass


def test_a_deeply_nested_environment_setting_is_not_a_traceback(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PSCTL_TRAIN__EPOCHS", "[" * DEPTH + "]" * DEPTH)
    done = CliRunner().invoke(app, ["config", "show"])
    assert done.exit_code == 1
    assert "train.epochs" in one_line(done.stderr)


def test_a_bad_libsvm_file_is_refused_before_the_run_id_and_the_database(
        tmp_path: Path) -> None:
    path = tmp_path / "wide.svm"
    path.write_text("".join(f"{i % 2} 16777216:1\n" for i in range(16)))  # 2^24 features
    db = tmp_path / "fresh" / "experiments.db"
    done = CliRunner().invoke(app, ["launch", "--dataset", f"libsvm:{path}", "--model", "logreg",
                                    "--workers", "1", "--servers", "1", "--no-live", "--db",
                                    str(db)])
    assert done.exit_code == 1
    line = one_line(done.stderr)
    assert str(path) in line and "1.0 GiB" in line and "limit 256 MiB" in line
    assert "psctl run " not in done.output  # the line that prints the run id
    assert not db.parent.exists()


@pytest.fixture
def recorded(tmp_path: Path) -> Path:
    db = tmp_path / "experiments.db"
    recorder = Recorder(db)
    try:
        recorder.start_run("ab" * 16, "tagged", {"lr": 0.1}, sync="bsp", workers=1, servers=1,
                           dataset="digits")
    finally:
        recorder.close()
    return db


def _tags(db: Path) -> list[tuple[str, str]]:
    with sqlite3.connect(db) as conn:
        rows = conn.execute("SELECT key, value FROM tags").fetchall()
    conn.close()
    return rows


def test_a_tag_value_over_the_dashboards_limit_is_refused_in_the_cli(recorded: Path) -> None:
    long = "x" * (TAG_VALUE_MAX + 1)
    done = CliRunner().invoke(app, ["runs", "tag", "tagged", "ok=1", f"note={long}",
                                    "--db", str(recorded)])
    assert done.exit_code in (1, 2)
    line = one_line(done.stderr)
    assert "tag 'note'" in line and f"{TAG_VALUE_MAX + 1} characters" in line
    assert f"at most {TAG_VALUE_MAX}" in line and long not in line
    assert _tags(recorded) == []  # not even the good one
    done = CliRunner().invoke(app, ["runs", "tag", "tagged", f"note={long[:-1]}",
                                    "--db", str(recorded)])
    assert done.exit_code == 0, done.output
    assert _tags(recorded) == [("note", long[:-1])]


def test_the_recorder_bounds_tags_for_every_caller(recorded: Path) -> None:
    with pytest.raises(StoreError, match="values have at most 256"):
        set_tags(recorded, "ab" * 16, {"k": "v" * 257})
    with pytest.raises(StoreError, match="keys have 1 to 64"):
        set_tags(recorded, "ab" * 16, {"k" * 65: "v"})
    assert _tags(recorded) == []


def test_the_documented_tag_bounds_are_those_in_force() -> None:
    from engine.recorder.admin import TAG_KEY_MAX, TAGS_MAX
    from tests.conftest import REPO

    doc = " ".join((REPO / "docs" / "cli.md").read_text().split())
    assert (f"keys of 1 to {TAG_KEY_MAX} characters, values of at most {TAG_VALUE_MAX} (as in "
            f"the dashboard; longer text belongs in the notes), at most {TAGS_MAX} at once") in doc


def test_a_repeated_launch_whose_group_tag_would_be_too_long_is_refused(tmp_path: Path) -> None:
    db = tmp_path / "fresh" / "experiments.db"
    done = CliRunner().invoke(app, ["launch", *SMALL, "--repeat", "2", "--name", "n" * 300,
                                    "--no-config", "--db", str(db)])
    assert done.exit_code == 1
    line = one_line(done.stderr)
    assert "the run name has 300 characters" in line and f"at most {TAG_VALUE_MAX}" in line
    assert not db.parent.exists()

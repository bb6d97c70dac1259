"""A few of test_bad_inputs.py's cases through a real ``python -m psctl``: the entry point, its
exit codes and its stderr as a shell sees them (the rest run in process, in the fast tier)."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from engine.config import RunConfig
from engine.recorder import Recorder
from engine.wire.records import RunStatus
from tests.conftest import psctl
from tests.psctl.test_bad_inputs import HUGE, LONG, SMALL, refused, usage_error

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def test_a_config_file_that_is_not_utf8_is_named(tmp_path: Path) -> None:
    config, fresh_db = tmp_path / "latin1.toml", tmp_path / "fresh" / "experiments.db"
    config.write_bytes(b"\xff\xfe\x00bad")
    message = refused("launch", *SMALL, "--config", str(config), "--no-config", db=fresh_db,
                      code=1, via=psctl)
    assert str(config) in message and "not UTF-8" in message
    assert not fresh_db.parent.exists()


def test_a_non_finite_flag_is_refused_naming_the_setting(tmp_path: Path) -> None:
    fresh_db = tmp_path / "fresh" / "experiments.db"
    message = refused("launch", *SMALL, "--lr", "nan", db=fresh_db, code=2, via=psctl)
    assert message == "invalid configuration: optimizer.lr: Input should be a finite number " \
        "(got nan)"
    assert not fresh_db.parent.exists()


def test_a_bound_option_gives_typers_usage_error(tmp_path: Path) -> None:
    usage_error("runs", "ls", "--limit", HUGE, db=tmp_path / "x.db", option="--limit", via=psctl)


@pytest.fixture
def db(tmp_path: Path) -> Path:
    """A database with one finished run, written by the recorder (no run launched)."""
    path = tmp_path / "experiments.db"
    recorder = Recorder(path)
    try:
        recorder.start_run("cd" * 16, "small", RunConfig().to_json_dict(), sync="bsp",
                           workers=1, servers=1, dataset="digits")
        recorder.finish(RunStatus.FINISHED)
    finally:
        recorder.close()
    return path


def test_a_run_that_is_not_there_exits_4(db: Path) -> None:
    message = refused("runs", "show", LONG, db=db, code=4, via=psctl)
    assert message.startswith("no run matches '") and len(message) < 200


def test_ui_on_a_port_in_use_is_refused(db: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        message = refused("ui", "--port", str(port), db=db, code=1, via=psctl)
    assert message.startswith(f"cannot serve the dashboard on 127.0.0.1:{port}: ")

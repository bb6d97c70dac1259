"""``psctl role``'s own checks, before any role starts (the roles themselves run in
tests/integration/test_join_contract.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from psctl.cli import app

runner = CliRunner()


@pytest.mark.parametrize(("args", "message"), [
    (["--workers", "many"], "Invalid value for '--workers'"),
    (["--no-such-option"], "No such option: --no-such-option"),
    (["--repeat", "3"], "--repeat and --ui belong to psctl launch"),
    (["--sync", "nonsense"], "sync.model"),
])
def test_a_coordinator_refuses_what_psctl_launch_would_refuse(
        args: list[str], message: str, tmp_path: Path) -> None:
    db = tmp_path / "runs.db"
    result = runner.invoke(app, ["role", "coordinator", "--db", str(db), *args],
                           env={"PSCTL_TOKEN": "t" * 40, "COLUMNS": "200"})
    assert result.exit_code != 0
    assert message in " ".join(result.output.split()), result.output
    assert not db.exists()  # refused before anything was recorded

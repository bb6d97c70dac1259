"""``psctl role``'s own checks, before any role starts (the roles themselves run in
tests/integration/test_join_contract.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from psctl.cli import app
from psctl.launchopts import SETTINGS, launch_overrides

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


def test_every_launch_option_that_sets_something_is_mapped() -> None:
    from psctl.cli import launch

    parameters = set(launch.__annotations__) - {"return"}
    handled = set(SETTINGS) | {"data_dir", "compute", "fault", "straggler", "jitter",
                               "history", "lr_schedule", "config", "no_config", "db", "live",
                               "ui", "repeat"}
    assert parameters == handled
    overrides = launch_overrides({"workers": 3, "data_dir": Path("/d"), "compute_ms": 5.0,
                                  "fault": ["kill:worker:0@1s"]})
    assert overrides["cluster.workers"] == 3 and overrides["data.data_dir"] == "/d"
    assert overrides["sim.compute"] == "given" and overrides["fault.inject"] == (
        "kill:worker:0@1s",)
